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

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from unskit.config._paths import json_path
from unskit.config.platform import Platform
from unskit.config.rules import SECTION_RULES, configuration_issues
from unskit.config.values import MAX_DEPTH
from unskit.errors import ConfigError, ConfigIssue

__all__ = [
    "DURATION_CEILINGS",
    "FRAMEWORK_SCHEMA",
    "SCHEMA_FILES",
    "check_schema",
    "check_section",
    "duration_ceiling",
    "framework_schema",
    "is_topic_level",
    "load_schema",
    "section_issues",
    "validate_document",
    "validate_with_schema",
]

FRAMEWORK_SCHEMA = "framework.schema.json"
#: Every schema shipped in ``schemas/``; all are in the registry, so one may $ref another.
SCHEMA_FILES = (
    FRAMEWORK_SCHEMA,
    "camera-adapter.schema.json",
    "ethernet-ip-adapter.schema.json",
    "file-egress.schema.json",
    "opcua-adapter.schema.json",
    "signal-recorder.schema.json",
)
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

# A duration key is named for its unit (``intervalSeconds``, ``connectMs``, ``maxAgeHours``).
# Every one is bounded here, whatever schema holds it, because an unbounded one reaches a
# timer that overflows (threading's wait raises OverflowError past ~292 years, and the thread
# dies while the process runs on). Milliseconds fit a signed 32-bit count (24.8 days, the
# timer limit of the Java and TypeScript variants); the longer units allow ten years.
_TEN_YEARS_S = 10 * 365 * 86400
#: Unit suffix of a duration key -> (its ceiling, the ceiling in words).
DURATION_CEILINGS: Mapping[str, tuple[int, str]] = {
    "Ms": (2**31 - 1, "about 24.8 days"),
    "Millis": (2**31 - 1, "about 24.8 days"),
    "Seconds": (_TEN_YEARS_S, "10 years"),
    "Secs": (_TEN_YEARS_S, "10 years"),
    "Mins": (_TEN_YEARS_S // 60, "10 years"),
    "Minutes": (_TEN_YEARS_S // 60, "10 years"),
    "Hours": (_TEN_YEARS_S // 3600, "10 years"),
    "Days": (_TEN_YEARS_S // 86400, "10 years"),
}
# The unit must follow a lower-case letter or digit: ``bandwidthBytesPerSec`` is a rate.
_DURATION_KEY = re.compile(r"[a-z0-9](" + "|".join(DURATION_CEILINGS) + r")$")


def duration_ceiling(key: str) -> tuple[int, str] | None:
    """(ceiling, in words) when `key` names a duration by its unit suffix, else None."""
    match = _DURATION_KEY.search(key)
    return DURATION_CEILINGS[match.group(1)] if match else None


def _is_integer(_checker: object, instance: object) -> bool:
    # JSON Schema's integer admits 30.0; every reader of an integer key here (a socket port,
    # paho's keepalive, a thread pool size, zstd's level) needs a Python int, so a number
    # written with a fraction is refused with its path rather than failing at run.
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12 with `integer` meaning an integer written without a fraction; every
#: schema of the package (framework, component, instance, section) is checked with it.
_Validator: Any = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


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
    # Component schemas may $ref the framework's $defs (e.g. secretRef) by its $id, and any
    # shipped schema is reachable by its $id (the schema tests walk them that way).
    # Without "$schema": a $ref into a resource that names its dialect would be checked by
    # the stock Draft 2020-12 class (jsonschema picks the class from "$schema"), losing the
    # integer rule of `_Validator`.
    registry: Registry[Any] = Registry()
    for name in SCHEMA_FILES:
        schema = framework_schema() if name == FRAMEWORK_SCHEMA else load_schema(name)
        contents = {key: value for key, value in schema.items() if key != "$schema"}
        resource = Resource.from_contents(contents, default_specification=DRAFT202012)
        registry = registry.with_resource(schema["$id"], resource)
    return registry


@functools.cache
def _framework_validator() -> Any:
    schema = dict(framework_schema())
    _Validator.check_schema(schema)
    return _Validator(schema, registry=_registry())


def check_schema(schema: Mapping[str, Any], option: str = "--schema") -> None:
    """Raises `ConfigError` naming `option` when `schema` is not a valid Draft 2020-12 schema."""
    try:
        _Validator.check_schema(dict(schema))
    except SchemaError as error:
        where = json_path(error.absolute_path)
        raise ConfigError(
            [ConfigIssue(option, f"is not a valid JSON Schema (at {where}: {error.message})")]
        ) from None
    except RecursionError:
        raise ConfigError([ConfigIssue(option, "nests too deep to be a schema")]) from None


def validate_with_schema(
    instance: object, schema: Mapping[str, Any], prefix: Sequence[str | int] = ()
) -> list[ConfigIssue]:
    """Every issue of `instance` against `schema`, with paths under `prefix`."""
    schema_dict = dict(schema)
    _Validator.check_schema(schema_dict)
    validator = _Validator(schema_dict, registry=_registry())
    issues = _issues(validator.iter_errors(instance), prefix)
    return issues + list(_duration_issues(instance, tuple(prefix)))


@functools.cache
def _section_validator(name: str) -> Any:
    ref = f"{framework_schema()['$id']}#/properties/{name}"
    return _Validator({"$ref": ref}, registry=_registry())


def section_issues(name: str, section: object) -> list[ConfigIssue]:
    """Every issue of one framework section (``health``, ``logging``, ``metricEmission``)
    given alone: its part of the framework schema, then its rules."""
    issues = _issues(_section_validator(name).iter_errors(section), (name,))
    issues += _duration_issues(section, (name,))
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
    too_deep = _too_deep(document)
    if too_deep is not None:
        return [too_deep]
    # NaN and Infinity (Python's json and YAML's .nan/.inf read them) satisfy every numeric
    # rule of JSON Schema; they are refused here, once, wherever they appear.
    non_finite = list(_non_finite(document, ()))
    issues = non_finite + _issues(_framework_validator().iter_errors(document), ())
    issues += _duration_issues(document, ())
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


def _too_deep(document: object) -> ConfigIssue | None:
    """The first place the document nests deeper than `MAX_DEPTH` (walked without recursion:
    everything after this recurses per level)."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        value, at = stack.pop()
        if len(at) > MAX_DEPTH:
            where = json_path(at[:MAX_DEPTH])
            return ConfigIssue(where, f"nests deeper than {MAX_DEPTH} levels below $")
        if isinstance(value, Mapping):
            stack.extend((item, (*at, str(key))) for key, item in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((item, (*at, index)) for index, item in enumerate(value))
    return None


def _non_finite(value: object, at: tuple[str | int, ...]) -> Iterator[ConfigIssue]:
    if isinstance(value, float) and not math.isfinite(value):
        yield ConfigIssue(json_path(at), f"must be a finite number, not {value!r}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _non_finite(item, (*at, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, (*at, index))


def _duration_issues(value: object, at: tuple[str | int, ...]) -> Iterator[ConfigIssue]:
    """Every duration key (by its unit suffix) above its unit's ceiling, wherever it is."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            ceiling = duration_ceiling(str(key))
            number = isinstance(item, (int, float)) and not isinstance(item, bool)
            if ceiling is not None and number and item > ceiling[0]:
                yield ConfigIssue(
                    json_path((*at, str(key))),
                    f"must be <= {ceiling[0]} ({ceiling[1]}, the ceiling of every duration "
                    f"key in this unit)",
                )
            else:
                yield from _duration_issues(item, (*at, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _duration_issues(item, (*at, index))


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
        if "integer" in expected and isinstance(instance, float) and instance.is_integer():
            return f"must be {names}, written without a decimal point or exponent"
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
