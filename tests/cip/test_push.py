"""Push mode end to end: the ethernet-ip-adapter opens class-1 connections to the target
simulator and publishes over a real Mosquitto: values, scaling, deadband, sampleMs, writes,
run/idle, the watchdog, refusals, multicast, pause, hostile datagrams."""

from __future__ import annotations

import copy
import socket
import struct
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from tests.support.adapter import Adapter
from tests.support.servers import wait_until
from tests.support.tshark import LoopbackCapture, on_enip_port
from unskit.cip.frames import build
from unskit.cip.target_sim import AssemblySpec, CipTargetSim
from unskit.errors import CommandError

pytestmark = pytest.mark.integration

#: An ephemeral class-1 port (target and originator share this host); multicast on lo.
LOOPBACK_IO = {"udpPort": 0, "multicastInterface": "127.0.0.1"}
INPUT, OUTPUT, CONFIG = 100, 150, 1

INPUT_FIELDS = [
    {"name": "count", "offset": 0, "type": "DINT"},
    {"name": "temp", "offset": 4, "type": "INT", "scale": 0.1, "valueOffset": -10},
    {"name": "level", "offset": 8, "type": "REAL", "deadband": {"type": "absolute", "value": 1.0}},
    {"name": "flag", "offset": 12, "type": "BOOL", "bit": 3},
]
OUTPUT_FIELDS = [
    {"name": "setpoint", "offset": 0, "type": "INT", "scale": 0.5},
    {"name": "mode", "offset": 2, "type": "UINT"},
]


def assemblies(input_size: int = 16, output_size: int = 4) -> dict[int, AssemblySpec]:
    return {
        CONFIG: AssemblySpec(0),
        INPUT: AssemblySpec(input_size),
        OUTPUT: AssemblySpec(output_size),
    }


def _started_sim(tcp_port: int, **options: Any) -> CipTargetSim:
    return CipTargetSim(tcp_port=tcp_port, **options).start()


@pytest.fixture
def target() -> Iterator[CipTargetSim]:
    with CipTargetSim(assemblies=assemblies()) as sim:
        yield sim


def push_instance(
    sim: CipTargetSim, instance_id: str = "io-1", *, writes: list[str] | None = None, **io: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": instance_id,
        "mode": "push",
        "connection": {"endpoint": f"127.0.0.1:{sim.tcp_port}"},
        "io": {
            "rpiMs": 10,
            "assemblies": {"input": INPUT, "output": OUTPUT, "config": CONFIG},
            "input": {"sizeBytes": 16, "signals": INPUT_FIELDS},
            "output": {"sizeBytes": 4, "signals": OUTPUT_FIELDS},
            **io,
        },
    }
    if writes is not None:
        entry["writes"] = {"allow": writes}
    return entry


def start(start_cip, *instances: dict[str, Any], **global_: Any) -> Adapter:
    return start_cip(list(instances), implicitIo=LOOPBACK_IO, **global_)


def values(adapter: Adapter, channel: str, instance_id: str = "io-1") -> list[Any]:
    topic = adapter.data_topic(instance_id, channel)
    return [s["value"] for m in adapter.seen.on(topic) for s in m.body["samples"]]


def status(adapter: Adapter, instance_id: str = "io-1") -> dict[str, Any]:
    result: dict[str, Any] = adapter.client.call("status", instance=instance_id)
    return result


def connected(adapter: Adapter, instance_id: str = "io-1") -> None:
    wait_until(lambda: status(adapter, instance_id)["connected"], 15, f"{instance_id} connected")


def write(adapter: Adapter, signal: str, value: Any, request_id: str) -> dict[str, Any]:
    body = {"requestId": request_id, "signal": signal, "value": value}
    result: dict[str, Any] = adapter.client.call("write", body, instance="io-1")
    return result


def image(count: int = 0, temp_raw: int = 0, level: float = 0.0, flags: int = 0) -> bytes:
    return struct.pack("<ihxxfB3x", count, temp_raw, level, flags)


