"""Signal recorder: samples recorded per second, fed from MQTT (Mosquitto, QoS 1) through
our messaging client and the envelope codec into Parquet files written, zstd-compressed and
closed; the anchor is pyarrow writing the same rows from an in-memory table in the same run
(the ceiling, not a peer). Three rows: signal updates carrying 1000, 100 (what the adapters
publish with a batch window, `batchMs`) and 1 sample each (no batching)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from benches.conftest import connected_client
from benches.recorder_feed import write
from unskit import MessageBuilder
from unskit.envelope import Identity
from unskit.recorder.config import RecorderSettings, RollPolicy
from unskit.recorder.service import Recorder

SAMPLES = 200_000
SIGNALS = 20
START_MS = 1_795_000_000_000


def _total(per_message: int) -> int:
    # One sample per message is a message-rate bench: fewer samples keep it within minutes.
    return SAMPLES if per_message >= 100 else SAMPLES // 10


def _messages(root: str, per_message: int) -> list[tuple[str, bytes]]:
    """_total() samples over SIGNALS signals, `per_message` to an update, pre-encoded."""
    out = []
    identity = Identity("site/device", "plant-1/gw", "ethernet-ip-adapter", "plc-1")
    per_signal = _total(per_message) // SIGNALS
    for s in range(SIGNALS):
        topic = f"{root}/gw/ethernet-ip-adapter/plc-1/data/sig{s}"
        for start in range(0, per_signal, per_message):
            samples = [
                {
                    "value": (k * 0.5 if s % 2 else k),
                    "quality": "GOOD",
                    "source_timestamp_ms": START_MS + k,
                    "server_timestamp_ms": START_MS + k + 1,
                }
                for k in range(start, min(start + per_message, per_signal))
            ]
            message = (
                MessageBuilder("SouthboundSignalUpdate", "1.0")
                .identity(identity)
                .signal_update(f"sig{s}", samples, name=f"Program:Main.Sig{s}")
                .build()
            )
            out.append((topic, message.to_bytes()))
    return out


def _settings(root: str, output: Path) -> RecorderSettings:
    return RecorderSettings(
        include=(f"{root}/+/+/+/data/#",),
        exclude=(),
        group=None,
        queue_messages=1_000_000,
        output=output,
        partition_by=("date", "hour", "device", "component", "instance"),
        fsync=True,
        max_open_files=64,
        roll=RollPolicy(max_rows=10_000_000, max_bytes=1 << 40, max_seconds=3600),
        row_group_rows=65_536,
        codec="zstd",
        level=3,
        variant=False,
        flush_on_stop=True,
    )


def _record(port: int, per_message: int, output: Path, scratch: Path) -> float:
    root = f"b{uuid.uuid4().hex[:8]}"
    feed = scratch / f"feed-{per_message}.bin"
    write(feed, _messages(root, per_message))
    messaging = connected_client(port)
    recorder = Recorder(_settings(root, output), messaging).start()
    # The publisher runs in its own process, as an adapter would.
    publisher = subprocess.Popen(
        [sys.executable, "-m", "benches.recorder_feed", str(port), str(feed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(messaging.subscriptions_acknowledged)
        assert publisher.stdin is not None
        assert publisher.stdout is not None
        assert publisher.stdout.readline().strip() == "ready"  # connected, file read
        started = time.perf_counter()
        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        deadline = time.monotonic() + 300
        total = _total(per_message)
        while recorder.counts.samples < total:
            assert time.monotonic() < deadline, f"{recorder.counts.samples} of {total}"
            time.sleep(0.005)  # polling a counter in a bench, not a test's synchronisation
        recorder.flush()
        elapsed = time.perf_counter() - started
    finally:
        publisher.communicate(timeout=60)
        recorder.stop()
        messaging.close(5)
    status = recorder.status()
    assert status["samplesRecorded"] == total, status
    assert status["writeErrors"] == 0
    return total / elapsed


def _wait(condition) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _anchor(recorded: Path, scratch: Path) -> float:
    """pyarrow writing the same rows (read back from our files) from memory, zstd 3."""
    table = ds.dataset(recorded, format="parquet").to_table()
    best = 0.0
    for attempt in range(3):
        target = scratch / f"anchor-{attempt}.parquet"
        started = time.perf_counter()
        pq.write_table(table, target, compression="zstd", compression_level=3)
        elapsed = time.perf_counter() - started
        best = max(best, table.num_rows / elapsed)
    return best


@pytest.mark.parametrize("per_message", [1000, 100, 1])
def test_samples_recorded_per_second(broker, ratio, tmp_path, per_message):
    output = tmp_path / "out"
    ours = _record(broker.plain_port, per_message, output, tmp_path)
    anchor = _anchor(output, tmp_path)
    row = ratio(
        f"recorder.samples_per_s.{per_message}_per_message",
        ours,
        "pyarrow write_table (in-memory, zstd 3)",
        anchor,
    )
    print(f"\n{row}")
    if per_message == 100:
        # The issue's absolute target, with the batch size the adapters' batchMs gives. The
        # 0.5x ratio is recorded, not asserted: see docs/decisions.md (signal recorder).
        assert ours >= 100_000, row
