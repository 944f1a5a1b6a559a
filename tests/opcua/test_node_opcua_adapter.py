"""The adapter's core subscription and write paths against node-opcua, an OPC UA stack fully
independent of asyncua (whose server the other tests use): the component in-process on a
real Mosquitto, as a user runs it."""

from __future__ import annotations

import time

import pytest

from tests.support.node_opcua import NodeOpcuaServer
from tests.support.opcua import opcua_instance
from tests.support.servers import wait_until
from unskit.errors import CommandError

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3600 * 1000


def samples(adapter, channel: str) -> list[dict]:
    topic = adapter.data_topic("line-1", channel)
    return [s for m in adapter.seen.on(topic) for s in m.body["samples"]]


def test_subscribed_changes_are_published(start_opcua, node_opcua_server: NodeOpcuaServer) -> None:
    adapter = start_opcua([opcua_instance(node_opcua_server.endpoint, "Counter|Temperature")])
    wait_until(lambda: len(samples(adapter, "Counter")) >= 5, 30, "Counter changes")
    topic = adapter.data_topic("line-1", "Counter")
    assert adapter.seen.on(topic)[0].body["signal"]["id"] == "ns=2;s=Counter"
    counts = [s["value"] for s in samples(adapter, "Counter")]
    assert counts == sorted(counts)
    assert all(isinstance(value, int) for value in counts)
    now_ms = time.time() * 1000
    for sample in samples(adapter, "Counter"):
        assert sample["quality"] == "GOOD"
        # node-opcua sends picoseconds, which asyncua 2.1.0 decodes out of order: the
        # server timestamp must still be a sane one (the adapter's own when garbled).
        assert abs(sample["server_timestamp_ms"] - now_ms) < DAY_MS, sample
        assert abs(sample["source_timestamp_ms"] - now_ms) < DAY_MS, sample
    status = adapter.client.call("status", instance="line-1")
    (subscription,) = status["device"]["subscriptions"]
    assert (subscription["items"], subscription["failedItems"]) == (2, 0)


def test_writes_round_trip_and_a_read_only_node_refuses(
    start_opcua, node_opcua_server: NodeOpcuaServer
) -> None:
    allow = {"allow": ["ns=2;s=Setpoint", "ns=2;s=Counter"]}
    adapter = start_opcua([opcua_instance(node_opcua_server.endpoint, "Setpoint", writes=allow)])
    wait_until(lambda: adapter.client.call("status", instance="line-1")["connected"], 30, "up")
    body = {"requestId": "w1", "signal": "ns=2;s=Setpoint", "value": 33.25}
    assert adapter.client.call("write", body, instance="line-1")["written"] == 33.25
    wait_until(lambda: 33.25 in [s["value"] for s in samples(adapter, "Setpoint")], 30, "published")
    read = adapter.client.call("read", {"signals": ["ns=2;s=Setpoint"]}, "line-1")
    assert read["readings"][0]["value"] == 33.25
    with pytest.raises(CommandError) as refused:
        adapter.client.call(
            "write", {"requestId": "w2", "signal": "ns=2;s=Counter", "value": 7}, "line-1"
        )
    assert refused.value.code == "BACKEND_ERROR"
    assert "BadNotWritable" in str(refused.value)


def test_a_wrong_password_shows_in_the_status(
    start_opcua, node_opcua_server: NodeOpcuaServer
) -> None:
    user = {"username": "operator", "password": "not-the-password"}
    adapter = start_opcua([opcua_instance(node_opcua_server.endpoint, connection_user=user)])
    wait_until(
        lambda: adapter.client.call("status", instance="line-1")["lastError"], 30, "the refusal"
    )
    status = adapter.client.call("status", instance="line-1")
    assert status["connected"] is False
    assert "BadUserAccessDenied" in status["lastError"] or "BadIdentityToken" in status["lastError"]
