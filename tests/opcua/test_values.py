"""The OPC UA value mapping, stable ids and matching, without a server."""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import re
import uuid
from typing import Any

import pytest
from asyncua import ua

from tests.support.opcua import matcher, subscription
from unskit.opcua.matchers import (
    BrowsedNode,
    Child,
    MonitoredNode,
    parse_stable_id,
    resolve_namespaces,
    select,
    walk,
)
from unskit.opcua.variants import from_json, node_id, stable_id, status_name, to_json, type_name
from unskit.southbound.driver import SignalSpec

UTC = datetime.timezone.utc


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (-5, -5),
        (18000000000000000000, 18000000000000000000),
        (1.5, 1.5),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
        ("héllo", "héllo"),
        (datetime.datetime(2024, 1, 2, 3, 4, 5, 678999, tzinfo=UTC), "2024-01-02T03:04:05.678Z"),
        (datetime.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05.000Z"),
        (
            datetime.datetime(
                2024, 1, 2, 5, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
            ),
            "2024-01-02T03:04:05.000Z",
        ),
        (uuid.UUID("72962b91-fa75-4ae6-8d28-b404dc7daf63"), "72962b91-fa75-4ae6-8d28-b404dc7daf63"),
        (b"\x00\x01\xfe\xff", "AAH+/w=="),
        (ua.XmlElement("<a/>"), "<a/>"),
        (ua.NodeId(2258, 0), "ns=0;i=2258"),
        (ua.NodeId("Foo", 2), "ns=2;s=Foo"),
        (ua.NodeId(b"ab", 1, ua.NodeIdType.ByteString), "ns=1;b=YWI="),
        (ua.QualifiedName("Name", 3), "3:Name"),
        (ua.LocalizedText("Hallo", "de"), {"locale": "de", "text": "Hallo"}),
        (ua.LocalizedText("x"), {"locale": None, "text": "x"}),
        (ua.StatusCode(ua.StatusCodes.BadOutOfRange), "BadOutOfRange"),
        (ua.Range(Low=0.0, High=2.5), {"Low": 0.0, "High": 2.5}),
        (
            ua.EUInformation(NamespaceUri="u", UnitId=4408652, DisplayName=ua.LocalizedText("°C")),
            {
                "NamespaceUri": "u",
                "UnitId": 4408652,
                "DisplayName": {"locale": None, "text": "°C"},
                "Description": {"locale": None, "text": None},
            },
        ),
        (
            ua.ExtensionObject(TypeId=ua.NodeId(5001, 2), Body=b"\x01\x02\x03"),
            {"typeId": "ns=2;i=5001", "encoding": "binary", "body": "AQID"},
        ),
        (
            ua.ExtensionObject(TypeId=ua.NodeId(5001, 2)),
            {"typeId": "ns=2;i=5001", "encoding": "none", "body": ""},
        ),
        ([1, 2, 3], [1, 2, 3]),
        ([ua.LocalizedText("a", "en")], [{"locale": "en", "text": "a"}]),
        (ua.ServerState.Running, "Running"),
    ],
)
def test_to_json(value: Any, expected: Any) -> None:
    assert to_json(value) == expected


@pytest.mark.parametrize(
    ("value", "vtype", "array", "expected"),
    [
        (True, ua.VariantType.Boolean, False, True),
        (-128, ua.VariantType.SByte, False, -128),
        (2.0, ua.VariantType.Int32, False, 2),
        (7, ua.VariantType.Double, False, 7.0),
        ("x", ua.VariantType.String, False, "x"),
        (
            "2024-01-02T03:04:05.678Z",
            ua.VariantType.DateTime,
            False,
            datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        ),
        ("AAH+/w==", ua.VariantType.ByteString, False, b"\x00\x01\xfe\xff"),
        ("ns=2;s=Foo", ua.VariantType.NodeId, False, ua.NodeId("Foo", 2)),
        ("3:Name", ua.VariantType.QualifiedName, False, ua.QualifiedName("Name", 3)),
        (
            {"locale": "de", "text": "Hallo"},
            ua.VariantType.LocalizedText,
            False,
            ua.LocalizedText("Hallo", "de"),
        ),
        (
            "BadOutOfRange",
            ua.VariantType.StatusCode,
            False,
            ua.StatusCode(ua.StatusCodes.BadOutOfRange),
        ),
        ([1, 2], ua.VariantType.Int16, True, [1, 2]),
    ],
)
def test_from_json(value: Any, vtype: ua.VariantType, array: bool, expected: Any) -> None:
    variant = from_json(value, vtype, array)
    assert (variant.Value, variant.VariantType, bool(variant.is_array)) == (expected, vtype, array)


