"""Validation of a configuration document: the JSON Schemas (data files in ``schemas/``,
Draft 2020-12) own the shape, `unskit.config.rules` the rules a schema cannot say; a
component's own rules run in its ``configuration_issues``. Every issue names its JSON path
and the rule; all issues are collected, never just the first.

`check_section` holds a framework section built in code (`HealthConfig`, `LoggingConfig`,
`MetricEmissionConfig`) to the same schema and rules, so each rule is written once.

Messages are built from the rule, never from the offending value, so a mistyped password or
a malformed `$secret` cannot leak through an error.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from unskit.config._paths import json_path
from unskit.config.platform import Platform
from unskit.config.rules import SECTION_RULES, configuration_issues
from unskit.errors import ConfigIssue

__all__ = [
    "FRAMEWORK_SCHEMA",
    "check_section",
    "framework_schema",
    "is_topic_level",
    "load_schema",
    "section_issues",
    "validate_document",
    "validate_with_schema",
]

FRAMEWORK_SCHEMA = "framework.schema.json"
# Annotation in the schema files that words the error for a pattern, enum, anyOf, not or
# minimum (where the bound has a reason worth giving).
_MESSAGE_KEY = "x-message"
_WORDED_RULES = frozenset(
    {"pattern", "enum", "const", "anyOf", "oneOf", "not", "format", "minimum"}
)
_JSON_TYPES = {
    "object": "an object",
    "array": "an array",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
}
_TOPIC_LEVEL = re.compile(r"^[^/#+\x00]+$")
# A key a JSON path writes in brackets, `['a.b']`.
_BRACKETED = re.compile(r"\['((?:[^'\\]|\\.)*)'\]")


class _SectionError(ValueError):
    """A framework section built in code that breaks a rule; `issues` name the JSON paths.

    The message names each key in dotted form (``logging.loggers.pkg.mod``), as Python
    callers spell it; `build_config` turns the issues back into a `ConfigError`.
    """

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("; ".join(f"{_dotted(i.path)}: {i.message}" for i in self.issues))


def _dotted(path: str) -> str:
    """``$.logging.loggers['pkg.mod']`` -> ``logging.loggers.pkg.mod``."""
    plain = _BRACKETED.sub(lambda m: "." + re.sub(r"\\(.)", r"\1", m.group(1)), path)
    return plain.removeprefix("$").removeprefix(".")


def load_schema(name: str) -> dict[str, Any]:
    """Reads a schema data file shipped in ``unskit/config/schemas/``."""
    text = resources.files("unskit.config").joinpath("schemas").joinpath(name).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def definition_schema(schema: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A schema of its own for `schema`'s ``$defs/<name>`` (one instance entry, checked on
    its own so a malformed entry is skipped with its path while the others run)."""
    return {
        "$schema": schema["$schema"],
        "$id": f"{schema['$id']}:{name}",
        "$defs": schema["$defs"],
        "$ref": f"#/$defs/{name}",
    }


@functools.cache
def framework_schema() -> Mapping[str, Any]:
    """The framework schema (the shared sections), read once."""
    return load_schema(FRAMEWORK_SCHEMA)


@functools.cache
def _registry() -> Registry[Any]:
    # Component schemas may $ref the framework's $defs (e.g. secretRef) by its $id.
    schema = framework_schema()
    resource = Resource.from_contents(dict(schema), default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(schema["$id"], resource)
    return registry


@functools.cache
def _framework_validator() -> Draft202012Validator:
    schema = dict(framework_schema())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_registry())


def validate_with_schema(
    instance: object, schema: Mapping[str, Any], prefix: Sequence[str | int] = ()
) -> list[ConfigIssue]:
    """Every issue of `instance` against `schema`, with paths under `prefix`."""
    schema_dict = dict(schema)
    Draft202012Validator.check_schema(schema_dict)
    validator = Draft202012Validator(schema_dict, registry=_registry())
    return _issues(validator.iter_errors(instance), prefix)


@functools.cache
def _section_validator(name: str) -> Draft202012Validator:
    ref = f"{framework_schema()['$id']}#/properties/{name}"
    return Draft202012Validator({"$ref": ref}, registry=_registry())


def section_issues(name: str, section: object) -> list[ConfigIssue]:
    """Every issue of one framework section (``health``, ``logging``, ``metricEmission``)
    given alone: its part of the framework schema, then its rules."""
    issues = _issues(_section_validator(name).iter_errors(section), (name,))
    taken = {issue.path for issue in issues}
    issues += [issue for issue in SECTION_RULES[name](section) if not _under(issue.path, taken)]
    return sorted(set(issues))


def check_section(name: str, section: object) -> None:
    """Raises ValueError naming every broken rule's key when `section` breaks one."""
    issues = section_issues(name, section)
    if issues:
        raise _SectionError(issues)


