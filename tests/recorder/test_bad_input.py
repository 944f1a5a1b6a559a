"""Bad input reaches the recorder: envelopes that are not signal updates, values of
unexpected types, topics outside its filters, garbage bytes, a full queue and a full disk.
Each is counted, logged and alarmed; the recorder keeps recording and every file it leaves
is a complete Parquet file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.recorder.conftest import (
    Alarms,
    Rig,
    data_topic,
    leftovers,
    parquet_files,
    read_with_duckdb,
    update,
    wait_for,
)
from tests.support.servers import require_binary
from unskit.envelope import MessageBuilder
from unskit.recorder.service import ALARM_INPUT, ALARM_OVERFLOW, ALARM_WRITE

pytestmark = pytest.mark.integration

T0 = 1_795_000_000_000


def sample(value, k=0):
    return {"value": value, "source_timestamp_ms": T0 + k, "server_timestamp_ms": T0 + k}


def test_what_is_not_a_signal_update_is_counted_and_alarmed(rig: Rig, tmp_path: Path):
    output = tmp_path / "out"
    recorder = rig.start_recorder(
        output, topics={"include": [f"{rig.root}/+/+/+/data/#"],
                        "exclude": [f"{rig.root}/+/+/noisy/data/#"]},
    )  # fmt: skip
    alarms = Alarms(rig.listener, rig.root)
    publisher = rig.listener
    root = rig.root
    publisher.publish(
        data_topic(root, "a"), MessageBuilder("Reading", "1.0").body({"v": 1}).build()
    )
    publisher.publish(data_topic(root, "a", instance="noisy"), update("a", [sample(1.0)]))
    # Outside every filter: the broker never hands it over, so nothing is counted for it.
    publisher.publish(f"{root}/gw/ethernet-ip-adapter/plc-1/evt/x", update("b", [sample(2.0)]))
    # Not an envelope at all: the messaging link rejects it before any subscription.
    publisher._local.transport.publish(data_topic(root, "junk"), b"\x00garbage", 1)
    odd = [sample({"nested": [1, {"x": None}]}, 1), sample(["a", 1], 2), sample([[1], [2]], 3)]
    publisher.publish(data_topic(root, "odd"), update("odd", odd))
    publisher.publish(data_topic(root, "good"), update("good", [sample(3.5, 4)]))

    wait_for(lambda: recorder.status()["samplesAccepted"] == 4, "the good and odd samples")
    wait_for(lambda: "raised" in alarms.states(ALARM_INPUT), "the input alarm")
    status = recorder.status()
    assert status["rejected"] == {"notSignalUpdate": 1, "excluded": 1}
    assert status["jsonValues"] == 3
    assert recorder.runtime.get_messaging().stats().rejected == 1
    # Cleared after a quiet second.
    wait_for(lambda: alarms.states(ALARM_INPUT)[-1:] == ["cleared"], "the input alarm cleared")

    assert recorder.call("flush")["closed"] == 1  # one partition: one file
    rows = {r[0]: r for r in read_with_duckdb(output) if r[0] == "good"}
    assert rows["good"][4] == 3.5
    values = sorted((r[1], r[4]) for r in read_with_duckdb(output) if r[0] == "odd")
    assert values == [
        (T0 + 1, {"nested": [1, {"x": None}]}),
        (T0 + 2, ["a", 1]),
        (T0 + 3, [[1], [2]]),
    ]


def test_outside_the_filters_is_counted_when_it_arrives(rig: Rig, tmp_path: Path):
    recorder = rig.start_recorder(tmp_path / "out")
    service = recorder.app.recorder
    assert service is not None
    # A topic the broker would not deliver under these filters, handed over directly (a
    # second subscription of the same client could deliver one).
    service._on_message(f"{rig.root}/gw/x/y/evt/info/z", update("z", [sample(1.0)]))
    assert recorder.status()["rejected"] == {"outsideFilters": 1}


@pytest.mark.slow
def test_a_full_queue_drops_counted_and_alarmed(rig: Rig, tmp_path: Path):
    recorder = rig.start_recorder(tmp_path / "out", queue={"maxMessages": 5})
    alarms = Alarms(rig.listener, rig.root)
    service = recorder.app.recorder
    assert service is not None
    count = 200
    # Holding the recorder's lock stalls its worker, as a slow disk would.
    with service._lock:
        for k in range(count):
            rig.listener.publish(data_topic(rig.root, "s"), update("s", [sample(float(k), k)]))
        wait_for(lambda: service.counts.overflow > 0, "the queue to overflow")
        wait_for(
            lambda: service.counts.overflow + service.queued() >= count - 1,
            "every message queued or dropped",
        )
    wait_for(lambda: "raised" in alarms.states(ALARM_OVERFLOW), "the overflow alarm")
    wait_for(
        lambda: service.counts.samples + service.counts.overflow == count,
        "every message recorded or counted as dropped",
    )
    status = recorder.status()
    assert status["queue"]["overflow"] == service.counts.overflow > 0
    assert status["queue"]["maxMessages"] == 5
    wait_for(lambda: alarms.states(ALARM_OVERFLOW)[-1:] == ["cleared"], "the alarm cleared")
    recorder.call("flush")
    assert len(read_with_duckdb(tmp_path / "out")) == service.counts.samples


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs: the recorder's output runs out of space on it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = require_binary("mount")
    subprocess.run([mount, "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run([require_binary("umount"), "-l", str(disk)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """Fills `disk` up to `leave` bytes free."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    with filler.open("wb") as handle:
        handle.write(b"\0" * max(free - leave, 0))
    return filler


