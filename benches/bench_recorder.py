"""Signal recorder: samples recorded per second, fed from MQTT (Mosquitto, QoS 1) through
our messaging client and the envelope codec into Parquet files written, zstd-compressed and
closed; the anchor is pyarrow writing the same rows from an in-memory table in the same run
(the ceiling, not a peer). Two rows: signal updates carrying 100 samples each (what the
adapters publish with a batch window, `batchMs`) and one sample each (no batching)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as paho
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from benches.conftest import connected_client
from unskit import MessageBuilder
from unskit.envelope import Identity
from unskit.recorder.config import RecorderSettings, RollPolicy
from unskit.recorder.service import Recorder

SAMPLES = 200_000
SIGNALS = 20
START_MS = 1_795_000_000_000


def _messages(root: str, per_message: int) -> list[tuple[str, bytes]]:
    """SAMPLES samples over SIGNALS signals, `per_message` to an update, pre-encoded."""
    out = []
    identity = Identity("site/device", "plant-1/gw", "ethernet-ip-adapter", "plc-1")
    per_signal = SAMPLES // SIGNALS
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
        share_group=None,
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


def _publisher(port: int) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex[:8]}")
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    connected = threading.Event()
    client.on_connect = lambda *_: connected.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert connected.wait(10)
    return client


def _record(port: int, per_message: int, output: Path) -> float:
    root = f"b{uuid.uuid4().hex[:8]}"
    messages = _messages(root, per_message)
    messaging = connected_client(port)
    recorder = Recorder(_settings(root, output), messaging).start()
    publisher = _publisher(port)
    try:
        assert messaging.subscriptions_acknowledged() or _wait(messaging.subscriptions_acknowledged)
        started = time.perf_counter()
        for topic, payload in messages:
            publisher.publish(topic, payload, qos=1)
        deadline = time.monotonic() + 300
        while recorder.counts.samples < SAMPLES:
            assert time.monotonic() < deadline, f"{recorder.counts.samples} of {SAMPLES}"
            time.sleep(0.005)  # polling a counter in a bench, not a test's synchronisation
        recorder.flush()
        elapsed = time.perf_counter() - started
    finally:
        publisher.loop_stop()
        publisher.disconnect()
        recorder.stop()
        messaging.close(5)
    status = recorder.status()
    assert status["samplesRecorded"] == SAMPLES, status
    assert status["writeErrors"] == 0
    return SAMPLES / elapsed


def _wait(condition) -> bool:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return True


def _anchor(recorded: Path, scratch: Path) -> float:
    """pyarrow writing the same rows (read back from our files) from memory, zstd 3."""
    table = ds.dataset(recorded, format="parquet").to_table()
    assert table.num_rows == SAMPLES
    best = 0.0
    for attempt in range(3):
        target = scratch / f"anchor-{attempt}.parquet"
        started = time.perf_counter()
        pq.write_table(table, target, compression="zstd", compression_level=3)
        elapsed = time.perf_counter() - started
        best = max(best, SAMPLES / elapsed)
    return best


@pytest.mark.parametrize("per_message", [100, 1])
def test_samples_recorded_per_second(broker, ratio, tmp_path, per_message):
    output = tmp_path / "out"
    ours = _record(broker.plain_port, per_message, output)
    anchor = _anchor(output, tmp_path)
    row = ratio(
        f"recorder.samples_per_s.{per_message}_per_message",
        ours,
        "pyarrow write_table (in-memory, zstd 3)",
        anchor,
    )
    print(f"\n{row}")
    if per_message == 100:
        assert ours >= 100_000, row
        assert row["ratio"] >= 0.5, row
