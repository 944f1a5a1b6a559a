"""The class-1 I/O engine over real loopback UDP: a Python socket plays the target, sends
T-to-O datagrams built with `unskit.cip.frames.build` and receives the O-to-T ones."""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import wait_until
from unskit._core import cip as _cip
from unskit.cip.frames import RealTimeFormat, build, parse
from unskit.cip.plan import AssemblyField
from unskit.cip.push import IoHub
from unskit.errors import CipError
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.supervision import RUNTIME_FAMILY, THREAD_FAILURES, Supervisor

pytestmark = pytest.mark.integration

T2O = 0x1000_0001
O2T = 0x2000_0001
SIZE = 17  # DINT count, REAL temp, ULINT big, BOOL bit 2 of byte 16


def input_plan(sample_ms: int = 0, fmt: RealTimeFormat = "header32") -> _cip.InputPlan:
    fields = [
        AssemblyField("count", 0, "DINT", deadband="absolute", deadband_value=10.0),
        AssemblyField("temp", 4, "REAL", scale=2.0),
        AssemblyField("big", 8, "ULINT"),
        AssemblyField("flag", 16, "BOOL", bit=2),
    ]
    return _cip.InputPlan(100, SIZE, fmt, sample_ms, [f.as_tuple() for f in fields])


def assembly(count: int, temp: float, big: int, flag: bool) -> bytes:
    return struct.pack("<ifQB", count, temp, big, 0b100 if flag else 0)


@pytest.fixture
def engine() -> Iterator[_cip.IoEngine]:
    e = _cip.IoEngine("127.0.0.1", 0)
    yield e
    e.shutdown()


@pytest.fixture
def target() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(2.0)
        yield s


def open_connection(
    engine: _cip.IoEngine,
    target: socket.socket,
    key: int = 1,
    *,
    t2o: int = T2O,
    o2t: int = O2T,
    t2o_api_us: int = 10_000,
    o2t_api_us: int = 10_000,
    multiplier: int = 64,
    plan: _cip.InputPlan | None = None,
    output_format: str = "header32",
    image: bytes = bytes(4),
    run: bool = True,
    group: str | None = None,
) -> None:
    engine.open(
        key,
        t2o_connection_id=t2o,
        o2t_connection_id=o2t,
        target_host="127.0.0.1",
        target_port=target.getsockname()[1],
        t2o_api_us=t2o_api_us,
        o2t_api_us=o2t_api_us,
        timeout_multiplier=multiplier,
        input_plan=plan if plan is not None else input_plan(),
        output_format=output_format,
        output_image=image,
        run=run,
        multicast_group=group,
    )


def t2o(seq: int, data: bytes, *, conn: int = T2O, run: bool = True) -> bytes:
    return build(conn, seq, seq & 0xFFFF, "header32", run=run, data=data)


Sample = tuple[int, str, Any, int, bool | None]


def collect(
    engine: _cip.IoEngine, done: Callable[[list[Sample]], bool], timeout: float = 5.0
) -> list[Sample]:
    """Polls samples until `done(samples)` holds; AssertionError after `timeout` s."""
    samples: list[Sample] = []
    deadline = time.monotonic() + timeout
    while not done(samples):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out with samples {samples}")
        samples += engine.poll(min(left, 0.2)).samples
    return samples


def wait_stats(
    engine: _cip.IoEngine, key: int, done: Callable[[dict[str, Any]], bool], timeout: float = 5.0
) -> dict[str, Any]:
    """Stats once `done(stats)` holds (samples stay queued)."""
    wait_until(lambda: done(engine.stats(key)), timeout, f"stats of {key}: {engine.stats(key)}")
    return engine.stats(key)


def o2t_datagrams(
    target: socket.socket, n: int, fmt: RealTimeFormat = "header32", size: int = 4
) -> list[tuple[float, Any]]:
    """The next `n` O-to-T datagrams with their arrival times."""
    out = []
    while len(out) < n:
        wire = target.recv(2048)
        result = parse(wire, fmt, size)
        assert result.status == "complete", result.reason
        out.append((time.monotonic(), result.datagram))
    return out


def drain(target: socket.socket) -> None:
    """Receives until the socket's timeout raises."""
    while True:
        target.recv(2048)


