"""Validation of a configuration document: the JSON Schemas (data files in ``schemas/``,
Draft 2020-12) and the rules a schema cannot say (hierarchy and identity, platform-dependent
requirements, `$secret` shape). Every issue names its JSON path and the rule; all issues are
collected, never just the first.

Messages are built from the rule, never from the offending value, so a mistyped password or
a malformed `$secret` cannot leak through an error.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from unskit.config._paths import json_path
from unskit.config.model import DEFAULT_LEVELS, EMBEDDED_HOST, JSON_FORMAT, parse_size
from unskit.config.platform import Platform
from unskit.config.secrets import FIELD_KEY, SECRET_KEY, find_secret_refs, secret_objects
from unskit.errors import ConfigIssue

__all__ = [
    "FRAMEWORK_SCHEMA",
    "framework_schema",
    "is_topic_level",
    "load_schema",
    "validate_document",
    "validate_with_schema",
]

FRAMEWORK_SCHEMA = "framework.schema.json"
# Annotation in the schema files that words the error for a pattern, enum, anyOf or not.
_MESSAGE_KEY = "x-message"
_WORDED_RULES = frozenset({"pattern", "enum", "const", "anyOf", "oneOf", "not", "format"})
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
_LEVEL = re.compile(r"^[A-Za-z0-9_-]+$")
_PROBE_PATHS = {"livenessPath": "/livez", "readinessPath": "/readyz", "startupPath": "/startupz"}


def load_schema(name: str) -> dict[str, Any]:
    """Reads a schema data file shipped in ``unskit/config/schemas/``."""
    text = resources.files("unskit.config").joinpath("schemas").joinpath(name).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


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


def validate_document(
    document: object,
    *,
    platform: Platform = Platform.HOST,
    component_schema: Mapping[str, Any] | None = None,
) -> list[ConfigIssue]:
    """Every issue of a document: framework schema, component schema, cross-section rules."""
    issues = _issues(_framework_validator().iter_errors(document), ())
    if not isinstance(document, Mapping):
        return issues
    component = document.get("component")
    if component_schema is not None and isinstance(component, Mapping):
        issues += validate_with_schema(component, component_schema, ("component",))
    # A rule below a path the schema already faulted would only repeat that fault.
    taken = {issue.path for issue in issues}
    issues += [issue for issue in _rules(document, platform) if not _under(issue.path, taken)]
    return sorted(set(issues))


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


# -- rules a schema cannot say ----------------------------------------------------------


def _rules(document: Mapping[str, Any], platform: Platform) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    levels = _levels(document)
    if levels is not None:
        issues += _identity_rules(document.get("identity"), levels)
        issues += _tag_rules(document.get("tags"), levels)
        issues += _topic_rules(document.get("topic"), levels)
    issues += _messaging_rules(document.get("messaging"), platform)
    issues += _health_rules(document.get("health"))
    issues += _logging_rules(document.get("logging"))
    issues += _secret_rules(document)
    return issues


def _levels(document: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The hierarchy levels, or None when the hierarchy is itself broken (already reported)."""
    hierarchy = document.get("hierarchy")
    if hierarchy is None:
        return DEFAULT_LEVELS
    if not isinstance(hierarchy, Mapping):
        return None
    levels = hierarchy.get("levels", DEFAULT_LEVELS)
    if (
        not isinstance(levels, (list, tuple))
        or not levels
        or not all(isinstance(level, str) and _LEVEL.match(level) for level in levels)
        or len(set(levels)) != len(levels)
    ):
        return None
    return tuple(levels)


def _identity_rules(identity: object, levels: tuple[str, ...]) -> Iterator[ConfigIssue]:
    section = identity if isinstance(identity, Mapping) else {}
    device = levels[-1]
    for key in section:
        if key == device:
            yield ConfigIssue(
                json_path(("identity", key)),
                "is the last hierarchy level, the device: its value is the thing name "
                "(-t/--thing), never configured in identity",
            )
        elif key not in levels:
            yield ConfigIssue(
                json_path(("identity", key)),
                f"is not a declared hierarchy level (levels: {', '.join(levels)})",
            )
    if identity is not None and not isinstance(identity, Mapping):
        return
    for level in levels[:-1]:
        if level not in section:
            yield ConfigIssue(
                json_path(("identity", level)),
                f"is required: every hierarchy level except the last ({device!r}) needs a value",
            )


def _tag_rules(tags: object, levels: tuple[str, ...]) -> Iterator[ConfigIssue]:
    if not isinstance(tags, Mapping):
        return
    for key in tags:
        if key in levels:
            yield ConfigIssue(
                json_path(("tags", key)),
                f"is a hierarchy level: location keys belong in identity, not tags "
                f"(levels: {', '.join(levels)})",
            )


