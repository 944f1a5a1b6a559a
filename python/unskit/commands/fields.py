"""Strict command bodies: each verb declares its fields; anything else is BAD_ARGS naming
the field. The shared validators carry the specification's limits."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError

__all__ = [
    "CURSOR",
    "ID",
    "INSTANCE",
    "LIMIT",
    "MAX_BODY_BYTES",
    "MAX_BODY_DEPTH",
    "MAX_FREE_FORM_DEPTH",
    "REASON",
    "REPLY_BUDGET_BYTES",
    "REQUEST_ID",
    "BodySpec",
    "Boolean",
    "Choice",
    "FieldType",
    "FreeJson",
    "Integer",
    "JsonObject",
    "ListOf",
    "Number",
    "ObjectOf",
    "Param",
    "Text",
    "bad_args",
    "json_depth",
    "json_size",
]

# A command body larger than this is refused before it is parsed field by field: it is
# the envelope's own opaque bound, so any body an envelope carries is judged, not dropped.
MAX_BODY_BYTES = 64 * 1024
#: A command body nests at most this many levels by default (`commands.maxBodyDepth`), the
#: body itself being one: a free-form field (MAX_FREE_FORM_DEPTH) inside a body fits with
#: three to spare, and a hostile body is refused before any field walk recurses into it.
MAX_BODY_DEPTH = 20
#: Free-form JSON in a request (capture metadata, say) nests at most this many levels, an
#: object or array being one. Envelopes carry 32 (MAX_VALUE_DEPTH); the deepest reply that
#: embeds such a field (a capture group's status page) puts it 5 levels down, so every
#: reply that can carry it stays inside the envelope with 11 levels to spare.
MAX_FREE_FORM_DEPTH = 16
#: A page's items stop before this many bytes of compact JSON (the first item always goes),
#: and a capture group's copies of its metadata may total no more: replies stay small
#: whatever `limit` or the group size asks.
REPLY_BUDGET_BYTES = 1024 * 1024

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_INSTANCE_TOKEN = re.compile(r"[A-Za-z0-9._-]+")


def bad_args(message: str) -> CommandError:
    """A BAD_ARGS failure; the message names the field."""
    return CommandError(ErrorCode.BAD_ARGS, message)


def _size_stand_in(value: object) -> object:
    # Binary values count as their JSON projection's marker; anything else as its text.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"_libBinary": base64.b64encode(value).decode("ascii")}
    return str(value)


# Made once: json.dumps builds a new encoder for every call given other settings.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_size_stand_in)


def json_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON (binary values as their `_libBinary` marker)."""
    return len(_COMPACT.encode(value).encode("utf-8", "surrogatepass"))