def test_values_in_with_the_plans_gate_and_read_ungated(
    engine: _cip.IoEngine, target: socket.socket
) -> None:
    open_connection(engine, target)
    reference = input_plan()
    first = t2o(1, assembly(5, 1.5, 2**64 - 1, True))
    target.sendto(first, ("127.0.0.1", engine.port))
    samples = collect(engine, lambda s: len(s) >= 4)
    expected = [(i, v) for i, v in reference.decode(first, 0).updates]
    assert [(key, sid, value, run) for key, sid, value, _, run in samples] == [
        (1, reference.ids[i], v, True) for i, v in expected
    ]
    assert [v for _, _, v, _, _ in samples] == [5, 3.0, 2**64 - 1, True]
    assert type(samples[0][2]) is int
    assert type(samples[3][2]) is bool
    now_ms = time.time() * 1000
    assert all(abs(ts - now_ms) < 5000 for _, _, _, ts, _ in samples)
    # count moves inside its deadband, temp changes: only temp publishes, idle bit carried.
    target.sendto(t2o(2, assembly(9, 2.0, 2**64 - 1, True), run=False), ("127.0.0.1", engine.port))
    second = collect(engine, lambda s: len(s) >= 1)
    assert [(sid, v, run) for _, sid, v, _, run in second] == [("a100/4/REAL", 4.0, False)]
    assert engine.poll(0.05).samples == []
    assert engine.read(1) == [
        ("a100/0/DINT", 9),
        ("a100/4/REAL", 4.0),
        ("a100/8/ULINT", 2**64 - 1),
        ("a100/16/BOOL.2", True),
    ]
    stats = engine.stats(1)
    assert (stats["last_sequence"], stats["last_cip_sequence"], stats["run"]) == (2, 2, False)
    assert stats["datagrams_received"] == 2
    # The caller's plan is untouched by the engine: it still publishes every field first.
    assert len(reference.decode(first, 0).updates) == 0
    assert len(input_plan().decode(first, 0).updates) == 4


def test_read_is_none_before_the_first_datagram_and_keys_are_checked(
    engine: _cip.IoEngine, target: socket.socket
) -> None:
    open_connection(engine, target)
    assert engine.read(1) is None
    with pytest.raises(CipError, match="already open"):
        open_connection(engine, target)
    with pytest.raises(CipError, match="no connection 2"):
        engine.read(2)
    with pytest.raises(CipError, match="no connection 2"):
        engine.set_output(2, bytes(4))
    with pytest.raises(CipError, match="4 bytes, got 3"):
        engine.set_output(1, bytes(3))
    engine.close(1)
    with pytest.raises(CipError, match="no connection 1"):
        engine.close(1)


def test_o2t_cadence_sequence_numbers_and_atomic_set_output(
    engine: _cip.IoEngine, target: socket.socket
) -> None:
    open_connection(engine, target, o2t_api_us=5_000, image=bytes(4))
    got = o2t_datagrams(target, 100)
    datagrams = [d for _, d in got]
    assert [d.connection_id for d in datagrams] == [O2T] * 100
    assert [d.sequence_number for d in datagrams] == list(range(1, 101))
    assert {d.cip_sequence for d in datagrams} == {1}
    assert all(d.run and d.data == bytes(4) for d in datagrams)
    # 99 periods of 5 ms; a late first or last read of ours moves the span a little.
    span = got[-1][0] - got[0][0]
    assert 0.35 < span < 0.75, span
    # Two fields written at once land in one datagram: never one without the other.
    engine.set_output(1, b"\x11\x00\x22\x00")
    engine.set_output(1, b"\x11\x00\x22\x00")  # no change: the CIP count stays
    engine.set_output(1, b"\x11\x00\x22\x00", run=False)
    seen = []
    while not seen or seen[-1].cip_sequence != 3:
        seen += [d for _, d in o2t_datagrams(target, 1)]
    for d in seen:
        assert (d.cip_sequence, d.data, d.run) in {
            (1, bytes(4), True),
            (2, b"\x11\x00\x22\x00", True),
            (3, b"\x11\x00\x22\x00", False),
        }
    numbers = [d.sequence_number for d in seen]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    stats = engine.stats(1)
    assert stats["o2t_cip_sequence"] == 3
    assert stats["datagrams_produced"] >= 101
    assert stats["lateness_p50_us"] is not None
    assert stats["lateness_p50_us"] <= stats["lateness_p99_us"] <= stats["lateness_max_us"]


