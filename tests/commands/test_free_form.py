"""The free-form JSON kinds (depth, size, plain JSON), the JSON measures, and the inbox's
handling of binary values in a body."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from unskit.commands import (
    MAX_BODY_BYTES,
    MAX_FREE_FORM_DEPTH,
    BodySpec,
    FreeJson,
    JsonObject,
    Param,
)
from unskit.commands.fields import json_depth, json_size
from unskit.errors import CommandError


def nested(depth: int, leaf: Any = 1, array: bool = False) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if array else {"k": value}
    return value


def refusal(kind: FreeJson, value: Any, path: str = "metadata") -> str:
    with pytest.raises(CommandError) as raised:
        kind.check(value, path)
    assert raised.value.code == "BAD_ARGS"
    return raised.value.message


@pytest.mark.parametrize("array", [False, True], ids=["objects", "arrays"])
def test_depth_at_the_bound_passes_and_one_past_is_refused(array: bool) -> None:
    kind = JsonObject(max_bytes=MAX_BODY_BYTES)
    at_bound = {"k": nested(MAX_FREE_FORM_DEPTH - 1, array=array)}
    assert json_depth(at_bound) == MAX_FREE_FORM_DEPTH
    assert kind.check(at_bound, "metadata") is at_bound
    past = {"k": nested(MAX_FREE_FORM_DEPTH, array=array)}
    message = refusal(kind, past)
    assert message == f"metadata nests deeper than {MAX_FREE_FORM_DEPTH} levels"


def test_the_issue_reproduction_31_levels_is_refused() -> None:
    assert "nests deeper" in refusal(JsonObject(), nested(31))


def test_a_wide_shallow_value_is_not_deep() -> None:
    wide = {f"k{i}": [1, {"a": [2]}] for i in range(50)}
    assert json_depth(wide) == 4
    assert JsonObject().check(wide, "metadata") == wide


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"blob": b"\x00"}, "metadata.blob must be JSON"),
        ({"list": [1, bytearray(b"x")]}, "metadata.list[1] must be JSON"),
        ({"x": math.nan}, "metadata.x must be a finite number"),
        ({"x": [math.inf]}, "metadata.x[0] must be a finite number"),
    ],
)
def test_only_plain_json_is_taken(value: dict[str, Any], where: str) -> None:
    assert refusal(JsonObject(), value).startswith(where)


def test_size_is_the_compact_utf8_encoding() -> None:
    value = {"text": "é" * 10}
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    assert json_size(value) == size
    assert JsonObject(max_bytes=size).check(value, "metadata") == value
    assert refusal(JsonObject(max_bytes=size - 1), value) == (
        f"metadata encodes to {size} bytes; the bound is {size - 1}"
    )


def test_binary_is_measured_as_its_json_marker() -> None:
    # b"abc" projects as {"_libBinary": "YWJj"}.
    assert json_size({"b": b"abc"}) == len('{"b":{"_libBinary":"YWJj"}}')


@pytest.mark.parametrize(
    ("value", "accepted"),
    [(3, True), ("on", True), (True, True), ([1, 2], True), ({}, False), (None, False)],
)
def test_top_level_types(value: Any, accepted: bool) -> None:
    kind = FreeJson(max_depth=1, types=("number", "boolean", "string", "array"))
    if accepted:
        assert kind.check(value, "value") == value
    else:
        message = refusal(kind, value, "value")
        assert message.startswith("value must be a number, a boolean, a string or an array")


def test_describe_reports_the_bounds() -> None:
    described = BodySpec({"metadata": Param(JsonObject(max_bytes=100))}).describe()
    assert described["metadata"] == {
        "type": "object",
        "freeForm": True,
        "maxDepth": MAX_FREE_FORM_DEPTH,
        "maxBytes": 100,
        "required": False,
    }


# -- the inbox: binary values in a body ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"value": 1, "metadata": {"blob": b"\x00"}}, "metadata.blob must be JSON"),
        ({"value": 1, "label": b"text"}, "label must be a string, not bytes"),
    ],
)
def test_binary_values_in_a_body_are_bad_args_naming_the_field(
    start_sample: Any, body: dict[str, Any], message: str
) -> None:
    sample = start_sample()
    with pytest.raises(CommandError) as raised:
        sample.client.call("set-point", {"requestId": "b", **body}, instance="cam-1")
    assert raised.value.code == "BAD_ARGS"
    assert raised.value.message.startswith(message)
    assert sample.client.call("ping")["pong"] is True
