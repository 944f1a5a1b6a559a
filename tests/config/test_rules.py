"""One place for each rule: a section built in code is held to the rules a document is.

The schema owns shape and `unskit.config.rules` the rest; `HealthConfig`, `LoggingConfig`
and `MetricEmissionConfig` check themselves through the same two, so a value is refused
either way or accepted either way, and the error names the same key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from unskit.config import (
    FileLoggingConfig,
    HealthConfig,
    LoggingConfig,
    MetricEmissionConfig,
    load_schema,
    parse_document,
    validate_document,
)
from unskit.config.rules import SECTION_RULES
from unskit.config.values import LEVEL_NAMES
from unskit.errors import ConfigError

from .documents import patched

PARSERS: dict[str, Callable[[Any], object]] = {
    "health": HealthConfig.from_section,
    "logging": LoggingConfig.from_section,
    "metricEmission": MetricEmissionConfig.from_section,
}

# (section, value): refused ones name one path; the accepted ones guard against a check
# that refuses everything.
SECTIONS: list[tuple[str, dict[str, Any]]] = [
    ("health", {"port": 0, "livenessPath": "/alive"}),
    ("health", {"port": 70000}),
    ("health", {"enabled": 1}),
    ("health", {"livenessPath": "/a b"}),
    ("health", {"startupPath": "/s#frag"}),
    ("health", {"readinessPath": "/livez"}),
    ("health", {"prot": 1}),
    ("logging", {"level": "Warn", "loggers": {"pkg.mod": "debug"}, "libraryLevel": "error"}),
    ("logging", {"level": "iNfO"}),
    ("logging", {"level": " INFO "}),
    ("logging", {"python_format": "{message}"}),
    ("logging", {"python_format": "   "}),
    ("logging", {"loggers": {"": "INFO"}}),
    ("logging", {"fileLogging": {"maxFileSize": "0.0001KB"}}),
    ("logging", {"fileLogging": {"maxFileSize": 2048}}),
    ("logging", {"fileLogging": {"backupCount": 0}}),
    ("logging", {"fileLogging": {"enabled": True}}),
    ("metricEmission", {"target": "scrape", "targetConfig": {"port": 0, "path": "/m"}}),
    ("metricEmission", {"intervalSeconds": math.inf}),
    ("metricEmission", {"intervalSeconds": math.nan}),
    ("metricEmission", {"targetConfig": {"path": "/m etrics"}}),
    ("metricEmission", {"targetConfig": {"destination": "north"}}),
    ("metricEmission", {"targetConfig": {"topic": "m/x"}}),
]


def _key(path: str) -> str:
    """The key as a Python caller spells it: ``$.logging.loggers['a.b']`` -> logging.loggers.a.b."""
    return re.sub(r"\['(.*?)'\]", r".\1", path).removeprefix("$.")


@pytest.mark.parametrize(("name", "section"), SECTIONS, ids=lambda v: repr(v))
def test_a_section_parsed_in_code_is_refused_exactly_where_a_document_is(
    name: str, section: dict[str, Any]
) -> None:
    issues = validate_document(patched({name: section}))
    if not issues:
        PARSERS[name](section)
        return
    [path] = {issue.path for issue in issues}
    with pytest.raises(ValueError, match=re.escape(_key(path))):
        PARSERS[name](section)


@pytest.mark.parametrize(
    ("build", "key"),
    [
        (lambda: HealthConfig(port=-1), "health.port"),
        (lambda: HealthConfig(liveness_path="/a b"), "health.livenessPath"),
        (lambda: HealthConfig(readiness_path="/livez"), "health.readinessPath"),
        (lambda: MetricEmissionConfig(interval_seconds=math.nan), "metricEmission.intervalSeconds"),
        (
            lambda: MetricEmissionConfig(path="/m?x=1"),
            "metricEmission.targetConfig.path",
        ),
        (lambda: FileLoggingConfig(max_file_size=0), "logging.fileLogging.maxFileSize"),
        (lambda: FileLoggingConfig(max_file_size="10MB"), "logging.fileLogging.maxFileSize"),
        (lambda: FileLoggingConfig(enabled=True), "logging.fileLogging.filePath"),
        (lambda: LoggingConfig(level="iNfO"), "logging.level"),
        (lambda: LoggingConfig(loggers={1: "INFO"}), "logging.loggers"),
        (lambda: LoggingConfig(file_logging={}), "logging.fileLogging"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_section_built_directly_is_held_to_the_same_rules(
    build: Callable[[], object], key: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(key)):
        build()


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_metric_interval_is_refused_in_a_document(text: str) -> None:
    # JSON's NaN and Infinity pass every JSON Schema bound; the rule says what the schema
    # cannot.
    document = parse_document(
        '{"component": {}, "messaging": {"local": {"host": "embedded"}}, '
        f'"metricEmission": {{"intervalSeconds": {text}}}}}',
        "c.json",
    )
    issues = validate_document(document)
    assert [issue.path for issue in issues] == ["$.metricEmission.intervalSeconds"]


def test_a_document_built_without_validation_still_fails_as_a_document() -> None:
    from unskit.config.model import build_config
    from unskit.config.platform import Platform

    document = patched({"health": {"readinessPath": "/livez"}})
    with pytest.raises(ConfigError) as caught:
        build_config(document, thing="gw", platform=Platform.HOST, component_token="c")
    assert [issue.path for issue in caught.value.issues] == ["$.health.readinessPath"]


def test_every_section_with_rules_is_one_the_types_check() -> None:
    assert set(SECTION_RULES) == set(PARSERS)


def test_the_schema_level_names_are_the_ones_the_python_variant_maps() -> None:
    levels = load_schema("framework.schema.json")["$defs"]["logLevel"]["enum"]
    assert sorted(levels) == sorted(
        form for name in LEVEL_NAMES for form in (name, name.lower(), name.capitalize())
    )