def test_heartbeat_and_modeless_outputs(engine: _cip.IoEngine, target: socket.socket) -> None:
    open_connection(engine, target, output_format="heartbeat", image=b"")
    (_, d), *_ = o2t_datagrams(target, 1, "heartbeat", 0)
    assert (d.connection_id, d.data, d.run_idle) == (O2T, b"", None)
    engine.close(1)
    with pytest.raises(CipError, match="heartbeat"):
        open_connection(engine, target, key=2, output_format="heartbeat", image=b"\x00")


def test_watchdog_expires_once_and_production_stops(
    engine: _cip.IoEngine, target: socket.socket
) -> None:
    # Before the open: the watchdog is armed by it, so the 20 ms count from there.
    started = time.monotonic()
    open_connection(engine, target, t2o_api_us=5_000, o2t_api_us=5_000, multiplier=4)
    timed_out: list[int] = []
    deadline = started + 5.0
    while not timed_out and time.monotonic() < deadline:
        timed_out += engine.poll(0.5).timed_out
    assert timed_out == [1]
    assert time.monotonic() - started >= 0.02
    stats = engine.stats(1)
    assert (stats["state"], stats["watchdog_timeouts"]) == ("timed_out", 1)
    produced = stats["datagrams_produced"]
    # Drain what was in flight; nothing more comes once the socket stays quiet 0.2 s.
    target.settimeout(0.2)
    with pytest.raises(TimeoutError):
        drain(target)
    assert engine.stats(1)["datagrams_produced"] == produced
    assert engine.poll(0.05).timed_out == []
    # Datagrams after the timeout are dropped and counted; re-open after close works.
    target.sendto(t2o(1, assembly(1, 1.0, 1, False)), ("127.0.0.1", engine.port))
    wait_stats(engine, 1, lambda s: s["drops"]["timed_out"] == 1)
    engine.close(1)
    open_connection(engine, target)
    assert engine.stats(1)["state"] == "open"


def test_a_good_datagram_feeds_the_watchdog(engine: _cip.IoEngine, target: socket.socket) -> None:
    open_connection(engine, target, t2o_api_us=20_000, multiplier=10)  # 200 ms
    deadline = time.monotonic() + 0.6
    seq = 0
    while time.monotonic() < deadline:
        seq += 1
        target.sendto(t2o(seq, assembly(seq * 100, 0.0, 0, False)), ("127.0.0.1", engine.port))
        assert engine.poll(0.02).timed_out == []
    assert engine.stats(1)["state"] == "open"


def test_poll_times_out_with_an_empty_batch(engine: _cip.IoEngine) -> None:
    started = time.monotonic()
    batch = engine.poll(0.1)
    assert (batch.samples, batch.timed_out) == ([], [])
    assert time.monotonic() - started >= 0.09
    with pytest.raises(CipError, match="timeout_s"):
        engine.poll(-1.0)


def test_shutdown_is_idempotent_and_refuses_new_connections(target: socket.socket) -> None:
    engine = _cip.IoEngine("127.0.0.1", 0)
    assert engine.port > 0
    engine.shutdown()
    engine.shutdown()
    with pytest.raises(CipError, match="shut down"):
        open_connection(engine, target)
    assert engine.poll(1.0).samples == []


def test_bind_conflict_is_an_os_error_and_a_bad_host_a_cip_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(OSError, match="in use") as info:
            _cip.IoEngine("127.0.0.1", s.getsockname()[1])
        assert info.value.errno == errno.EADDRINUSE
    with pytest.raises(CipError, match="bind_host"):
        _cip.IoEngine("256.1.1.1", 0)
    with pytest.raises(CipError, match="multicast_interface"):
        _cip.IoEngine("127.0.0.1", 0, multicast_interface="lo")


