"""Rules that hold for every schema shipped, checked by walking every schema file: integer
keys refuse a number written with a fraction, every duration key is bounded, every object
is closed unless the documentation says it is open."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import unskit.config
from unskit.config.schema import (
    DURATION_CEILINGS,
    SCHEMA_FILES,
    duration_ceiling,
    validate_with_schema,
)

pytestmark = pytest.mark.unit

SCHEMA_DIR = Path(unskit.config.__file__).with_name("schemas")


def _schemas() -> dict[str, dict[str, Any]]:
    return {
        path.name: json.loads(path.read_text("utf-8"))
        for path in sorted(SCHEMA_DIR.glob("*.schema.json"))
    }


SCHEMAS = _schemas()
BY_ID = {schema["$id"]: schema for schema in SCHEMAS.values()}


def _pointer(parts: tuple[str | int, ...]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _resolve(node: Any, schema: Mapping[str, Any]) -> Any:
    """`node` with its $ref chain followed (within the file or to another shipped schema)."""
    seen = 0
    while isinstance(node, Mapping) and "$ref" in node and seen < 20:
        seen += 1
        base, _, fragment = str(node["$ref"]).partition("#")
        target: Any = BY_ID[base] if base else schema
        if base:
            schema = target
        for part in fragment.strip("/").split("/") if fragment.strip("/") else []:
            target = target[part.replace("~1", "/").replace("~0", "~")]
        # Sibling keywords beside $ref (a maximum) still apply; the type comes from the target.
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _walk(node: Any, at: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    yield at, node
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, (*at, index))


def _is_integer(node: Any) -> bool:
    if not isinstance(node, Mapping):
        return False
    kind = node.get("type")
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
        return True
    values = node.get("enum")
    return isinstance(values, list) and bool(values) and all(type(v) is int for v in values)


def _properties() -> Iterator[tuple[str, str, str, Any]]:
    """(schema file, JSON pointer of the object, key, the key's resolved schema)."""
    for name, schema in SCHEMAS.items():
        for at, node in _walk(schema):
            if isinstance(node, Mapping) and isinstance(node.get("properties"), Mapping):
                if at and at[-1] in ("properties", "$defs"):
                    continue  # a key named "properties", not the keyword
                for key, sub in node["properties"].items():
                    yield name, _pointer(at), key, _resolve(sub, schema)


INTEGER_KEYS = [(f, p, k, sub) for f, p, k, sub in _properties() if _is_integer(sub)]
DURATION_KEYS = [(f, p, k, sub) for f, p, k, sub in _properties() if duration_ceiling(k)]


def test_every_schema_file_is_in_the_registry() -> None:
    assert set(SCHEMAS) == set(SCHEMA_FILES)


def test_the_walk_finds_the_keys_the_issue_names() -> None:
    found = {(f, k) for f, _, k, _ in INTEGER_KEYS}
    for key in ("port", "keepAliveSeconds"):
        assert ("framework.schema.json", key) in found
    assert ("file-egress.schema.json", "maxConcurrentFiles") in found
    assert ("signal-recorder.schema.json", "level") in found
    assert len(INTEGER_KEYS) > 60
    assert len(DURATION_KEYS) > 40


def _probe(file: str, pointer: str, instance: object) -> list[Any]:
    return validate_with_schema(instance, {"$ref": f"{SCHEMAS[file]['$id']}#{pointer}"})


def _valid_integer(sub: Mapping[str, Any]) -> int:
    """A value of `sub`'s range (its first enum value, else its minimum, else 1)."""
    if sub.get("enum"):
        return int(sub["enum"][0])
    if "minimum" in sub:
        return max(int(sub["minimum"]), 1) if sub.get("maximum", 2) >= 1 else int(sub["minimum"])
    if "exclusiveMinimum" in sub:
        return int(sub["exclusiveMinimum"]) + 1
    return 1


def _messages(issues: list[Any], path: str) -> list[str]:
    return [issue.message for issue in issues if issue.path == path]


@pytest.mark.parametrize(("file", "pointer", "key", "sub"), INTEGER_KEYS)
def test_integer_key_refuses_a_number_with_a_fraction(
    file: str, pointer: str, key: str, sub: Mapping[str, Any]
) -> None:
    value = _valid_integer(sub)
    path = f"$.{key}"
    # The value itself is valid for the key, so only the fraction can be refused.
    assert _messages(_probe(file, pointer, {key: value}), path) == []
    messages = _messages(_probe(file, pointer, {key: float(value)}), path)
    assert any("must be an integer" in m for m in messages), f"{file}{pointer}: {key}: {messages}"


@pytest.mark.parametrize(("file", "pointer", "key", "sub"), DURATION_KEYS)
def test_duration_key_is_bounded(file: str, pointer: str, key: str, sub: Mapping[str, Any]) -> None:
    ceiling = duration_ceiling(key)
    assert ceiling is not None
    huge = ceiling[0] + 1 if _is_integer(sub) else 1e300
    messages = _messages(_probe(file, pointer, {key: huge}), f"$.{key}")
    assert any("must be <=" in m for m in messages), f"{file}{pointer}: {key}: {huge} accepted"
    # A schema's own maximum is never looser than the unit's ceiling.
    maximum = sub.get("maximum")
    assert maximum is None or maximum <= ceiling[0]


def test_duration_units_are_the_documented_ones() -> None:
    assert duration_ceiling("bandwidthBytesPerSec") is None
    assert duration_ceiling("intervalSeconds") == DURATION_CEILINGS["Seconds"]
    assert duration_ceiling("connectMs") == (2**31 - 1, "about 24.8 days")
    assert duration_ceiling("renewBeforeDays") == (3650, "10 years")


# Objects that are open on purpose, each with where the documentation says so.
DOCUMENTED_OPEN = {
    # docs/configuration.md "component (required)": everything else in `component` belongs
    # to the component's own schema, which checks it (closed) in the same validation.
    ("framework.schema.json", "/properties/component"),
    # docs/configuration.md "ethernet-ip-adapter: `component`" and "opcua-adapter:
    # `component`": each instance entry is then checked on its own, against $defs/instance
    # (closed), so a malformed entry is skipped while the others run.
    ("ethernet-ip-adapter.schema.json", "/properties/instances/items"),
    ("opcua-adapter.schema.json", "/properties/instances/items"),
    # docs/configuration.md "file-egress: `component`": checked strictly, an unknown key
    # anywhere refused; a destination's type selects its schema ($defs/local, $defs/sftp,
    # ...), each closed (test below).
    ("file-egress.schema.json", "/$defs/destination"),
}


def _objects() -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    for name, schema in SCHEMAS.items():
        for at, node in _walk(schema):
            if not isinstance(node, Mapping) or (at and at[-1] in ("properties", "$defs")):
                continue
            if at and at[-1] in ("if", "not"):
                continue  # a condition, not an object the document holds
            if node.get("type") == "object" or "properties" in node:
                yield name, _pointer(at), node


def _closed(node: Mapping[str, Any]) -> bool:
    extra = node.get("additionalProperties")
    if extra is False or node.get("unevaluatedProperties") is False:
        return True
    if isinstance(extra, Mapping):
        return True  # a map: any key, each value held to that schema
    branches = node.get("oneOf") or node.get("anyOf")
    return bool(branches) and all(
        isinstance(b, Mapping) and b.get("additionalProperties") is False for b in branches
    )


@pytest.mark.parametrize(("file", "pointer"), [(f, p) for f, p, _ in _objects()])
def test_every_object_is_closed_unless_documented_open(file: str, pointer: str) -> None:
    node = next(n for f, p, n in _objects() if (f, p) == (file, pointer))
    # A $ref beside `properties` (northbound credentials) is closed by the object it names.
    assert _closed(_resolve(node, SCHEMAS[file])) or (file, pointer) in DOCUMENTED_OPEN, (
        f"{file}{pointer} accepts unknown keys"
    )


def test_documented_open_objects_still_exist() -> None:
    present = {(f, p) for f, p, _ in _objects()}
    assert present >= DOCUMENTED_OPEN


@pytest.mark.parametrize(
    "kind",
    SCHEMAS["file-egress.schema.json"]["$defs"]["destination"]["properties"]["type"]["enum"],
)
def test_every_egress_destination_type_is_closed(kind: str) -> None:
    issues = _probe("file-egress.schema.json", "/$defs/destination", {"type": kind, "bogus": 1})
    assert any(i.path == "$.bogus" and "unknown key" in i.message for i in issues)


def test_ethernet_ip_connection_refuses_a_misspelt_key() -> None:
    entry = {"id": "plc-1", "connection": {"endpoint": "10.0.0.5", "conected": True}}
    issues = _probe("ethernet-ip-adapter.schema.json", "/$defs/instance", entry)
    assert any(i.path == "$.connection.conected" and "unknown key" in i.message for i in issues)
