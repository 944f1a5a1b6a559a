"""The ethernet-ip-adapter end to end: cpppo's Logix simulator polled through the southbound
runtime, updates and verbs over a real Mosquitto."""

from __future__ import annotations

import contextlib
import copy
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.cip.conftest import plc_instance, plc_signal
from tests.support.adapter import Adapter
from tests.support.cpppo import LogixSimulator
from tests.support.pki import Pki
from tests.support.servers import wait_until
from unskit.errors import CommandError
from unskit.topics import RESERVED_CLASSES


def updates(adapter: Adapter, instance_id: str, channel: str) -> list:
    return adapter.seen.on(adapter.data_topic(instance_id, channel))


def last_value(adapter: Adapter, instance_id: str, channel: str):
    got = updates(adapter, instance_id, channel)
    return got[-1].body["samples"][-1]["value"] if got else None


def connected(adapter: Adapter, instance_id: str) -> None:
    wait_until(
        lambda: adapter.client.call("status", instance=instance_id)["connected"],
        15,
        f"{instance_id} to connect",
    )


def write(adapter: Adapter, instance_id: str, signal: str, value, request_id: str) -> dict:
    body = {"requestId": request_id, "signal": signal, "value": value}
    return adapter.client.call("write", body, instance=instance_id)


def test_values_qualities_and_scaling_are_published(start_cip, logix: LogixSimulator) -> None:
    signals = [
        {**plc_signal("Temp", "REAL"), "scale": 2.0, "offset": 1.0},
        plc_signal("Counts", "DINT") | {"arrayCount": 10},
        plc_signal("Flag", "BOOL"),
        plc_signal("Counts[12]", "DINT") | {"name": "beyond"},
    ]
    adapter = start_cip(
        [plc_instance("plc-1", logix.endpoint, *signals, writes={"allow": ["Temp", "Counts"]})]
    )
    connected(adapter, "plc-1")
    wait_until(lambda: last_value(adapter, "plc-1", "temp") == 1.0, 10, "raw 0 scaled to 1")
    write(adapter, "plc-1", "Temp", 26.0, "w-temp")
    wait_until(lambda: last_value(adapter, "plc-1", "temp") == 26.0, 10, "the written value")
    status = adapter.client.call("status", instance="plc-1")
    assert status["device"]["adapter"] == "ethernet-ip"
    assert status["device"]["endpoint"] == logix.endpoint
    read = adapter.client.call("read", {"signals": ["Temp"]}, instance="plc-1")
    assert read["readings"][0]["value"] == 26.0, "engineering units: raw 12.5 * 2 + 1"
    write(adapter, "plc-1", "Counts", list(range(10)), "w-counts")
    wait_until(lambda: last_value(adapter, "plc-1", "counts") == list(range(10)), 10, "the array")
    message = updates(adapter, "plc-1", "flag")[0]
    assert message.header.name == "SouthboundSignalUpdate"
    assert message.body["signal"] == {"id": "Flag", "name": "flag"}
    assert message.body["samples"][0]["value"] is False
    beyond = updates(adapter, "plc-1", "beyond")
    assert beyond, "an update for the index past the tag"
    assert beyond[0].body["samples"][0]["quality"] == "BAD"
    assert adapter.client.call("status", instance="plc-1")["connected"] is True


def test_on_change_and_deadband(start_cip, logix: LogixSimulator) -> None:
    signal = plc_signal("Temp", "REAL") | {"deadband": {"type": "absolute", "value": 1.0}}
    adapter = start_cip([plc_instance("plc-1", logix.endpoint, signal, writes={"allow": ["Temp"]})])
    connected(adapter, "plc-1")
    wait_until(lambda: last_value(adapter, "plc-1", "temp") == 0.0, 10, "the first sample")
    write(adapter, "plc-1", "Temp", 0.5, "small")  # inside the deadband: not published
    write(adapter, "plc-1", "Temp", 3.0, "big")
    wait_until(lambda: last_value(adapter, "plc-1", "temp") == 3.0, 10, "the big change")
    published = [m.body["samples"][-1]["value"] for m in updates(adapter, "plc-1", "temp")]
    assert 0.5 not in published, published
    reads = adapter.client.call("status", instance="plc-1")["counters"]["reads"]
    wait_until(
        lambda: adapter.client.call("status", instance="plc-1")["counters"]["reads"] > reads + 5,
        10,
        "more polls",
    )
    assert len(updates(adapter, "plc-1", "temp")) == len(published), "no change, no update"


def test_refused_writes(start_cip, logix: LogixSimulator) -> None:
    signals = [plc_signal("Temp", "REAL"), plc_signal("Speed", "INT")]
    adapter = start_cip(
        [plc_instance("plc-1", logix.endpoint, *signals, writes={"allow": ["Speed"]})]
    )
    connected(adapter, "plc-1")
    for signal, value in (("Temp", 1.0), ("Speed", 40000), ("Speed", "fast")):
        with pytest.raises(CommandError) as raised:
            write(adapter, "plc-1", signal, value, f"r-{signal}-{value}")
        assert raised.value.code == "BAD_ARGS"
    assert write(adapter, "plc-1", "Speed", 1200, "ok")["written"] == 1200