def test_bad_datagrams_are_dropped_and_counted_by_reason(
    engine: _cip.IoEngine, target: socket.socket
) -> None:
    open_connection(engine, target)
    engine_addr = ("127.0.0.1", engine.port)
    good = assembly(1, 1.0, 1, False)
    sends = [
        t2o(10, good),  # accepted
        t2o(10, good),  # duplicate
        t2o(9, good),  # stale
        t2o(11, good[:-1]),  # wrong_size
        t2o(11, good)[:20],  # truncated, its id known
        t2o(1, good, conn=0x7777),  # unknown_connection
        b"\x03\x00" + t2o(11, good)[2:],  # item_count: no id to tell
    ]
    for wire in sends:
        target.sendto(wire, engine_addr)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.bind(("127.0.0.2", 0))  # loopback, but not the connection's target
        other.sendto(t2o(12, good), engine_addr)
    stats = wait_stats(engine, 1, lambda s: s["datagrams_received"] >= 6)
    drops = stats["drops"]
    assert {k: v for k, v in drops.items() if v} == {
        "duplicate": 1,
        "stale": 1,
        "wrong_size": 1,
        "truncated": 1,
        "wrong_source": 1,
    }
    assert set(drops) == set(_cip.DROP_REASONS)
    assert stats["last_sequence"] == 10
    glob = engine.global_stats()
    assert (glob["datagrams_received"], glob["unknown_connection"]) == (8, 1)
    assert {k: v for k, v in glob["malformed"].items() if v} == {"item_count": 1}
    # Only the good datagram published: its four fields, once.
    assert len(collect(engine, lambda s: len(s) >= 4)) == 4
    assert engine.poll(0.05).samples == []


def test_a_full_queue_drops_samples_and_counts_them(target: socket.socket) -> None:
    engine = _cip.IoEngine("127.0.0.1", 0, queue_capacity=6)
    try:
        open_connection(engine, target)
        for seq in (1, 2):  # four fields each; the second fills the queue past 6
            target.sendto(
                t2o(seq, assembly(seq * 100, seq, seq, seq == 1)), ("127.0.0.1", engine.port)
            )
        stats = wait_stats(engine, 1, lambda s: s["datagrams_received"] == 2)
        assert stats["drops"]["queue_full"] == 2
        assert engine.global_stats()["queued"] == 6
        assert len(engine.poll(0, max_samples=5).samples) == 5
        assert len(engine.poll(0).samples) == 1
    finally:
        engine.shutdown()


def test_multicast_t2o_on_loopback(target: socket.socket) -> None:
    group = "239.255.42.99"
    engine = _cip.IoEngine("0.0.0.0", 0)
    try:
        open_connection(engine, target, group=group)
        open_connection(engine, target, key=2, t2o=T2O + 1, o2t=O2T + 1, group=group)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.bind(("127.0.0.1", 0))
            sender.setsockopt(
                socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1")
            )
            sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
            sender.sendto(t2o(1, assembly(42, 0.5, 7, True)), (group, engine.port))
            samples = collect(engine, lambda s: len(s) >= 4)
            assert [(k, v) for k, _, v, _, _ in samples] == [(1, 42), (1, 1.0), (1, 7), (1, True)]
            # The group stays joined while key 2 uses it, and is left with the last user.
            engine.close(1)
            sender.sendto(t2o(1, assembly(43, 0.5, 7, True), conn=T2O + 1), (group, engine.port))
            assert collect(engine, lambda s: len(s) >= 4)[0][2] == 43
            engine.close(2)
            open_connection(engine, target, key=3, t2o=T2O + 2, o2t=O2T + 2)
            sender.sendto(t2o(1, assembly(44, 0.5, 7, True), conn=T2O + 2), (group, engine.port))
            sender.sendto(
                t2o(2, assembly(45, 0.5, 7, True), conn=T2O + 2), ("127.0.0.1", engine.port)
            )
            got = collect(engine, lambda s: len(s) >= 1)
            assert got[0][2] == 45, "the group datagram (44) must not arrive after leaving"
    finally:
        engine.shutdown()