def json_depth(value: Any) -> int:
    """Nesting levels of `value`: 0 for a scalar, 1 for a flat object or array."""
    if isinstance(value, dict):
        return 1 + max((json_depth(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((json_depth(item) for item in value), default=0)
    return 0


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class FieldType:
    """A field's type and range; `check` returns the value or raises BAD_ARGS."""

    kind = "any"

    def check(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """A JSON summary for the describe verb."""
        return {"type": self.kind}

    @staticmethod
    def _wrong_type(path: str, expected: str, value: object) -> CommandError:
        return bad_args(f"{path} must be {expected}, not {_type_name(value)}")


@dataclass(frozen=True)
class Text(FieldType):
    """A string bounded in UTF-8 bytes; optionally free of control characters, or matching
    a pattern (the whole string)."""

    min_bytes: int = 1
    max_bytes: int = 256
    no_control: bool = False
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    kind = "string"

    def check(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self._wrong_type(path, "a string", value)
        size = len(value.encode("utf-8", "surrogatepass"))
        if size < self.min_bytes or size > self.max_bytes:
            bounds = f"{self.min_bytes} to {self.max_bytes}"
            raise bad_args(f"{path} must be {bounds} bytes long, not {size}")
        if self.no_control and _CONTROL.search(value):
            raise bad_args(f"{path} must not contain control characters")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise bad_args(f"{path} must be {self.pattern_text}")
        return value

    def describe(self) -> dict[str, Any]:
        return {"type": "string", "minBytes": self.min_bytes, "maxBytes": self.max_bytes}


@dataclass(frozen=True)
class Integer(FieldType):
    """A whole number (JSON integers; 3.0 is accepted as 3, booleans are not numbers)."""

    minimum: int | None = None
    maximum: int | None = None
    kind = "integer"

    def check(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._wrong_type(path, "an integer", value)
        if isinstance(value, float):
            if not value.is_integer():
                raise bad_args(f"{path} must be an integer, not {value!r}")
            value = int(value)
        _check_range(path, value, self.minimum, self.maximum)
        return int(value)

    def describe(self) -> dict[str, Any]:
        return _with_range({"type": "integer"}, self.minimum, self.maximum)


@dataclass(frozen=True)
class Number(FieldType):
    """A finite number."""

    minimum: float | None = None
    maximum: float | None = None
    kind = "number"

    def check(self, value: Any, path: str) -> float | int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._wrong_type(path, "a number", value)
        if isinstance(value, float) and not math.isfinite(value):
            raise bad_args(f"{path} must be a finite number")
        _check_range(path, value, self.minimum, self.maximum)
        return value

    def describe(self) -> dict[str, Any]:
        return _with_range({"type": "number"}, self.minimum, self.maximum)


@dataclass(frozen=True)
class Boolean(FieldType):
    kind = "boolean"

    def check(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self._wrong_type(path, "true or false", value)
        return value


@dataclass(frozen=True)
class Choice(FieldType):
    """One of a fixed set of strings."""

    choices: tuple[str, ...] = ()
    kind = "string"

    def check(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise bad_args(f"{path} must be one of {', '.join(self.choices)}")
        return value

    def describe(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.choices)}


@dataclass(frozen=True)
class ListOf(FieldType):
    """An array of items of one type."""

    item: FieldType = field(default_factory=FieldType)
    min_items: int = 0
    max_items: int = 1000
    kind = "array"

    def check(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self._wrong_type(path, "an array", value)
        if not self.min_items <= len(value) <= self.max_items:
            bounds = f"{self.min_items} to {self.max_items}"
            raise bad_args(f"{path} must hold {bounds} items, not {len(value)}")
        return [self.item.check(item, f"{path}[{i}]") for i, item in enumerate(value)]

    def describe(self) -> dict[str, Any]:
        return {
            "type": "array",
            "items": self.item.describe(),
            "minItems": self.min_items,
            "maxItems": self.max_items,
        }


_JSON_TYPES = ("object", "array", "string", "number", "boolean", "null")
_ARTICLES = {"object": "an object", "array": "an array", "null": "null"}


@dataclass(frozen=True)
class FreeJson(FieldType):
    """Free-form JSON of the allowed top-level `types`, bounded by nesting depth and by its
    encoded size, so that every reply carrying it stays inside the envelope's limits."""

    max_bytes: int = MAX_BODY_BYTES
    max_depth: int = MAX_FREE_FORM_DEPTH
    types: tuple[str, ...] = _JSON_TYPES
    kind = "json"

    def check(self, value: Any, path: str) -> Any:
        if _type_name(value) not in self.types:
            expected = [_ARTICLES.get(name, f"a {name}") for name in self.types]
            wanted = expected[0] if len(expected) == 1 else ", ".join(expected[:-1])
            if len(expected) > 1:
                wanted += f" or {expected[-1]}"
            raise self._wrong_type(path, wanted, value)
        _check_json(value, path, self.max_depth)
        size = json_size(value)
        if size > self.max_bytes:
            raise bad_args(f"{path} encodes to {size} bytes; the bound is {self.max_bytes}")
        return value

    def describe(self) -> dict[str, Any]:
        shape: str | list[str] = self.types[0] if len(self.types) == 1 else list(self.types)
        return {
            "type": shape,
            "freeForm": True,
            "maxDepth": self.max_depth,
            "maxBytes": self.max_bytes,
        }


@dataclass(frozen=True)
class JsonObject(FreeJson):
    """A free-form JSON object (metadata), bounded by its encoded size and nesting depth."""

    max_bytes: int = 16 * 1024
    max_depth: int = MAX_FREE_FORM_DEPTH
    types: tuple[str, ...] = ("object",)
    kind = "object"


def _check_json(value: Any, field_path: str, bound: int, inner: str = "", level: int = 0) -> None:
    """Plain JSON within `bound` levels; BAD_ARGS names the field (and where inside)."""
    if isinstance(value, (dict, list)):
        if level == bound:
            levels = "level" if bound == 1 else "levels"
            raise bad_args(f"{field_path} nests deeper than {bound} {levels}")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_json(item, field_path, bound, f"{inner}.{key}", level + 1)
        else:
            for index, item in enumerate(value):
                _check_json(item, field_path, bound, f"{inner}[{index}]", level + 1)
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_args(f"{field_path}{_shorten(inner)} must be a finite number")
    if value is None or isinstance(value, (str, int, float)):
        return
    raise bad_args(
        f"{field_path}{_shorten(inner)} must be JSON (object, array, text, number, boolean "
        f"or null), not {_type_name(value)}"
    )


def _shorten(inner: str, keep: int = 120) -> str:
    return inner if len(inner) <= keep else inner[:keep] + "..."


@dataclass(frozen=True)
class Param:
    """A declared body field: its type, whether it must be present, and its default."""

    type: FieldType
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class ObjectOf(FieldType):
    """A nested object with its own declared fields, parsed as strictly as a body."""

    fields: Mapping[str, Param] = field(default_factory=dict)
    kind = "object"

    def check(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self._wrong_type(path, "an object", value)
        return _check_fields(self.fields, value, f"{path}.")

    def describe(self) -> dict[str, Any]:
        return {"type": "object", "fields": _describe_fields(self.fields)}


class BodySpec:
    """The declared fields of one verb's body; nothing else is accepted."""

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Param] | None = None) -> None:
        self.fields: dict[str, Param] = dict(fields or {})

    def with_fields(self, extra: Mapping[str, Param]) -> BodySpec:
        """A copy with more fields (the inbox adds instance, requestId, limit and cursor)."""
        return BodySpec({**extra, **self.fields})

    @property
    def names(self) -> Iterable[str]:
        return self.fields.keys()

    def check(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The body with defaults filled in; BAD_ARGS names the first broken field."""
        return _check_fields(self.fields, body, "")

    def describe(self) -> dict[str, Any]:
        return _describe_fields(self.fields)


def _check_fields(
    fields: Mapping[str, Param], body: Mapping[str, Any], prefix: str
) -> dict[str, Any]:
    for name in body:
        if name not in fields:
            raise bad_args(f"unknown field {prefix}{name}")
    checked: dict[str, Any] = {}
    for name, param in fields.items():
        if name in body:
            checked[name] = param.type.check(body[name], prefix + name)
        elif param.required:
            raise bad_args(f"missing required field {prefix}{name}")
        elif param.default is not None:
            checked[name] = param.default
    return checked


def _describe_fields(fields: Mapping[str, Param]) -> dict[str, Any]:
    described = {}
    for name, param in fields.items():
        entry = param.type.describe()
        entry["required"] = param.required
        if param.default is not None:
            entry["default"] = param.default
        described[name] = entry
    return described


def _check_range(path: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise bad_args(f"{path} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise bad_args(f"{path} must be at most {maximum}, not {value}")


def _with_range(
    summary: dict[str, Any], minimum: float | None, maximum: float | None
) -> dict[str, Any]:
    if minimum is not None:
        summary["minimum"] = minimum
    if maximum is not None:
        summary["maximum"] = maximum
    return summary


# The specification's shared limits.
REQUEST_ID = Text(min_bytes=1, max_bytes=256, no_control=True)
INSTANCE = Text(
    min_bytes=1,
    max_bytes=128,
    pattern=_INSTANCE_TOKEN,
    pattern_text="ASCII letters, digits, dot, underscore or hyphen",
)
LIMIT = Integer(minimum=1, maximum=1000)
DEFAULT_LIMIT = 100
CURSOR = Text(min_bytes=1, max_bytes=4096)
ID = Text(min_bytes=1, max_bytes=256, no_control=True)
REASON = Text(min_bytes=0, max_bytes=1024)