def _topic_rules(topic: object, levels: tuple[str, ...]) -> Iterator[ConfigIssue]:
    if isinstance(topic, Mapping) and topic.get("includeRoot") is True and len(levels) < 2:
        yield ConfigIssue(
            json_path(("topic", "includeRoot")),
            "needs a hierarchy of at least two levels: the first hierarchy value is inserted "
            "after the root, and with one level that value is the device itself",
        )


def _messaging_rules(messaging: object, platform: Platform) -> Iterator[ConfigIssue]:
    if messaging is not None and not isinstance(messaging, Mapping):
        return
    section = messaging or {}
    local = section.get("local")
    if local is None:
        # The edge runtime's IPC bus would be the other way, but this variant has no
        # provider for it: refused here rather than failing at start.
        edge = " (there is no edge-runtime IPC transport: use its MQTT broker)"
        yield ConfigIssue(
            json_path(("messaging", "local")),
            'is required: give the local broker as {"host": ..., "port": ...}, or '
            '{"host": "embedded"} to start the in-process broker'
            + (edge if platform is Platform.EDGE_RUNTIME else ""),
        )
    if isinstance(local, Mapping) and local.get("port") == 0 and local.get("host") != EMBEDDED_HOST:
        yield ConfigIssue(
            json_path(("messaging", "local", "port")),
            'must be >= 1: port 0 (any free port) is allowed only with "host": "embedded"',
        )
    northbound = section.get("northbound")
    if isinstance(northbound, Mapping):
        if EMBEDDED_HOST in (northbound.get("host"), northbound.get("endpoint")):
            yield ConfigIssue(
                json_path(("messaging", "northbound", "host")),
                'cannot be "embedded": the northbound broker is a remote broker',
            )
        if northbound.get("port") == 0:
            yield ConfigIssue(json_path(("messaging", "northbound", "port")), "must be >= 1")


def _health_rules(health: object) -> Iterator[ConfigIssue]:
    if not isinstance(health, Mapping):
        return
    # Two probes on one path would leave one of them unreachable.
    seen: dict[str, str] = {}
    for key, default in _PROBE_PATHS.items():
        path = health.get(key, default)
        if not isinstance(path, str):
            continue
        if path in seen:
            yield ConfigIssue(
                json_path(("health", key)), f"must differ from {seen[path]} (both are {path})"
            )
        else:
            seen[path] = key


def _logging_rules(section: object) -> Iterator[ConfigIssue]:
    if not isinstance(section, Mapping):
        return
    text = section.get("python_format")
    if isinstance(text, str) and text.strip().lower() != JSON_FORMAT:
        try:
            logging.Formatter(text, validate=True)
        except ValueError:
            yield ConfigIssue(
                json_path(("logging", "python_format")),
                'must be a %-style logging format such as "%(asctime)s %(message)s", or "json"',
            )
    files = section.get("fileLogging")
    size = files.get("maxFileSize") if isinstance(files, Mapping) else None
    if isinstance(size, str):
        try:
            too_small = parse_size(size) <= 0
        except ValueError:
            too_small = False  # the schema's pattern reports the shape
        if too_small:
            yield ConfigIssue(
                json_path(("logging", "fileLogging", "maxFileSize")),
                "must be greater than zero (a file never rotates at 0)",
            )


def _secret_rules(document: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    for parts, obj in secret_objects(document):
        extra = sorted(set(obj) - {SECRET_KEY, FIELD_KEY})
        for key in extra:
            yield ConfigIssue(
                json_path((*parts, key)),
                f'unknown key in a $secret reference (allowed: "{SECRET_KEY}", "{FIELD_KEY}")',
            )
        name = obj[SECRET_KEY]
        if not isinstance(name, str) or not name:
            yield ConfigIssue(
                json_path((*parts, SECRET_KEY)), "must be a non-empty string: the vault secret name"
            )
        if FIELD_KEY in obj and (not isinstance(obj[FIELD_KEY], str) or not obj[FIELD_KEY]):
            yield ConfigIssue(
                json_path((*parts, FIELD_KEY)), "must be a non-empty string: a field of the secret"
            )
    if document.get("credentials") is None:
        for path, _ in find_secret_refs(document):
            yield ConfigIssue(
                path,
                "is a $secret reference, which needs the credentials section "
                "(the encrypted vault it resolves from)",
            )


def is_topic_level(text: str) -> bool:
    """True when `text` is one non-empty topic level (no '/', '+', '#')."""
    return bool(_TOPIC_LEVEL.match(text))
