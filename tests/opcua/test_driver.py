"""The OPC UA driver against the asyncua simulator (a real server in a subprocess): value
mapping, namespace resolution, matching, deadbands, per-node recovery, session loss,
writes, security and browsing."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.opcua import (
    SIM,
    CollectingSink,
    OpcUaSim,
    call_sim_method,
    good,
    instance,
    matcher,
    pump,
    subscription,
)
from unskit.errors import DeviceError
from unskit.opcua.adapter import OpcUaDriver
from unskit.opcua.config import (
    DataChangeDeadband,
    OpcUaConnection,
    UserToken,
)
from unskit.runtime.metrics import MetricsRegistry
from unskit.southbound.driver import PollGroupSpec, PublishMode, Quality, SignalSpec

pytestmark = pytest.mark.integration

#: The sim's namespace index when started with --namespaces urn:a,urn:unskit:sim.
NS = 3
GUID_ID = "0d4f1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"

#: Every built-in type of the sim's Line1 folder, and its JSON value.
EXPECTED: dict[str, Any] = {
    "Boolean": True,
    "SByte": -5,
    "Byte": 200,
    "Int16": -30000,
    "UInt16": 60000,
    "Int32": -2000000000,
    "UInt32": 4000000000,
    "Int64": -9000000000000000000,
    "UInt64": 18000000000000000000,
    "Float": 1.5,
    "Double": 3.25,
    "String": "héllo",
    "DateTime": "2024-01-02T03:04:05.678Z",
    "Guid": "72962b91-fa75-4ae6-8d28-b404dc7daf63",
    "ByteString": "AAH+/w==",
    "XmlElement": "<a>1</a>",
    "NodeId": "ns=0;i=2258",
    "QualifiedName": "1:Name",
    "LocalizedText": {"locale": "de", "text": "Hallo"},
    "StatusCode": "BadOutOfRange",
    "Range": {"Low": -1.5, "High": 99.5},
    "Opaque": {"typeId": f"ns={NS};i=5001", "encoding": "binary", "body": "AQID"},
    "Int32Array": [1, -2, 3],
    "DoubleArray": [0.5, 1.5],
    "StringArray": ["a", "b"],
}


def sid(name: str) -> str:
    return f"ns={NS};s={name}"


@pytest.fixture(scope="module")
def values(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[OpcUaDriver, dict[str, Any]]]:
    """One sim and one driver subscribed to every value of Line1: first reading by name."""
    sim = OpcUaSim(tmp_path_factory.mktemp("sim"), ("--namespaces", f"urn:a,{SIM}")).start()
    driver = OpcUaDriver(instance(sim.endpoint, [subscription(matcher("|".join(EXPECTED)))]))
    try:
        driver.connect(10)
        sink = CollectingSink()
        driver.subscribe(sink)
        sink.wait_for(lambda: all(good(sink, sid(name)) for name in EXPECTED), 20, "every value")
        yield driver, {name: good(sink, sid(name))[0].value for name in EXPECTED}
    finally:
        driver.close()
        sim.stop()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_builtin_type_maps_to_json(
    values: tuple[OpcUaDriver, dict[str, Any]], name: str
) -> None:
    assert values[1][name] == EXPECTED[name]


@pytest.mark.parametrize(
    ("name", "type_name"),
    [("Double", "Double"), ("Int32Array", "Int32[]"), ("Range", "Range"), ("DateTime", "DateTime")],
)
def test_signals_carry_the_data_type_and_identifier(
    values: tuple[OpcUaDriver, dict[str, Any]], name: str, type_name: str
) -> None:
    signal = {s.id: s for s in values[0].signals()}[sid(name)]
    assert (signal.name, signal.type, signal.publish_mode) == (name, type_name, PublishMode.ALWAYS)


def test_readings_carry_source_and_server_timestamps(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    driver = make_driver(instance(sim.endpoint, [subscription(matcher("Counter"))]))
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    sink.wait_for(lambda: len(good(sink, sid("Counter"))) >= 3, 10, "three counter values")
    first, second = good(sink, sid("Counter"))[1:3]
    assert second.value == first.value + 1
    assert 0 < first.source_timestamp_ms < second.source_timestamp_ms
    assert first.server_timestamp_ms > 0


@pytest.mark.slow
def test_namespace_uris_are_resolved_at_every_connect(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    driver = make_driver(instance(sim.endpoint, [subscription(matcher("Counter"))]))
    driver.connect(10)
    driver.subscribe(CollectingSink())
    assert [s.id for s in driver.signals()] == ["ns=3;s=Counter"]
    driver.close()
    sim.stop()
    sim.start(("--namespaces", f"{SIM},urn:a"))
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    assert [s.id for s in driver.signals()] == ["ns=2;s=Counter"]
    sink.wait_for(lambda: len(good(sink, "ns=2;s=Counter")) >= 2, 10, "counter values")


def test_a_namespace_uri_absent_skips_its_matcher_with_a_warning(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    absent = matcher(
        ".*", uri="urn:nowhere", path="$.component.instances[0].subscriptions[0].include[1]"
    )
    driver = make_driver(instance(sim.endpoint, [subscription(matcher("Counter"), absent)]))
    driver.connect(10)
    with caplog.at_level(logging.WARNING, logger="unskit.opcua"):
        driver.subscribe(CollectingSink())
    assert [s.id for s in driver.signals()] == [sid("Counter")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("include[1]" in w and "urn:nowhere" in w for w in warnings), warnings


def test_a_literal_namespace_index_is_used_without_a_uri(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    driver = make_driver(
        instance(sim.endpoint, [subscription(matcher("Counter", uri=None, namespace=NS))])
    )
    driver.connect(10)
    driver.subscribe(CollectingSink())
    assert [s.id for s in driver.signals()] == [sid("Counter")]


@pytest.mark.parametrize(
    ("include", "exclude", "present", "absent"),
    [
        # fullmatch: "Count" does not take Counter
        ("Count", None, [], ["Counter"]),
        ("Count.*", None, ["Counter"], []),
        (".*Int.*", "U.*", ["Int16", "Int32", "Int64", "Int32Array"], ["UInt16", "UInt64"]),
        # exclude matches the identifier only: not the browse name "GuidId"
        ("GuidId|Double", "GuidId", [f"g={GUID_ID}", "Double"], []),
        ("GuidId|Double", "0d4f.*", ["Double"], [f"g={GUID_ID}"]),
        # include matches the browse name of numeric and opaque ids too
        ("NumericId|OpaqueId", None, ["i=1001", "b=ECBvcGFxdWU="], []),
    ],
)
def test_include_and_exclude_matchers(
    opcua_server: Callable[..., OpcUaSim],
    make_driver: Any,
    include: str,
    exclude: str | None,
    present: list[str],
    absent: list[str],
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    excludes = [matcher(exclude, path="$.exclude[0]")] if exclude else []
    spec = instance(sim.endpoint, [subscription(matcher(include), exclude=excludes)])
    driver = make_driver(spec)
    driver.connect(10)
    driver.subscribe(CollectingSink())
    ids = {s.id for s in driver.signals()}

    def full(name: str) -> str:
        return f"ns={NS};{name}" if re.match(r"[isgb]=", name) else sid(name)

    for name in present:
        assert full(name) in ids, ids
    for name in absent:
        assert full(name) not in ids, ids


def test_absolute_deadband_is_applied_by_the_server(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    band = DataChangeDeadband("Absolute", 1.0)
    driver = make_driver(instance(sim.endpoint, [subscription(matcher("Setpoint", deadband=band))]))
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    sink.wait_for(lambda: good(sink, sid("Setpoint")), 10, "the initial value")
    setpoint = driver.signal_for(sid("Setpoint"))
    driver.write(setpoint, 10.5)  # 0.5 from 10: inside the deadband
    driver.write(setpoint, 15.0)
    sink.wait_for(lambda: any(r.value == 15.0 for r in sink.of(sid("Setpoint"))), 10, "15.0")
    assert [r.value for r in good(sink, sid("Setpoint"))] == [10.0, 15.0]


def test_percent_deadband_uses_the_eurange_and_a_node_without_one_fails_alone(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    band = DataChangeDeadband("Percent", 10.0)  # Level's EURange is 0..200: 20
    driver = make_driver(
        instance(sim.endpoint, [subscription(matcher("Level|Double", deadband=band))])
    )
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    sink.wait_for(lambda: good(sink, sid("Level")), 10, "the initial value")
    level = driver.signal_for(sid("Level"))
    driver.write(level, 65.0)  # 15 from 50: beyond 10 absolute, inside 10 % of 200
    driver.write(level, 100.0)
    sink.wait_for(lambda: any(r.value == 100.0 for r in sink.of(sid("Level"))), 10, "100.0")
    assert [r.value for r in good(sink, sid("Level"))] == [50.0, 100.0]
    double = sink.of(sid("Double"))
    assert [(r.quality, r.detail, r.value) for r in double] == [
        (Quality.BAD, "BadDeadbandFilterInvalid", None)
    ]
    status = driver.describe()["subscriptions"][0]
    assert (status["items"], status["failedItems"]) == (2, 1)


def test_a_deleted_node_goes_bad_alone_and_recovers_when_re_added(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    metrics = MetricsRegistry()
    driver = make_driver(
        instance(sim.endpoint, [subscription(matcher("Counter|Temperature"))]), metrics=metrics
    )
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    sink.wait_for(lambda: len(good(sink, sid("Counter"))) >= 2, 10, "counter values")
    call_sim_method(sim.endpoint, "RemoveNode", "Counter")
    pump(
        driver,
        sink,
        lambda: any(r.detail == "BadNodeIdUnknown" for r in sink.of(sid("Counter"))),
        15,
        "Counter to go bad",
    )
    assert sid("Counter") in {s.id for s in driver.signals()}
    temperatures = len(good(sink, sid("Temperature")))
    sink.wait_for(lambda: len(good(sink, sid("Temperature"))) > temperatures + 2, 10, "temperature")
    assert all(r.quality is Quality.GOOD for r in sink.of(sid("Temperature")))
    bad_at = len(sink.of(sid("Counter")))
    call_sim_method(sim.endpoint, "RestoreNode", "Counter")
    pump(
        driver,
        sink,
        lambda: (
            len([r for r in sink.of(sid("Counter"))[bad_at:] if r.quality is Quality.GOOD]) >= 2
        ),
        20,
        "Counter to recover",
    )
    counters = {s.name: s.total for s in metrics.collect(reset_interval=False)}
    assert counters["itemsFailed"] == 1
    assert counters["itemsCreated"] >= 3


def test_a_model_change_event_re_runs_the_matching(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    call_sim_method(sim.endpoint, "RemoveNode", "Setpoint")
    driver = make_driver(instance(sim.endpoint, [subscription(matcher("Setpoint|Counter"))]))
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    assert [s.id for s in driver.signals()] == [sid("Counter")]
    call_sim_method(sim.endpoint, "RestoreNode", "Setpoint")
    # Never an item, so no retry timer: only the event can bring it in.
    pump(driver, sink, lambda: bool(good(sink, sid("Setpoint"))), 15, "Setpoint to appear")
    assert {s.id for s in driver.signals()} == {sid("Counter"), sid("Setpoint")}
    assert sink.changes >= 1
    assert good(sink, sid("Setpoint"))[0].value == 10.0


def test_unskit_opcua_sim_serves_the_default_path(tmp_path: Path, make_driver: Any) -> None:
    sim = OpcUaSim(tmp_path, command=("-m", "unskit.cli", "opcua-sim")).start()
    try:
        assert sim.endpoint.endswith("/unskit/")
        driver = make_driver(instance(sim.endpoint))
        driver.connect(10)
        assert driver.describe()["namespaces"]["2"] == SIM
    finally:
        sim.stop()


@pytest.mark.slow
def test_a_server_restart_is_reported_lost_and_a_new_session_delivers_again(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    metrics = MetricsRegistry()
    driver = make_driver(
        instance(sim.endpoint, [subscription(matcher("Counter"))]), metrics=metrics
    )
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    sink.wait_for(lambda: good(sink, sid("Counter")), 10, "a counter value")
    sim.stop()
    sink.wait_for(lambda: bool(sink.lost_errors), 15, "the session loss")
    assert sink.lost_errors[0].connection_lost
    with pytest.raises(DeviceError):
        driver.maintain()
    driver.close()
    sim.start()
    driver.connect(10)
    again = CollectingSink()
    driver.subscribe(again)
    again.wait_for(
        lambda: len(good(again, sid("Counter"))) >= 2, 10, "counter values after the restart"
    )
    counters = {s.name: s.total for s in metrics.collect(reset_interval=False)}
    assert (counters["connects"], counters["sessionLosses"]) == (2, 1)
    assert counters["notifications"] >= len(good(sink, sid("Counter"))) + 2
    families = {(s.family, s.dimensions["instance"]) for s in metrics.collect(reset_interval=False)}
    assert families >= {
        ("OpcUaConnection", "plc1"),
        ("OpcUaSubscription", "plc1"),
        ("OpcUaBrowse", "plc1"),
    }


def test_write_read_round_trip_and_refusals(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    metrics = MetricsRegistry()
    driver = make_driver(instance(sim.endpoint), metrics=metrics)
    driver.connect(10)
    driver.write(driver.signal_for(sid("Setpoint")), 42.5)
    driver.write(driver.signal_for(sid("Mode")), 7)
    group = PollGroupSpec(
        "read",
        0,
        [
            driver.signal_for(sid("Setpoint")),
            driver.signal_for(sid("Mode")),
            SignalSpec("ns=3;s=Nope", "Nope", "x"),
        ],
    )
    readings = driver.read(group)
    assert [(r.value, r.quality) for r in readings[:2]] == [(42.5, Quality.GOOD), (7, Quality.GOOD)]
    assert (readings[2].quality, readings[2].detail) == (Quality.BAD, "BadNodeIdUnknown")
    with pytest.raises(ValueError, match="Double wants a number"):
        driver.write(driver.signal_for(sid("Setpoint")), "abc")
    with pytest.raises(ValueError, match="out of range for Int16"):
        driver.write(driver.signal_for(sid("Mode")), 40000)
    with pytest.raises(DeviceError, match="BadUserAccessDenied") as refused:
        driver.write(driver.signal_for(sid("Double")), 1.0)
    assert refused.value.code == "BadUserAccessDenied"
    assert driver.read(PollGroupSpec("r", 0, [driver.signal_for(sid("Double"))]))[0].value == 3.25
    counters = {
        s.name: s.total for s in metrics.collect(reset_interval=False) if s.family == "OpcUaCommand"
    }
    assert counters == {"writes": 2, "writeErrors": 3, "reads": 2}


def test_signal_for_parses_every_id_kind_and_refuses_malformed_ones(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    driver = make_driver(instance(sim.endpoint))
    driver.connect(10)
    ids = [f"ns={NS};i=1001", f"ns={NS};g={GUID_ID}", f"ns={NS};b=ECBvcGFxdWU=", sid("Double")]
    readings = driver.read(PollGroupSpec("r", 0, [driver.signal_for(i) for i in ids]))
    assert [r.value for r in readings] == [1001, 2.5, "bytes", 3.25]
    for bad in ("ns=3;x=1", "s=Foo", "ns=3;i=abc", "ns=3;g=nope", "ns=3;b=%%%"):
        with pytest.raises(ValueError, match="ns="):
            driver.signal_for(bad)
    driver.probe()


def test_a_wrong_password_is_a_clear_connect_error(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--users", "alice:secret", "--no-anonymous")
    wrong = OpcUaConnection(endpoint=sim.endpoint, user=UserToken("alice", "guess"))
    driver = make_driver(instance(sim.endpoint, connection=wrong))
    with pytest.raises(DeviceError, match="BadUserAccessDenied") as refused:
        driver.connect(10)
    assert refused.value.code == "BadUserAccessDenied"
    assert "guess" not in str(refused.value)
    right = OpcUaConnection(endpoint=sim.endpoint, user=UserToken("alice", "secret"))
    driver = make_driver(
        instance(sim.endpoint, [subscription(matcher("Counter"))], connection=right)
    )
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    sink.wait_for(lambda: good(sink, "ns=2;s=Counter"), 10, "a counter value")
    assert driver.describe()["security"]["user"] == "alice"


def test_browse_pages_a_nodes_children(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any
) -> None:
    sim = opcua_server("--namespaces", f"urn:a,{SIM}")
    metrics = MetricsRegistry()
    driver = make_driver(instance(sim.endpoint), metrics=metrics)
    driver.connect(10)
    top = driver.browse(None, 100)
    assert f"ns={NS};s=Line1" in [n["nodeId"] for n in top["nodes"]]
    pages, continuation = [], None
    while True:
        page = driver.browse(sid("Line1"), 10, continuation)
        pages.append(page["nodes"])
        continuation = page["continuation"]
        if continuation is None:
            break
    assert all(len(p) == 10 for p in pages[:-1])
    assert 0 < len(pages[-1]) <= 10
    nodes = [n for p in pages for n in p]
    by_id = {n["nodeId"]: n for n in nodes}
    assert len(by_id) == len(nodes) > 30
    assert by_id[sid("Double")] == {
        "nodeId": sid("Double"),
        "browseName": f"{NS}:Double",
        "displayName": "Double",
        "nodeClass": "Variable",
        "dataType": "Double",
    }
    assert by_id[sid("RemoveNode")]["nodeClass"] == "Method"
    with pytest.raises(ValueError, match="maxNodes"):
        driver.browse(sid("Line1"), 0)
    with pytest.raises(ValueError, match="continuation"):
        driver.browse(sid("Line1"), 10, "not-ours")
    counters = {s.name: s.total for s in metrics.collect(reset_interval=False)}
    assert counters["browses"] == 1 + len(pages)


def test_close_stops_the_loop_thread_and_can_reconnect(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any, tmp_path: Path
) -> None:
    import threading

    sim = opcua_server()
    driver = make_driver(instance(sim.endpoint))
    driver.connect(10)
    thread = driver._thread
    assert thread is not None
    assert thread in threading.enumerate()
    driver.close()
    assert not thread.is_alive()
    driver.connect(10)
    driver.probe()
    driver.close()
    driver.close()