def test_pause_resume_and_the_unreachable_alarm(start_cip, logix: LogixSimulator) -> None:
    adapter = start_cip(
        [
            plc_instance("plc-1", logix.endpoint, plc_signal("Temp", "REAL")),
            plc_instance("sim-1", "sim.local", plc_signal("Wave", "REAL")) | {"adapter": "sim"},
        ]
    )
    connected(adapter, "plc-1")
    adapter.client.call("pause", instance="plc-1")
    reads = adapter.client.call("status", instance="plc-1")["counters"]["reads"]
    assert adapter.client.call("status", instance="plc-1")["paused"] is True
    adapter.client.call("resume", instance="plc-1")
    wait_until(
        lambda: adapter.client.call("status", instance="plc-1")["counters"]["reads"] > reads,
        10,
        "polling after resume",
    )
    alarm = adapter.runtime.topics.topic("evt", "error", "device-unreachable", instance="plc-1")
    logix.stop()
    wait_until(lambda: len(adapter.seen.on(alarm)) == 1, 15, "the alarm")
    assert adapter.seen.on(alarm)[0].body["state"] == "raised"
    status = adapter.client.call("status", instance="plc-1")
    assert status["connected"] is False
    assert status["lastError"]
    sim_status = adapter.client.call("status", instance="sim-1")
    assert sim_status["connected"] is True, "the other instance is untouched"
    before = len(updates(adapter, "sim-1", "wave"))
    wait_until(
        lambda: len(updates(adapter, "sim-1", "wave")) > before,
        10,
        "the other instance to publish while plc-1 is unreachable",
    )
    assert adapter.client.call("status", instance="plc-1")["connected"] is False
    logix.start()
    wait_until(lambda: len(adapter.seen.on(alarm)) == 2, 20, "the clear")
    assert adapter.seen.on(alarm)[1].body["state"] == "cleared"
    connected(adapter, "plc-1")


def test_live_reload_of_an_instance(start_cip, logix: LogixSimulator) -> None:
    adapter = start_cip(
        [
            plc_instance("plc-1", logix.endpoint, plc_signal("Temp", "REAL")),
            plc_instance("plc-2", logix.endpoint, plc_signal("Count", "DINT")),
        ]
    )
    connected(adapter, "plc-1")
    adapter.client.call("pause", instance="plc-2")
    document = copy.deepcopy(adapter.document)
    entries = document["component"]["instances"]
    entries[0]["pollGroups"][0]["signals"].append(plc_signal("Speed", "INT"))
    entries.append(plc_instance("plc-3", logix.endpoint, plc_signal("Flag", "BOOL")))
    reply = adapter.reload(document)
    assert reply == {"started": ["plc-1", "plc-3"], "stopped": [], "kept": ["plc-2"], "skipped": []}
    assert adapter.client.call("status", instance="plc-2")["paused"] is True
    wait_until(lambda: updates(adapter, "plc-1", "speed"), 10, "the added signal")
    wait_until(lambda: updates(adapter, "plc-3", "flag"), 10, "the added instance")
    document = copy.deepcopy(document)
    document["component"]["instances"] = [
        document["component"]["instances"][0],
        {"id": "plc-4", "connection": {"endpoint": logix.endpoint}},
    ]
    reply = adapter.reload(document)
    assert reply == {
        "started": [],
        "stopped": ["plc-2", "plc-3"],
        "kept": ["plc-1"],
        "skipped": ["plc-4"],
    }


def test_reload_global_and_formatting_rows(start_cip, logix: LogixSimulator) -> None:
    adapter = start_cip(
        [
            plc_instance("plc-1", logix.endpoint, plc_signal("Temp", "REAL")),
            plc_instance("plc-2", logix.endpoint, plc_signal("Count", "DINT")),
        ]
    )
    connected(adapter, "plc-2")
    adapter.client.call("pause", instance="plc-2")
    document = copy.deepcopy(adapter.document)
    reordered = [dict(reversed(entry.items())) for entry in document["component"]["instances"]]
    document["component"]["instances"] = reordered
    reply = adapter.reload(document)
    assert reply == {"started": [], "stopped": [], "kept": ["plc-1", "plc-2"], "skipped": []}
    document = copy.deepcopy(document)
    document["component"]["global"]["thresholds"] = {"staleSignalSecs": 5}
    reply = adapter.reload(document)
    assert reply == {"started": ["plc-1", "plc-2"], "stopped": [], "kept": [], "skipped": []}
    assert adapter.client.call("status", instance="plc-2")["paused"] is False, "restarted"


# -- security: a tls setting never runs in plaintext ---------------------------------------------