def test_a_flood_from_an_unknown_source_does_not_starve_a_good_connection(
    engine: _cip.IoEngine, target: socket.socket
) -> None:
    open_connection(engine, target, t2o_api_us=10_000, o2t_api_us=10_000, multiplier=10)
    engine_addr = ("127.0.0.1", engine.port)
    junk = t2o(1, bytes(SIZE), conn=0xDEAD)
    flooded = 0
    seq = 0
    produced_before = engine.stats(1)["datagrams_produced"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flood:
        flood.bind(("127.0.0.3", 0))
        deadline = time.monotonic() + 1.0
        next_good = time.monotonic()
        while time.monotonic() < deadline:
            for _ in range(200):
                flood.sendto(junk, engine_addr)
            flooded += 200
            if time.monotonic() >= next_good:
                seq += 1
                target.sendto(t2o(seq, assembly(seq, 0.0, 0, False)), engine_addr)
                next_good += 0.01
    # The kernel may drop any datagram of the flood's, the last good one too: one more.
    seq += 1
    target.sendto(t2o(seq, assembly(seq, 0.0, 0, False)), engine_addr)
    stats = wait_stats(engine, 1, lambda s: s["last_sequence"] == seq, timeout=5.0)
    assert stats["state"] == "open"
    assert stats["watchdog_timeouts"] == 0
    # Most good datagrams made it (the kernel may drop some when its buffer overflows),
    # and O-to-T production kept its 10 ms pace through the flood.
    accepted = stats["datagrams_received"] - sum(stats["drops"].values())
    assert accepted >= seq * 0.8, (accepted, seq)
    assert stats["datagrams_produced"] - produced_before >= 70
    glob = engine.global_stats()
    assert glob["unknown_connection"] >= flooded * 0.5, (glob, flooded)


def test_a_second_engine_cannot_share_the_port() -> None:
    first = _cip.IoEngine(bind_host="127.0.0.1", port=0)
    try:
        with pytest.raises(OSError, match="bind") as refused:
            _cip.IoEngine(bind_host="127.0.0.1", port=first.port)
        assert refused.value.errno == errno.EADDRINUSE
    finally:
        first.shutdown()


def test_the_io_thread_asks_for_a_short_scheduler_slice() -> None:
    engine = _cip.IoEngine(bind_host="127.0.0.1", port=0)
    try:

        def io_threads() -> list[Path]:
            return [
                t for t in Path("/proc/self/task").iterdir()
                if (t / "comm").read_text().strip() == "unskit-cip-io"
            ]  # fmt: skip

        # The thread names itself once it runs, which a loaded machine may delay.
        wait_until(lambda: len(io_threads()) == 1, 10, "the named I/O thread")
        (task,) = io_threads()
        slices = [line for line in (task / "sched").read_text().splitlines() if "se.slice" in line]
        if not slices:
            pytest.skip("this kernel has no custom scheduler slices (Linux < 6.12)")
        assert int(slices[0].split(":")[1]) == 100_000
    finally:
        engine.shutdown()


def test_a_failed_route_restarts_the_sockets_routing_thread(target: socket.socket) -> None:
    """A push instance's handler that raises ended the hub's one routing thread, and every
    push instance on that socket went quiet; now the failure is counted and routing goes on."""
    metrics = MetricsRegistry()
    supervisor = Supervisor(metrics, restart_min_s=0.01, restart_max_s=0.02)
    hub = IoHub("127.0.0.1", 0, "0.0.0.0", supervisor)
    try:
        key = hub.new_key()
        open_connection(hub.engine, target, key)
        received: list[list[tuple[str, Any, int]]] = []

        def on_samples(samples: list[tuple[str, Any, int]]) -> None:
            received.append(samples)
            if len(received) == 1:
                raise RuntimeError("handler bug (test)")

        hub.attach(key, on_samples, lambda: None)
        target.sendto(t2o(1, assembly(5, 1.5, 7, True)), ("127.0.0.1", hub.port))
        wait_until(lambda: len(received) == 1, 5, "the first batch")
        failures = metrics.counter(
            RUNTIME_FAMILY, THREAD_FAILURES, {"thread": f"cip-io-route-{hub.port}"}
        )
        wait_until(lambda: failures.total == 1, 5, "the failure counted")
        target.sendto(t2o(2, assembly(5, 2.5, 7, True)), ("127.0.0.1", hub.port))
        wait_until(lambda: len(received) == 2, 5, "routing after the restart")
        assert [(sid, value) for sid, value, _ in received[1]] == [("a100/4/REAL", 5.0)]
    finally:
        hub.close()