def test_values_scaling_deadband_and_bits_are_published(start_cip, target) -> None:
    target.set_input(INPUT, image(7, 250, 5.0, 0b1000))
    adapter = start(start_cip, push_instance(target))
    connected(adapter)
    # Each signal is its own message: waiting on one says nothing of the others' arrival.
    wait_until(lambda: values(adapter, "count") == [7], 10, "count")
    wait_until(lambda: values(adapter, "temp") and values(adapter, "flag"), 10, "temp, flag")
    assert values(adapter, "temp") == [pytest.approx(15.0)], "250 * 0.1 - 10"
    assert values(adapter, "flag") == [True]
    target.set_input(INPUT, image(8, 250, 5.5, 0))
    wait_until(lambda: values(adapter, "count") == [7, 8], 10, "the change")
    wait_until(lambda: values(adapter, "flag") == [True, False], 10, "the bit")
    target.set_input(INPUT, image(9, 250, 6.5, 0))
    wait_until(lambda: values(adapter, "count") == [7, 8, 9], 10, "the next change")
    wait_until(lambda: values(adapter, "level")[-1:] == [6.5], 10, "the level beyond the band")
    assert values(adapter, "level") == [5.0, 6.5], "5.5 is inside the deadband of 1.0"
    assert values(adapter, "temp") == [pytest.approx(15.0)], "unchanged: not republished"
    received = adapter.runtime.metrics.counter(
        "CipImplicitIo", "datagramsReceived", {"instance": "io-1"}
    )
    wait_until(lambda: received.total > 0, 10, "the datagram metric")
    device = status(adapter)["device"]
    assert device["mode"] == "push"
    assert device["t2oApiUs"] == 10_000
    assert device["io"]["datagrams_received"] > 0
    assert device["io"]["datagrams_produced"] > 0


def test_sample_ms_is_a_publication_floor(start_cip, target) -> None:
    target.animate(INPUT, period_ms=10)
    entry = push_instance(target)
    entry["defaults"] = {"publishMode": "always"}
    entry["io"]["input"] = {
        "sizeBytes": 16,
        "sampleMs": 500,
        "signals": [{"name": "count", "offset": 0, "type": "UDINT"}],
    }
    adapter = start(start_cip, entry)
    connected(adapter)
    wait_until(lambda: len(values(adapter, "count")) >= 3, 10, "three samples")
    received = status(adapter)["device"]["io"]["datagrams_received"]
    published = len(values(adapter, "count"))
    assert received > 5 * published, f"{received} datagrams, {published} published"


def test_writes_reach_the_target_in_one_image_and_run_idle_switches(start_cip, target) -> None:
    allow = ["a150/0/INT", "a150/2/UINT", "a150/run"]
    adapter = start(start_cip, push_instance(target, writes=allow))
    connected(adapter)
    wait_until(lambda: target.run_bit(OUTPUT) is True, 10, "run")
    write(adapter, "a150/0/INT", 1.0, "w0")
    wait_until(lambda: target.output(OUTPUT) == struct.pack("<hH", 2, 0), 10, "one field")
    reply = adapter.client.call(
        "write",
        {"requestId": "w1", "values": {"a150/0/INT": 21.0, "a150/2/UINT": 513}},
        instance="io-1",
    )
    assert reply["written"] == {"a150/0/INT": 42, "a150/2/UINT": 513}, "raw: 21.0 / 0.5"
    wait_until(lambda: target.output(OUTPUT) == struct.pack("<hH", 42, 513), 10, "the output image")
    # One request, one image: the target never consumed one field without the other.
    assert target.outputs_seen(OUTPUT)[-2:] == [
        struct.pack("<hH", 2, 0),
        struct.pack("<hH", 42, 513),
    ]
    write(adapter, "a150/run", False, "w3")
    wait_until(lambda: target.run_bit(OUTPUT) is False, 10, "idle")
    read = adapter.client.call(
        "read", {"signals": ["a150/0/INT", "a150/run", "a100/0/DINT"]}, instance="io-1"
    )
    by_id = {r["id"]: r["value"] for r in read["readings"]}
    assert by_id == {"a150/0/INT": 21.0, "a150/run": False, "a100/0/DINT": 0}
    mixed = {"requestId": "w6", "values": {"a150/0/INT": 5.0, "a100/0/DINT": 1}}
    with pytest.raises(CommandError, match=r"writes\.allow"):
        adapter.client.call("write", mixed, instance="io-1")
    assert target.output(OUTPUT) == struct.pack("<hH", 42, 513), "nothing of it written"
    with pytest.raises(CommandError) as refused:
        write(adapter, "a100/0/DINT", 1, "w4")
    assert refused.value.code == "BAD_ARGS"
    with pytest.raises(CommandError, match="outside") as out_of_range:
        write(adapter, "a150/2/UINT", 70000, "w5")
    assert out_of_range.value.code == "BAD_ARGS"