class RecordingListener:
    """A plain TCP server on 127.0.0.1 that records every connection and byte it receives."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.connections = 0
        self.received = bytearray()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                self.connections += 1
            reader = threading.Thread(target=self._read, args=(connection,), daemon=True)
            self._threads.append(reader)
            reader.start()

    def _read(self, connection: socket.socket) -> None:
        connection.settimeout(5)
        with connection:
            try:
                while chunk := connection.recv(4096):
                    with self._lock:
                        self.received += chunk
            except OSError:
                return

    def close(self) -> None:
        # close() alone leaves a thread blocked in accept() (and the port listening) on
        # Linux; shutdown() wakes it.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._threads[0].join(10)
        assert not self._threads[0].is_alive(), "the listener's acceptor outlived close()"


@contextmanager
def recording_listener() -> Iterator[RecordingListener]:
    listener = RecordingListener()
    try:
        yield listener
    finally:
        listener.close()


def tls_security(pki: Pki) -> dict:
    return {
        "mode": "tls",
        "client": {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)},
        "ca": {"file": str(pki.ca)},
    }


def test_a_tls_instance_never_sends_plaintext(start_cip, pki: Pki) -> None:
    with recording_listener() as device:
        plc = plc_instance("plc-tls", f"127.0.0.1:{device.port}", plc_signal("Temp", "REAL"))
        plc["connection"]["security"] = tls_security(pki)
        adapter = start_cip([plc])
        wait_until(lambda: device.connections >= 2, 15, "two connection attempts")
        status = adapter.client.call("status", instance="plc-tls")
        assert status["connected"] is False
        assert status["security"]["mode"] == "tls", "never reported as plaintext"
        assert "TLS" in (status["lastError"] or ""), status["lastError"]
        received = bytes(device.received)
        assert received[:2] == b"\x16\x03", "a TLS handshake record first"
        register_session = b"\x65\x00\x04\x00"
        assert register_session not in received, "no EtherNet/IP request in the clear"
        # The listener does see a plaintext session once plaintext is what is asked for.
        document = copy.deepcopy(adapter.document)
        del document["component"]["instances"][0]["connection"]["security"]
        assert adapter.reload(document)["started"] == ["plc-tls"]
        wait_until(lambda: register_session in bytes(device.received), 15, "the plaintext request")


# -- instance ids that are topic class words ----------------------------------------------------


def test_instances_named_like_reserved_classes_publish_their_signals(start_cip) -> None:
    names = sorted(RESERVED_CLASSES)
    sims = [
        plc_instance(name, "sim.local", plc_signal("Wave", "REAL")) | {"adapter": "sim"}
        for name in names
    ]
    adapter = start_cip(sims)
    root = adapter.document["topic"]["root"]
    for name in names:
        topic = f"{root}/gw/ethernet-ip-adapter/{name}/data/wave"
        assert adapter.data_topic(name, "wave") == topic
        wait_until(lambda t=topic: adapter.seen.on(t), 10, f"an update of instance {name!r}")
        message = adapter.seen.on(topic)[0]
        assert message.identity is not None
        assert message.identity.instance == name
        assert message.body["samples"][0]["quality"] == "GOOD"
        status = adapter.client.call("status", instance=name)
        assert (status["state"], status["counters"]["publishErrors"]) == ("connected", 0)


def test_an_unknown_tag_that_ends_the_session_is_bad_while_the_others_publish(
    start_cip, logix: LogixSimulator
) -> None:
    # Unconnected mode: cpppo answers a Read Tag of a tag it does not know with a bare
    # encapsulation header (status 0x0008) and ends the session.
    adapter = start_cip(
        [
            plc_instance(
                "plc-1",
                logix.endpoint,
                plc_signal("Temp", "REAL"),
                plc_signal("Nope", "REAL"),
            )
        ]
    )
    alarm_topic = adapter.runtime.topics.topic(
        "evt", "error", "device-unreachable", instance="plc-1"
    )

    def view(signal_id: str) -> dict:
        (signal,) = [s for s in adapter.client.call("signals")["items"] if s["id"] == signal_id]
        return signal

    def nope() -> dict:
        return view("Nope")

    def reads() -> int:
        return adapter.client.call("status", instance="plc-1")["counters"]["reads"]

    wait_until(lambda: (nope()["status"] or "").startswith("refused by the device"), 15, "BAD")
    assert nope()["quality"] == "BAD"
    assert "0x0008" in nope()["status"]
    assert "does the tag exist?" in nope()["status"]
    before = reads()
    wait_until(lambda: reads() >= before + 10, 15, "ten more polls")
    assert view("Temp")["quality"] == "GOOD"
    assert updates(adapter, "plc-1", "temp")[-1].body["samples"][-1]["quality"] == "GOOD"
    status = adapter.client.call("status", instance="plc-1")
    assert status["connected"] is True
    reconnects = status["counters"]["reconnects"]
    assert reconnects <= 1, "the session ended once, on the first request for Nope"
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) >= 2, 10, "the alarm's clear")
    assert [m.body["state"] for m in adapter.seen.on(alarm_topic)] == ["raised", "cleared"]
    assert adapter.client.call("status", instance="plc-1")["counters"]["reconnects"] == reconnects