def validate_document(
    document: object,
    *,
    platform: Platform = Platform.HOST,
    component_schema: Mapping[str, Any] | None = None,
) -> list[ConfigIssue]:
    """Every issue of a document: framework schema, component schema, cross-section rules."""
    # NaN and Infinity (Python's json and YAML's .nan/.inf read them) satisfy every numeric
    # rule of JSON Schema; they are refused here, once, wherever they appear.
    non_finite = list(_non_finite(document, ()))
    issues = non_finite + _issues(_framework_validator().iter_errors(document), ())
    if not isinstance(document, Mapping):
        return issues
    component = document.get("component")
    if component_schema is not None and isinstance(component, Mapping):
        issues += validate_with_schema(component, component_schema, ("component",))
    # A rule below a path the schema already faulted would only repeat that fault.
    taken = {issue.path for issue in issues}
    rules = configuration_issues(document, platform)
    issues += [issue for issue in rules if not _under(issue.path, taken)]
    bad = {issue.path for issue in non_finite}
    return sorted({issue for issue in issues if issue in non_finite or not _under(issue.path, bad)})


def _non_finite(value: object, at: tuple[str | int, ...]) -> Iterator[ConfigIssue]:
    if isinstance(value, float) and not math.isfinite(value):
        yield ConfigIssue(json_path(at), f"must be a finite number, not {value!r}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _non_finite(item, (*at, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, (*at, index))


def _under(path: str, taken: set[str]) -> bool:
    return any(path == t or path.startswith((t + ".", t + "[")) for t in taken)


# -- schema errors to issues ----------------------------------------------------------------


def _issues(errors: Iterable[ValidationError], prefix: Sequence[str | int]) -> list[ConfigIssue]:
    out: list[ConfigIssue] = []
    for error in errors:
        out.extend(_describe(error, (*prefix, *error.absolute_path)))
    return out


def _describe(error: ValidationError, at: tuple[str | int, ...]) -> Iterator[ConfigIssue]:
    rule = error.validator
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    value: Any = error.validator_value
    instance: Any = error.instance
    worded = schema.get(_MESSAGE_KEY)

    if "propertyNames" in error.relative_schema_path or "propertyNames" in error.schema_path:
        # The instance is the offending key name; name it in the path, not the message.
        yield ConfigIssue(json_path((*at, str(instance))), f"key name {_rule_text(error)}")
        return
    if rule == "required":
        present = instance if isinstance(instance, Mapping) else {}
        for name in value:
            if name not in present:
                yield ConfigIssue(json_path((*at, name)), "is required")
        return
    if rule == "additionalProperties" and value is False:
        allowed = sorted(schema.get("properties", {}))
        patterns = list(schema.get("patternProperties", {}))
        for key in instance:
            if key in allowed or any(re.search(p, key) for p in patterns):
                continue
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            yield ConfigIssue(json_path((*at, key)), f"unknown key, not allowed here{hint}")
        return
    if rule == "dependentRequired":
        for trigger, needed in value.items():
            if trigger in instance:
                for name in needed:
                    if name not in instance:
                        yield ConfigIssue(
                            json_path((*at, name)), f"is required alongside {trigger}"
                        )
        return
    if rule == "uniqueItems":
        seen: list[object] = []
        for index, item in enumerate(instance):
            if item in seen:
                yield ConfigIssue(
                    json_path((*at, index)), "repeats an earlier item; items must be unique"
                )
            else:
                seen.append(item)
        return
    if rule in _WORDED_RULES and isinstance(worded, str):
        yield ConfigIssue(json_path(at), worded)
        return
    if rule in ("anyOf", "oneOf") and error.context:
        inner = best_match(error.context)
        yield from _describe(inner, (*at, *inner.relative_path))
        return
    yield ConfigIssue(json_path(at), _rule_text(error))


def _rule_text(error: ValidationError) -> str:
    rule = error.validator
    value: Any = error.validator_value
    instance: Any = error.instance
    if rule == "type":
        expected = [value] if isinstance(value, str) else list(value)
        names = " or ".join(_JSON_TYPES.get(t, t) for t in expected)
        return f"must be {names}, not {_json_type(instance)}"
    if rule == "enum":
        return "must be one of: " + ", ".join(json.dumps(v) for v in value)
    if rule == "const":
        return f"must be {json.dumps(value)}"
    if rule == "minimum":
        return f"must be >= {value}"
    if rule == "maximum":
        return f"must be <= {value}"
    if rule == "exclusiveMinimum":
        return f"must be > {value}"
    if rule == "exclusiveMaximum":
        return f"must be < {value}"
    if rule == "minLength":
        return "must not be empty" if value == 1 else f"must be at least {value} characters"
    if rule == "maxLength":
        return f"must be at most {value} characters"
    if rule == "minItems":
        return "must not be empty" if value == 1 else f"must have at least {value} items"
    if rule == "maxItems":
        return f"must have at most {value} items"
    if rule == "pattern":
        return f"must match the pattern {value}"
    if rule == "not":
        return "is not allowed here"
    if rule in ("anyOf", "oneOf"):
        return "does not match any allowed form"
    if rule == "false":
        return "is not allowed here"
    return f"breaks the schema rule {rule!r}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a non-JSON value ({type(value).__name__})"


def is_topic_level(text: str) -> bool:
    """True when `text` is one non-empty topic level (no '/', '+', '#')."""
    return bool(_TOPIC_LEVEL.match(text))