@pytest.mark.slow
def test_a_full_disk_loses_the_open_file_only_and_leaves_no_partial_file(
    rig: Rig, small_disk: Path
):
    output = small_disk / "out"
    recorder = rig.start_recorder(output, rowGroupRows=200, compression={"codec": "none"})
    alarms = Alarms(rig.listener, rig.root)
    # One complete file first.
    rig.listener.publish(data_topic(rig.root, "s"), update("s", [sample("first", 0)]))
    wait_for(lambda: recorder.status()["samplesAccepted"] == 1, "the first sample")
    assert recorder.call("flush")["closed"] == 1
    filler = _fill(small_disk, 16 * 1024)
    text = "x" * 2000  # 200 of these per row group: far more than 16 KiB
    for k in range(4):
        samples = [sample(f"{text}{k}-{i}", 1 + k * 100 + i) for i in range(100)]
        rig.listener.publish(data_topic(rig.root, "s"), update("s", samples))
    wait_for(lambda: recorder.status()["writeErrors"] >= 1, "the write error")
    wait_for(lambda: "raised" in alarms.states(ALARM_WRITE), "the write alarm")
    status = recorder.status()
    assert "no space left" in status["lastError"]
    assert status["samplesLost"] >= 200
    assert [p for p in leftovers(output) if p.name.endswith(".tmp")] == []
    for path in parquet_files(output):
        assert pq.ParquetFile(path).metadata.num_rows >= 1  # each one complete
    # Room again: the recorder goes on, and the alarm clears with the next file closed.
    filler.unlink()
    accepted = recorder.status()["samplesAccepted"]
    rig.listener.publish(data_topic(rig.root, "s"), update("s", [sample("after", 999)]))
    wait_for(lambda: recorder.status()["samplesAccepted"] == accepted + 1, "the sample after")
    assert recorder.call("flush")["failed"] == 0
    wait_for(lambda: alarms.states(ALARM_WRITE)[-1:] == ["cleared"], "the write alarm cleared")
    values = [r[4] for r in read_with_duckdb(output)]
    assert "first" in values
    assert "after" in values
    assert json.dumps(values)  # every file read back whole