@pytest.mark.parametrize(
    ("value", "vtype", "array", "message"),
    [
        (1, ua.VariantType.Boolean, False, "Boolean wants true or false"),
        (True, ua.VariantType.Int32, False, "Int32 wants an integer"),
        (1.5, ua.VariantType.Int32, False, "Int32 wants an integer"),
        (256, ua.VariantType.Byte, False, "out of range for Byte"),
        (-1, ua.VariantType.UInt64, False, "out of range for UInt64"),
        (2**63, ua.VariantType.Int64, False, "out of range for Int64"),
        (1e39, ua.VariantType.Float, False, "out of range for Float"),
        ("abc", ua.VariantType.Double, False, "Double wants a number"),
        (3, ua.VariantType.String, False, "String wants a string"),
        ("yesterday", ua.VariantType.DateTime, False, "not a valid DateTime"),
        ("2024-01-02T03:04:05", ua.VariantType.DateTime, False, "UTC offset"),
        ("no-guid", ua.VariantType.Guid, False, "not a valid Guid"),
        ("%%", ua.VariantType.ByteString, False, "not a valid ByteString"),
        ("Name", ua.VariantType.QualifiedName, False, "not a valid QualifiedName"),
        ("NoSuchCode", ua.VariantType.StatusCode, False, "not a valid StatusCode"),
        (5, ua.VariantType.Int32, True, "write a JSON array"),
        ([5], ua.VariantType.Int32, False, "not an array"),
        ([1, 99999], ua.VariantType.Int16, True, "out of range for Int16"),
    ],
)
def test_from_json_refuses_what_does_not_fit(
    value: Any, vtype: ua.VariantType, array: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        from_json(value, vtype, array)


@pytest.mark.parametrize(
    "text",
    ["ns=0;i=2258", "ns=2;s=A;b=c", "ns=1;g=72962b91-fa75-4ae6-8d28-b404dc7daf63", "ns=1;b=YWI="],
)
def test_stable_ids_round_trip(text: str) -> None:
    assert stable_id(node_id(text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "i=5",
        "ns=x;i=5",
        "ns=1;q=5",
        "ns=1;i=-1",
        "ns=1;i=4294967296",
        "ns=70000;i=1",
        "ns=1;s=",
        "ns=1;g=xyz",
        "ns=1;b=@@",
    ],
)
def test_malformed_stable_ids_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="ns="):
        parse_stable_id(text)


def test_status_names_and_type_names() -> None:
    assert status_name(ua.StatusCode(ua.StatusCodes.BadUserAccessDenied)) == "BadUserAccessDenied"
    assert status_name(None) == "Good"
    last_usable = ua.StatusCodes.UncertainLastUsableValue
    assert status_name(last_usable | 0x0400) == "UncertainLastUsableValue"
    assert status_name(0x81FF0000) == "0x81FF0000"
    assert type_name(ua.NodeId(11, 0), -1) == "Double"
    assert type_name(ua.NodeId(6, 0), 1) == "Int32[]"
    assert type_name(ua.NodeId(884, 0)) == "Range"
    assert type_name(ua.NodeId(3001, 2)) == "ns=2;i=3001"


NODES = [
    BrowsedNode(2, "s", "Counter", "Counter", "Counter"),
    BrowsedNode(2, "s", "Counter2", "Counter2", "Counter2"),
    BrowsedNode(2, "i", "1001", "NumericId", "Numeric display"),
    BrowsedNode(3, "s", "Counter", "Counter", "Counter"),
]


def test_matching_is_fullmatch_on_identifier_browse_or_display_name() -> None:
    resolved = {"$.i": 2, "$.e": 2}
    spec = subscription(matcher("Counter|NumericId", path="$.i"))
    assert [s.node.stable_id for s in select(spec, NODES, resolved)] == [
        "ns=2;s=Counter",
        "ns=2;i=1001",
    ]
    spec = subscription(matcher("Numeric display", path="$.i"))
    assert [s.node.stable_id for s in select(spec, NODES, resolved)] == ["ns=2;i=1001"]


def test_exclude_matches_the_identifier_only_and_in_its_namespace() -> None:
    include = matcher("Counter.*|NumericId", path="$.i")
    resolved = {"$.i": 2, "$.e": 2}
    by_browse_name = subscription(include, exclude=[matcher("NumericId", path="$.e")])
    assert "ns=2;i=1001" in {s.node.stable_id for s in select(by_browse_name, NODES, resolved)}
    by_id = subscription(include, exclude=[matcher("1001|Counter2", path="$.e")])
    assert {s.node.stable_id for s in select(by_id, NODES, resolved)} == {"ns=2;s=Counter"}
    other_namespace = subscription(include, exclude=[matcher("Counter2", path="$.e")])
    assert "ns=2;s=Counter2" in {
        s.node.stable_id for s in select(other_namespace, NODES, {"$.i": 2, "$.e": 3})
    }


def test_the_first_include_matcher_gives_the_settings() -> None:
    first = matcher("Counter", path="$.i0", sampling_rate_ms=50)
    second = matcher(".*", path="$.i1", sampling_rate_ms=500)
    chosen = select(subscription(first, second), NODES[:2], {"$.i0": 2, "$.i1": 2})
    assert [(s.node.identifier, s.matcher.sampling_rate_ms) for s in chosen] == [
        ("Counter", 50),
        ("Counter2", 500),
    ]