def test_the_watchdog_closes_raises_the_alarm_and_reopens(start_cip, target) -> None:
    adapter = start(start_cip, push_instance(target, timeoutMultiplier=4))
    connected(adapter)
    alarm = adapter.runtime.topics.topic("evt", "error", "device-unreachable", instance="io-1")
    target.stop_producing()
    wait_until(lambda: len(adapter.seen.on(alarm)) == 1, 15, "the alarm")
    assert "watchdog" in adapter.seen.on(alarm)[0].body["context"]["error"]
    target.resume_producing()
    wait_until(lambda: len(adapter.seen.on(alarm)) == 2, 20, "the clear")
    connected(adapter)
    assert status(adapter)["device"]["io"]["watchdog_timeouts"] == 0, "a fresh connection"
    assert status(adapter)["counters"]["reconnects"] >= 1


@pytest.mark.parametrize(
    ("setup", "io", "status_text"),
    [
        ({"refuse": 0x0100}, {}, "0x01/0x0100 connection in use"),
        ({}, {"input": {"sizeBytes": 12, "signals": INPUT_FIELDS[:1]}}, "0x01/0x0109"),
        ({"min_rpi_ms": 50}, {}, "0x01/0x0111 RPI not supported"),
    ],
    ids=["in-use", "size", "rpi"],
)
def test_a_refused_forward_open_is_named(start_cip, setup, io, status_text) -> None:
    with CipTargetSim(assemblies=assemblies(), **setup) as sim:
        adapter = start(start_cip, push_instance(sim, **io))
        wait_until(lambda: status_text in (status(adapter)["lastError"] or ""), 15, "the refusal")
        device = status(adapter)["device"]
        assert status_text in device["lastForwardOpenError"]
        assert not status(adapter)["connected"]


def test_multicast_t2o_on_loopback(start_cip) -> None:
    with CipTargetSim(assemblies=assemblies(), multicast_group="239.192.10.1") as sim:
        sim.set_input(INPUT, image(41))
        adapter = start(start_cip, push_instance(sim, connectionType="multicast"))
        connected(adapter)
        wait_until(lambda: values(adapter, "count") == [41], 10, "a multicast value")
        assert status(adapter)["device"]["multicastGroup"] == "239.192.10.1"
        assert sim.connections()[0].multicast


def test_pause_closes_the_connection_and_resume_reopens_it(start_cip, target) -> None:
    adapter = start(start_cip, push_instance(target))
    connected(adapter)
    wait_until(lambda: target.connections()[-1].state == "open", 10, "open")
    adapter.client.call("pause", instance="io-1")
    wait_until(lambda: target.connections()[-1].state == "closed", 10, "a Forward Close")
    adapter.client.call("resume", instance="io-1")
    wait_until(lambda: [c.state for c in target.connections()].count("open") == 1, 10, "re-opened")
    target.set_input(INPUT, image(5))
    wait_until(lambda: 5 in values(adapter, "count"), 10, "values again")


