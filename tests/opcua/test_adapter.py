"""`opcua-adapter` end to end: the component in-process on a real Mosquitto against the
asyncua sim (a subprocess): publication on the data class, the verbs, reload, recovery after a
server restart, the unreachable alarm and the metric families."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.adapter import Adapter
from tests.support.mosquitto import Mosquitto
from tests.support.opcua import FAST_TIMING, opcua_instance
from tests.support.servers import free_port, wait_until
from unskit.errors import CommandError

pytestmark = pytest.mark.integration


def updates(adapter: Adapter, channel: str, instance: str = "line-1") -> list:
    return adapter.seen.on(adapter.data_topic(instance, channel))


def values(adapter: Adapter, channel: str, instance: str = "line-1") -> list:
    return [s["value"] for m in updates(adapter, channel, instance) for s in m.body["samples"]]


def test_changes_are_published_on_the_data_class(start_opcua, opcua_server) -> None:
    sim = opcua_server()
    adapter = start_opcua([opcua_instance(sim.endpoint)])
    wait_until(lambda: len(values(adapter, "Counter")) >= 5, 20, "Counter changes")
    message = updates(adapter, "Counter")[-1]
    assert message.header.name == "SouthboundSignalUpdate"
    assert message.identity is not None
    assert message.identity.instance == "line-1"
    assert message.body["signal"]["id"] == "ns=2;s=Counter"
    sample = message.body["samples"][-1]
    assert sample["quality"] == "GOOD"
    assert isinstance(sample["value"], int)
    assert sample["source_timestamp_ms"] > 0
    assert sample["server_timestamp_ms"] > 0
    counts = values(adapter, "Counter")
    assert counts == sorted(counts), "in the order the server sent them"


def test_status_signals_read_browse_and_metrics(start_opcua, opcua_server) -> None:
    sim = opcua_server()
    adapter = start_opcua([opcua_instance(sim.endpoint)])
    wait_until(lambda: len(values(adapter, "Temperature")) >= 2, 20, "Temperature")
    status = adapter.client.call("status", instance="line-1")
    assert status["connected"] is True
    device = status["device"]
    assert device["endpoint"] == sim.endpoint
    assert device["securityPolicy"] == "None"
    (subscription,) = device["subscriptions"]
    assert subscription["id"] == "fast"
    assert (subscription["items"], subscription["failedItems"]) == (3, 0)
    signals = adapter.client.call("signals", instance="line-1")
    assert {s["id"] for s in signals["items"]} == {
        "ns=2;s=Counter",
        "ns=2;s=Temperature",
        "ns=2;s=Setpoint",
    }
    read = adapter.client.call("read", {"signals": ["ns=2;s=Setpoint", "ns=0;i=2259"]}, "line-1")
    by_id = {r["id"]: r for r in read["readings"]}
    assert by_id["ns=2;s=Setpoint"]["quality"] == "GOOD"
    assert isinstance(by_id["ns=0;i=2259"]["value"], int), "ServerStatus.State, unsubscribed"
    page = adapter.client.call("browse", {"node": "ns=2;s=Line1", "limit": 5}, "line-1")
    assert len(page["items"]) == 5
    assert page["nextCursor"] is not None
    assert {"nodeId", "browseName", "displayName", "nodeClass"} <= set(page["items"][0])
    families = {sample.family for sample in adapter.runtime.metrics.collect(reset_interval=False)}
    assert {"southbound_health", "OpcUaConnection", "OpcUaSubscription"} <= families


def test_writes_follow_the_allow_list(start_opcua, opcua_server) -> None:
    sim = opcua_server()
    adapter = start_opcua([opcua_instance(sim.endpoint, writes={"allow": ["ns=2;s=Setpoint"]})])
    rejected = adapter.runtime.topics.topic("evt", "warning", "write-rejected", instance="line-1")
    wait_until(lambda: adapter.client.call("status", instance="line-1")["connected"], 20, "up")
    reply = adapter.client.call(
        "write", {"requestId": "w1", "signal": "ns=2;s=Setpoint", "value": 42.5}, "line-1"
    )
    assert reply["written"] == 42.5
    wait_until(lambda: 42.5 in values(adapter, "Setpoint"), 20, "the written value published")
    with pytest.raises(CommandError) as refused:
        adapter.client.call(
            "write", {"requestId": "w2", "signal": "ns=2;s=Counter", "value": 1}, "line-1"
        )
    assert refused.value.code == "BAD_ARGS"
    wait_until(lambda: len(adapter.seen.on(rejected)) == 1, 10, "write-rejected")
    with pytest.raises(CommandError) as wrong_type:
        adapter.client.call(
            "write", {"requestId": "w3", "signal": "ns=2;s=Setpoint", "value": "hot"}, "line-1"
        )
    assert wrong_type.value.code == "BAD_ARGS"


@pytest.mark.slow
def test_a_server_restart_is_recovered_without_restarting_the_component(
    start_opcua, opcua_server
) -> None:
    sim = opcua_server()
    adapter = start_opcua([opcua_instance(sim.endpoint)])
    alarm = adapter.runtime.topics.topic("evt", "error", "device-unreachable", instance="line-1")
    wait_until(lambda: len(values(adapter, "Counter")) >= 3, 20, "Counter")
    sim.stop()
    wait_until(lambda: len(adapter.seen.on(alarm)) == 1, 20, "the unreachable alarm")
    assert adapter.client.call("status", instance="line-1")["connected"] is False
    before = len(values(adapter, "Counter"))
    sim.start()
    wait_until(lambda: len(adapter.seen.on(alarm)) == 2, 30, "the alarm cleared")
    assert adapter.seen.on(alarm)[1].body["state"] == "cleared"
    wait_until(lambda: len(values(adapter, "Counter")) >= before + 3, 20, "Counter again")
    status = adapter.client.call("status", instance="line-1")
    assert status["counters"]["reconnects"] >= 1


def test_an_unreachable_server_never_stops_the_other_instance(start_opcua, opcua_server) -> None:
    sim = opcua_server()
    dead = f"opc.tcp://127.0.0.1:{free_port()}/unskit/"
    adapter = start_opcua([opcua_instance(sim.endpoint), opcua_instance(dead, id="line-2")])
    wait_until(lambda: len(values(adapter, "Counter")) >= 3, 20, "the live instance")
    status = adapter.client.call("status", instance="line-2")
    assert status["connected"] is False
    assert status["lastError"]
    with pytest.raises(CommandError) as refused:
        adapter.client.call("read", {"signals": ["ns=2;s=Counter"]}, "line-2")
    assert refused.value.code == "DEVICE_UNAVAILABLE"


def test_reload_restarts_only_the_changed_instance(start_opcua, opcua_server) -> None:
    sim = opcua_server()
    adapter = start_opcua(
        [opcua_instance(sim.endpoint), opcua_instance(sim.endpoint, "Counter", id="line-2")]
    )
    wait_until(lambda: len(values(adapter, "Counter", "line-2")) >= 2, 20, "line-2")
    adapter.client.call("pause", instance="line-1")
    document = copy.deepcopy(adapter.document)
    document["component"]["instances"][1]["subscriptions"][0]["include"][0]["match"] = "Setpoint"
    outcome = adapter.reload(document)
    assert outcome["started"] == ["line-2"]
    assert outcome["kept"] == ["line-1"]
    assert adapter.client.call("status", instance="line-1")["paused"] is True
    wait_until(
        lambda: (
            {s["id"] for s in adapter.client.call("signals", instance="line-2")["items"]}
            == {"ns=2;s=Setpoint"}
        ),
        20,
        "line-2 re-matched",
    )


@pytest.mark.slow
def test_the_example_runs_as_shipped(broker: Mosquitto, opcua_server, tmp_path: Path) -> None:
    """examples/opcua-adapter.json with only the port and broker changed, under `unskit run`."""
    sim = opcua_server()
    example = json.loads(Path("examples/opcua-adapter.json").read_text())
    example["component"]["instances"][0]["connection"]["endpoint"] = sim.endpoint
    example.pop("health", None)
    config = tmp_path / "opcua-adapter.json"
    config.write_text(json.dumps(example))
    command = [sys.executable, "-m", "unskit.cli", "run", "opcua-adapter", "-c", str(config)]
    command += ["-t", "gw", "--broker", f"127.0.0.1:{broker.plain_port}"]
    watcher = subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.plain_port), "-t", "#", "-v", "-W", "60"],
        stdout=subprocess.PIPE,
        errors="replace",
    )
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert watcher.stdout is not None
        # mosquitto_sub ends by itself after 60 s (-W), so this loop is bounded.
        seen = next((line for line in watcher.stdout if "/opcua-adapter/line1/data/" in line), "")
        assert seen, "no signal update from the example within 60 s"
        process.terminate()
        assert process.wait(30) == 0
    finally:
        for child in (watcher, process):
            child.kill()
            child.wait()
        if watcher.stdout is not None:
            watcher.stdout.close()


class _HostileServer:
    """A TCP listener on loopback that accepts and then either closes the connection at once
    or says nothing at all: an OPC UA server that drops the channel, or one that hangs."""

    def __init__(self, *, silent: bool) -> None:
        self.silent = silent
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"opc.tcp://127.0.0.1:{self._listener.getsockname()[1]}/unskit/"

    def _serve(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.silent:
                self._held.append(connection)
            else:
                connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.mark.parametrize("silent", [False, True], ids=["closes-the-channel", "never-answers"])
def test_a_broken_server_never_stops_the_other_instance(
    start_opcua, opcua_server, silent: bool
) -> None:
    sim = opcua_server()
    hostile = _HostileServer(silent=silent)
    try:
        adapter = start_opcua(
            [opcua_instance(hostile.endpoint, id="line-2"), opcua_instance(sim.endpoint)],
            timing={**FAST_TIMING, "connectMs": 1000},
        )
        wait_until(lambda: hostile.accepted >= 2, 30, "the instance retrying")
        wait_until(lambda: len(values(adapter, "Counter")) >= 5, 20, "the other instance")
        status = adapter.client.call("status", instance="line-2")
        assert status["connected"] is False
        assert status["lastError"]
        assert status["state"] in ("backoff", "connecting")
        failures = [
            sample
            for sample in adapter.runtime.metrics.collect(reset_interval=False)
            if sample.family == "OpcUaConnection"
            and sample.name == "connectFailures"
            and sample.dimensions == {"instance": "line-2"}
        ]
        assert failures
        assert failures[0].total is not None
        assert failures[0].total >= 1
    finally:
        hostile.close()


def test_a_uint64_above_int64_is_published_exactly_and_the_instance_goes_on(
    start_opcua, opcua_server
) -> None:
    """The sim's UInt64 node holds 18,000,000,000,000,000,000 (above 2**63-1): it stopped the
    instance's thread before the envelope had uint_value."""
    sim = opcua_server()
    adapter = start_opcua([opcua_instance(sim.endpoint, match="^(UInt64|Int64|Counter)$")])
    wait_until(lambda: values(adapter, "UInt64"), 20, "the UInt64 node's value")
    assert values(adapter, "UInt64")[0] == 18_000_000_000_000_000_000
    assert values(adapter, "Int64")[0] == -9_000_000_000_000_000_000
    (sample,) = updates(adapter, "UInt64")[0].body["samples"]
    assert sample["quality"] == "GOOD"
    counted = len(values(adapter, "Counter"))
    wait_until(lambda: len(values(adapter, "Counter")) > counted + 3, 20, "Counter goes on")
    status = adapter.client.call("status", instance="line-1")
    assert status["state"] == "connected"
    assert status["counters"]["threadFailures"] == 0