def test_namespace_resolution(caplog: pytest.LogCaptureFixture) -> None:
    spec = subscription(
        matcher("a", uri="urn:b", path="$.i0"),
        matcher("a", uri=None, namespace=7, path="$.i1"),
        matcher("a", uri="urn:gone", path="$.i2"),
    )
    with caplog.at_level(logging.WARNING):
        resolved = resolve_namespaces([spec], ["http://opcfoundation.org/UA/", "urn:a", "urn:b"])
    assert resolved == {"$.i0": 2, "$.i1": 7, "$.i2": None}
    assert [r.getMessage() for r in caplog.records if "$.i2" in r.getMessage()]
    assert re.search(r"urn:gone", caplog.text)


def tree(width: int, depth: int) -> dict[str, list[Child]]:
    """A folder tree in namespace 2: every folder holds `width` variables and folders."""
    children: dict[str, list[Child]] = {}

    def folder(name: str, level: int) -> None:
        kids = []
        for n in range(width):
            var = f"{name}.v{n}"
            kids.append(Child(var, BrowsedNode(2, "s", var, var, var), variable=True))
            kids.append(
                Child(
                    f"{var}.EURange",
                    BrowsedNode(2, "i", "9", "EURange", "EURange"),
                    variable=True,
                    property=True,
                )
            )
            if level < depth:
                sub = f"{name}.f{n}"
                kids.append(Child(sub, BrowsedNode(2, "s", sub, sub, sub), variable=False))
                folder(sub, level + 1)
        children[name] = kids

    folder("root", 1)
    return children


def browse_of(children: dict[str, list[Child]], calls: list[int]) -> Any:
    async def browse(nodes: list[Any]) -> list[Child]:
        calls.append(len(nodes))
        return [c for n in nodes for c in children.get(n, [])]

    return browse


def test_the_walk_finds_variables_and_leaves_properties_out() -> None:
    children = tree(3, 2)
    calls: list[int] = []
    found, visited = asyncio.run(walk(browse_of(children, calls), "root", {2}, label="t"))
    assert set(found) == {
        f"ns=2;s={c.address}" for k in children.values() for c in k if c.variable and not c.property
    }
    assert visited == 3 + 3 + 3 * 3  # variables and folders of the root, variables below
    assert max(calls) <= 100


def test_the_walk_stops_at_its_budget_and_logs_progress(caplog: pytest.LogCaptureFixture) -> None:
    children = tree(20, 3)  # 20 + 20 + 400 + 400 + 8000 nodes
    with caplog.at_level(logging.INFO, logger="unskit.opcua.matchers"):
        found, visited = asyncio.run(
            walk(browse_of(children, []), "root", {2}, label="plc1", budget=1000, progress=300)
        )
    assert visited == 1000
    assert len(found) < 1000
    progress = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [m.split(",")[0] for m in progress] == [
        "plc1: browsed 300 nodes",
        "plc1: browsed 600 nodes",
        "plc1: browsed 900 nodes",
    ]
    assert any(
        "budget of 1000 nodes" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )


def test_the_walk_skips_namespace_0_unless_wanted() -> None:
    children = {
        "root": [
            Child("server", BrowsedNode(0, "i", "2253", "Server", "Server"), variable=False),
            Child("plant", BrowsedNode(2, "s", "plant", "plant", "plant"), variable=False),
        ],
        "server": [Child("state", BrowsedNode(0, "i", "2259", "State", "State"), variable=True)],
        "plant": [Child("t", BrowsedNode(2, "s", "t", "t", "t"), variable=True)],
    }
    found, _ = asyncio.run(walk(browse_of(children, []), "root", {2}, label="t"))
    assert set(found) == {"ns=2;s=t"}
    found, _ = asyncio.run(walk(browse_of(children, []), "root", {0, 2}, label="t"))
    assert set(found) == {"ns=2;s=t", "ns=0;i=2259"}


def test_a_failed_item_is_retried_after_5_s_doubling_to_60_s() -> None:
    item = MonitoredNode(SignalSpec("ns=2;s=a", "a", "Double"), "a", "s1", matcher("a"), 1)
    assert item.due(0.0)
    assert item.failed("BadNodeIdUnknown", 100.0) == (True, None)
    delays = []
    now = 100.0
    for _ in range(6):
        assert not item.due(item.retry_at - 0.001)
        assert item.due(item.retry_at)
        delays.append(item.retry_at - now)
        now = item.retry_at
        assert item.failed("BadNodeIdUnknown", now) == (False, None)
    assert delays == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    item.created(77)
    assert (item.status, item.monitored, item.due(now + 1000)) == ("Good", 77, False)
    assert item.failed("BadNodeIdUnknown", now) == (True, 77)
    assert item.retry_at == now + 5.0