def test_large_forward_open_for_a_large_assembly(start_cip) -> None:
    big = {CONFIG: AssemblySpec(0), INPUT: AssemblySpec(600), OUTPUT: AssemblySpec(4)}
    with CipTargetSim(assemblies=big) as sim:
        entry = push_instance(sim)
        entry["io"]["input"] = {
            "sizeBytes": 600,
            "signals": [{"name": "tail", "offset": 596, "type": "DINT"}],
        }
        sim.set_input(INPUT, bytes(596) + struct.pack("<i", -3))
        adapter = start(start_cip, entry)
        connected(adapter)
        wait_until(lambda: values(adapter, "tail") == [-3], 10, "the last field")
        assert status(adapter)["device"]["largeForwardOpen"] is True
        assert sim.connections()[0].large


def test_hostile_datagrams_are_counted_and_never_stall_the_connection(start_cip, target) -> None:
    adapter = start(start_cip, push_instance(target))
    connected(adapter)
    port = status(adapter)["device"]["udpPort"]
    t2o = status(adapter)["device"]["t2oConnectionId"]
    hostile = [
        b"",
        b"\x02\x00",
        b"\x02\x00\x02\x80\x08\x00" + struct.pack("<II", t2o, 1),  # no data item
        build(t2o, 2**31, 0, "modeless", data=bytes(3)),  # wrong size
        build(0xDEAD, 1, 0, "modeless", data=bytes(16)),  # unknown connection
        build(t2o, 1, 0, "modeless", data=bytes(65_000))[:65_507],
    ]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for _ in range(200):
            for datagram in hostile:
                sender.sendto(datagram, ("127.0.0.1", port))
    target.set_input(INPUT, image(77))
    wait_until(lambda: 77 in values(adapter, "count"), 10, "values despite the flood")
    io = status(adapter)["device"]["io"]
    assert io["drops"]["wrong_size"] >= 200
    assert status(adapter)["connected"]


