"""The pycomm3 poll driver against cpppo's Logix simulator: every type, the three
simulator workarounds, count mismatches, probes and an unreachable target."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cip.packed_logix import packed_bits
from tests.support.cpppo import LogixSimulator
from tests.support.servers import free_port
from tests.support.tiers import server_fixture
from unskit.cip.poll import PollDriver
from unskit.southbound.driver import (
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    Quality,
    SignalSpec,
    Timing,
)


def driver_for(
    endpoint: str, *signals: SignalSpec, **connection: Any
) -> tuple[PollDriver, PollGroupSpec]:
    group = PollGroupSpec("g", 100, list(signals))
    spec = InstanceSpec(
        "plc-1",
        "ethernet-ip",
        endpoint,
        [group],
        timing=Timing(connect_ms=1000, request_timeout_ms=1000),
        entry={"connection": {"endpoint": endpoint, **connection}},
    )
    return PollDriver(spec), group


#: Connected messaging (a Forward Open), unconnected (UCMM), and unconnected routed to a
#: backplane slot (wrapped in Unconnected Send).
MESSAGING = [{"connected": True}, {"connected": False}, {"connected": False, "slot": 0}]


@server_fixture(params=MESSAGING, ids=["connected", "unconnected", "unconnected-slot"])
def connected(request, logix: LogixSimulator):
    drivers: list[PollDriver] = []

    def connect(*signals: SignalSpec) -> tuple[PollDriver, PollGroupSpec]:
        driver, group = driver_for(logix.endpoint, *signals, **request.param)
        driver.connect(5)
        drivers.append(driver)
        return driver, group

    yield connect
    for driver in drivers:
        driver.close()


def values(driver: PollDriver, group: PollGroupSpec) -> dict[str, Any]:
    readings = driver.read(group)
    assert all(r.quality is Quality.GOOD for r in readings), readings
    return {r.signal_id: r.value for r in readings}


WRITES = [
    (SignalSpec("Temp", "temp", "REAL"), 12.5),
    (SignalSpec("Level", "level", "LREAL"), -1.0e100),
    (SignalSpec("Count", "count", "DINT"), -(2**31)),
    (SignalSpec("Speed", "speed", "INT"), 32767),
    (SignalSpec("Small", "small", "SINT"), -128),
    (SignalSpec("Total", "total", "LINT"), 2**62),
    (SignalSpec("Ucount", "ucount", "UDINT"), 2**32 - 1),
    (SignalSpec("Flag", "flag", "BOOL"), True),
    (SignalSpec("Counts[3]", "counts-3", "DINT"), 77),
]


@pytest.mark.parametrize(("signal", "value"), WRITES, ids=[s.id for s, _ in WRITES])
def test_single_tag_write_and_read_back_without_a_tag_upload(connected, signal, value) -> None:
    # cpppo has no tag upload (workaround 1) and pycomm3 1.2.16 doubles a single write's
    # payload (workaround 2): both must hold for this write to land.
    driver, group = connected(signal)
    driver.write(signal, value)
    assert values(driver, group)[signal.id] == value


def test_one_multi_tag_read_per_group(connected) -> None:
    signals = [signal for signal, _ in WRITES]
    driver, group = connected(*signals)
    for signal, value in WRITES:
        driver.write(signal, value)
    assert values(driver, group) == {signal.id: value for signal, value in WRITES}


def test_arrays_and_bool_arrays(connected) -> None:
    counts = SignalSpec("Counts", "counts", "DINT", array_count=10)
    flags = SignalSpec("Flags", "flags", "BOOL", array_count=16)
    driver, group = connected(counts, flags)
    driver.write(counts, list(range(10, 20)))
    driver.write(flags, [i % 3 == 0 for i in range(16)])
    got = values(driver, group)
    assert got["Counts"] == list(range(10, 20))
    assert got["Flags"] == [i % 3 == 0 for i in range(16)]
    assert driver.describe()["packedBoolArrays"] == [], "cpppo stores BOOL per element"


def test_large_arrays_past_the_targets_reply_size(connected) -> None:
    # Workaround 3: cpppo answers "Insufficient Packet Space" past ~500 bytes; reads fall
    # back to fragments while writes keep the negotiated size.
    big = SignalSpec("Big", "big", "DINT", array_count=1000)
    head = SignalSpec("Big", "big-head", "DINT", array_count=200)
    driver, group = connected(big)
    driver.write(head, list(range(200)))
    got = values(driver, group)["Big"]
    assert got[:200] == list(range(200))
    assert got[200:] == [0] * 800


def test_an_array_longer_than_the_tag_is_bad_quality_not_trimmed(connected) -> None:
    driver, group = connected(
        SignalSpec("Counts", "counts", "DINT", array_count=12), SignalSpec("Temp", "t", "REAL")
    )
    readings = {r.signal_id: r for r in driver.read(group)}
    assert readings["Counts"].quality is Quality.BAD
    assert readings["Counts"].detail
    assert readings["Temp"].quality is Quality.GOOD, "one bad signal spoils nothing else"


def test_an_unknown_tag_is_a_bad_reading(logix: LogixSimulator) -> None:
    # Connected only: cpppo drops the whole session on an unconnected read of an unknown
    # tag (a real controller answers "path destination unknown").
    unknown = SignalSpec("Nope", "nope", "DINT")
    driver, group = driver_for(
        logix.endpoint, unknown, SignalSpec("Temp", "t", "REAL"), connected=True
    )
    driver.connect(5)
    readings = {r.signal_id: r for r in driver.read(group)}
    driver.close()
    assert readings["Nope"].quality is Quality.BAD
    assert readings["Temp"].quality is Quality.GOOD


def test_probe_and_describe(connected) -> None:
    driver, _ = connected(SignalSpec("Temp", "t", "REAL"))
    driver.probe()
    described = driver.describe()
    assert described["adapter"] == "ethernet-ip"
    assert "LOGIX" in described["productName"]


def test_a_lost_simulator_is_a_lost_connection(logix: LogixSimulator) -> None:
    driver, group = driver_for(logix.endpoint, SignalSpec("Temp", "t", "REAL"))
    driver.connect(5)
    logix.stop()
    with pytest.raises(DeviceError) as raised:
        driver.read(group)
    assert raised.value.connection_lost
    with pytest.raises(DeviceError) as probed:
        driver.probe()
    assert probed.value.connection_lost
    driver.close()


@pytest.mark.integration
def test_connect_to_nothing_fails_within_the_deadline() -> None:
    driver, _ = driver_for(f"127.0.0.1:{free_port()}", SignalSpec("Temp", "t", "REAL"))
    started = time.monotonic()
    with pytest.raises(DeviceError):
        driver.connect(1)
    assert time.monotonic() - started < 3


@server_fixture
def packed_logix(tmp_path: Path) -> Iterator[LogixSimulator]:
    """cpppo serving a BOOL[64] packed into DWORD[2], beside a BOOL[16] stored per element."""
    tags = ("PackedFlags=UDINT[2]", "Flags=BOOL[16]")
    module = "tests.cip.packed_logix"
    simulator = LogixSimulator(tags, tmp_path / "packed", module=module).start()
    yield simulator
    simulator.stop()


@pytest.mark.parametrize(
    "messaging", MESSAGING, ids=["connected", "unconnected", "unconnected-slot"]
)
def test_packing_is_observed_from_the_reply_unpacked_and_writes_refused(
    packed_logix: LogixSimulator, messaging: dict[str, Any]
) -> None:
    # arrayCount 40 is not a multiple of 32: two DWORDs are read and 40 booleans kept.
    packed = SignalSpec("PackedFlags", "packed", "BOOL", array_count=40)
    flags = SignalSpec("Flags", "flags", "BOOL", array_count=16)
    driver, group = driver_for(packed_logix.endpoint, packed, flags, **messaging)
    driver.connect(5)
    try:
        got = values(driver, group)
        assert got["PackedFlags"] == packed_bits(40)
        assert got["Flags"] == [False] * 16
        assert driver.describe()["packedBoolArrays"] == ["PackedFlags"], "only the packed tag"
        with pytest.raises(ValueError, match="packed"):
            driver.write(packed, [True] * 40)
        driver.write(flags, [True] * 16)
        got = values(driver, group)
        assert got["Flags"] == [True] * 16, "a BOOL array stored per element takes writes"
        assert got["PackedFlags"] == packed_bits(40), "the refused write changed nothing"
    finally:
        driver.close()