def test_tshark_reads_our_forward_open_and_class1_datagrams(start_cip, tmp_path) -> None:
    # Wireshark pairs ENIP requests and replies only on TCP 44818 (tests/support/tshark.py).
    start_sim = partial(_started_sim, assemblies=assemblies())
    with on_enip_port(start_sim) as sim:
        bpf = f"tcp port {sim.tcp_port} or udp port {sim.udp_port}"
        with LoopbackCapture(tmp_path / "push.pcapng", bpf) as capture:
            adapter = start(start_cip, push_instance(sim, writes=["a150/0/INT", "a150/run"]))
            connected(adapter)
            wait_until(lambda: sim.connections()[-1].consumed >= 3, 10, "O-to-T datagrams")
            write(adapter, "a150/0/INT", 3.0, "t1")
            write(adapter, "a150/run", False, "t2")
            wait_until(lambda: sim.run_bit(OUTPUT) is False, 10, "idle")
            consumed = sim.connections()[-1].consumed
            wait_until(lambda: sim.connections()[-1].consumed >= consumed + 3, 10, "idle O-to-T")
            port = status(adapter)["device"]["udpPort"]
            adapter.client.call("pause", instance="io-1")
            wait_until(lambda: sim.connections()[-1].state == "closed", 10, "Forward Close")
            info = sim.connections()[-1]
    decode = [f"udp.port=={sim.udp_port},cipio"]
    assert capture.problems(decode) == []
    cm = capture.read(
        [
            "cip.cm.sc", "cip.genstat", "cip.cm.ot_connid", "cip.cm.to_connid",
            "cip.cm.conn_serial_num", "cip.cm.otrpi", "cip.cm.torpi", "cip.cm.otapi",
            "cip.cm.toapi", "cip.cm.fwo.consize", "cip.class", "cip.instance",
            "cip.connpoint", "enip.sinport",
        ],
        decode_as=decode,
        display_filter="cip.cm.sc",
    )  # fmt: skip
    assert [int(p["cip.cm.sc"][0], 0) for p in cm] == [0x54, 0x54, 0x4E, 0x4E]
    request, reply = cm[0], cm[1]
    assert reply["cip.genstat"] == ["0x00"]
    assert int(request["cip.cm.to_connid"][0], 0) == info.t2o_id, "we pick the T-to-O id"
    assert int(reply["cip.cm.ot_connid"][0], 0) == info.o2t_id, "the target the O-to-T id"
    assert (request["cip.cm.otrpi"], request["cip.cm.torpi"]) == (["10000"], ["10000"])
    assert (reply["cip.cm.otapi"], reply["cip.cm.toapi"]) == (["10000"], ["10000"])
    # Sizes count the 16-bit sequence count, and O-to-T its 32-bit run/idle header.
    assert request["cip.cm.fwo.consize"] == ["10", "18"]
    assert [int(v, 0) for v in request["cip.class"]] == [0x06, 0x04]
    assert [int(v, 0) for v in request["cip.instance"]] == [1, CONFIG]
    assert [int(v, 0) for v in request["cip.connpoint"]] == [OUTPUT, INPUT]
    assert request["enip.sinport"] == [str(port)], "our T-to-O port, announced"
    assert cm[2]["cip.cm.conn_serial_num"] == request["cip.cm.conn_serial_num"]

    io = capture.read(
        ["udp.srcport", "enip.cpf.sai.connid", "enip.cpf.sai.seq", "cip.seq",
         "cip.32bitheader.run_idle"],
        decode_as=decode,
        display_filter="enip.cpf.sai.connid",
    )  # fmt: skip
    o2t = [p for p in io if p["udp.srcport"] == [str(port)]]
    t2o = [p for p in io if p["udp.srcport"] == [str(sim.udp_port)]]
    assert {int(p["enip.cpf.sai.connid"][0], 0) for p in o2t} == {info.o2t_id}
    assert {int(p["enip.cpf.sai.connid"][0], 0) for p in t2o} == {info.t2o_id}
    o2t_seq = [int(p["enip.cpf.sai.seq"][0]) for p in o2t]
    assert o2t_seq == list(range(1, len(o2t) + 1)), "one up per datagram, from 1"
    run_idle = [p["cip.32bitheader.run_idle"][0] for p in o2t]
    assert run_idle[0] == "0x00000001"
    assert run_idle[-1] == "0x00000000", "the last ones idle"
    counts = [int(p["cip.seq"][0]) for p in o2t]
    assert counts[0] == 1
    assert counts[-1] == 3, "one count per change: the write, then idle"
    assert counts == sorted(counts)


def test_a_dropped_session_reconnects_with_backoff(start_cip) -> None:
    sim = CipTargetSim(assemblies=assemblies()).start()
    try:
        sim.set_input(INPUT, image(1))
        adapter = start(start_cip, push_instance(sim))
        connected(adapter)
        wait_until(lambda: values(adapter, "count") == [1], 10, "a value")
        tcp_port = sim.tcp_port
        sim.stop()
        wait_until(lambda: not status(adapter)["connected"], 15, "the loss noticed")
        sim = CipTargetSim(assemblies=assemblies(), tcp_port=tcp_port).start()
        sim.set_input(INPUT, image(2))
        wait_until(lambda: 2 in values(adapter, "count"), 15, "values from the new session")
        assert status(adapter)["counters"]["reconnects"] >= 1
    finally:
        sim.stop()


def test_a_reload_reopens_with_the_new_rpi(start_cip, target) -> None:
    adapter = start(start_cip, push_instance(target))
    connected(adapter)
    document = copy.deepcopy(adapter.document)
    document["component"]["instances"][0]["io"]["rpiMs"] = 20
    adapter.reload(document, "r1")
    wait_until(lambda: status(adapter)["device"].get("t2oApiUs") == 20_000, 15, "the new API")
    states = [c.state for c in target.connections()]
    assert states[0] == "closed", "Forward Close of the old connection"
    assert states[-1] == "open"
