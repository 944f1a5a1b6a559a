"""The camera adapter end to end: `sim` 1920x1080 frames captured, JPEG-encoded, hashed,
written (image and sidecar, temp name and rename), committed to the catalog and announced,
counted when the announcement reaches a subscriber through Mosquitto; with fsync off and on.
Then the round trip of a deferred sb/capture at light load (one request at a time).

The anchor is the issue's target: 30 captures/s with fsync off, p99 below 150 ms. The time
split per stage comes from the terminal bodies' durationsMs."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.camera.conftest import CameraHarness, sim
from tests.support.servers import wait_until

from unskit.commands import reply_body
from unskit.envelope import Message

TARGET_RATE = 30.0
TARGET_P99_MS = 150.0
CAPTURES = 150
LATENCY_SAMPLES = 60
STAGES = ("queue", "acquisition", "encoding", "persistence", "total")


def _component(fsync: bool) -> dict[str, Any]:
    return {
        "cameras": [sim("cam-a", width=1920, height=1080), sim("cam-b", width=1920, height=1080)],
        "limits": {"maxQueuedCapturesPerCamera": 1000, "maxPendingCaptures": 1000},
        "storage": {"fsync": fsync},
    }


def _split(bodies: list[dict[str, Any]]) -> dict[str, float]:
    return {
        stage: round(statistics.mean(b["durationsMs"].get(stage, 0) for b in bodies), 1)
        for stage in STAGES
    }


def throughput(harness: CameraHarness, fsync: bool) -> tuple[float, dict[str, float]]:
    """Captures/s from the first submit to the last announcement received."""
    component = _component(fsync)
    document = harness.document(component, logging={"level": "WARNING"})
    document["component"]["storage"]["fsync"] = fsync
    rig = harness.start(component, document)
    bodies: list[dict[str, Any]] = []
    lock = threading.Lock()
    done = threading.Event()

    def count(_topic: str, message: Message) -> None:
        with lock:
            bodies.append(message.body)
            if len(bodies) >= CAPTURES:
                done.set()

    root = document["topic"]["root"]
    harness.clients[-1].subscribe(f"{root}/+/camera-adapter/+/app/image/captured", count)
    # Warm-up: the first capture of each camera builds its session.
    for camera in ("cam-a", "cam-b"):
        rig.call("capture", {"requestId": uuid.uuid4().hex}, camera)
    wait_until(lambda: len(bodies) >= 2, 10, "the warm-up announcements")
    with lock:
        bodies.clear()
    started = time.monotonic()
    futures = [
        rig.client.send(
            "capture-submit",
            {"requestId": uuid.uuid4().hex},
            instance=("cam-a", "cam-b")[i % 2],
            timeout=60,
        )
        for i in range(CAPTURES)
    ]
    for future in futures:
        reply_body(future.get())
    assert done.wait(120), f"only {len(bodies)} of {CAPTURES} captures announced"
    elapsed = time.monotonic() - started
    harness.stop(rig)
    return CAPTURES / elapsed, _split(bodies)


def latency(harness: CameraHarness) -> tuple[float, float, dict[str, float]]:
    """p50 and p99 (ms) of a deferred sb/capture, one request at a time."""
    component = _component(False)
    rig = harness.start(component, harness.document(component, logging={"level": "WARNING"}))
    rig.call("capture", {"requestId": uuid.uuid4().hex}, "cam-a")
    samples = []
    bodies = []
    for _ in range(LATENCY_SAMPLES):
        started = time.perf_counter()
        body = rig.call("capture", {"requestId": uuid.uuid4().hex}, "cam-a")
        samples.append((time.perf_counter() - started) * 1000)
        assert "image" in body, body
        bodies.append(body)
    harness.stop(rig)
    samples.sort()
    p50 = samples[len(samples) // 2]
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    return p50, p99, _split(bodies)


def test_camera_captures_per_second(benchmark, ratio, broker, tmp_path: Path) -> None:
    results: dict[str, Any] = {}

    def run() -> None:
        harness = CameraHarness(broker, tmp_path)
        try:
            results["off"] = throughput(harness, fsync=False)
            results["on"] = throughput(harness, fsync=True)
            results["latency"] = latency(harness)
        finally:
            harness.close()

    benchmark.pedantic(run, rounds=1, iterations=1)
    off_rate, off_split = results["off"]
    on_rate, on_split = results["on"]
    p50, p99, light_split = results["latency"]
    rows = [
        ratio(
            "camera sim 1920x1080 end to end, fsync off (captures/s)",
            off_rate,
            "target 30 captures/s",
            TARGET_RATE,
            stages_ms=off_split,
        ),
        ratio(
            "camera sim 1920x1080 end to end, fsync on (captures/s)",
            on_rate,
            "target 30 captures/s",
            TARGET_RATE,
            stages_ms=on_split,
        ),
        # As a rate, so the ratio reads like the others: 150 ms / p99.
        ratio(
            "camera deferred sb/capture p99 at light load (1/p99 s)",
            1000 / p99,
            "target p99 150 ms",
            1000 / TARGET_P99_MS,
            p50_ms=round(p50, 1),
            p99_ms=round(p99, 1),
            stages_ms=light_split,
        ),
    ]
    for row in rows:
        print(f"\n{row}")
    assert off_rate >= TARGET_RATE, rows[0]
    assert p99 < TARGET_P99_MS, rows[2]


PTZ_SAMPLES = 200


def ptz_round_trip(harness: CameraHarness) -> tuple[float, float]:
    """p50 and p99 (ms) of sb/ptz continuous then sb/ptz stop, one pair at a time."""
    component = {"cameras": [sim("cam", ptz={"enabled": True})]}
    rig = harness.start(component, harness.document(component, logging={"level": "WARNING"}))
    move = {"operation": "continuous", "velocity": {"pan": 0.01}, "timeoutMs": 10_000}
    stop = {"operation": "stop", "axes": ["pan"]}
    samples = []
    for _ in range(PTZ_SAMPLES):
        started = time.perf_counter()
        reply = rig.call("ptz", {**move, "requestId": uuid.uuid4().hex}, "cam")
        assert reply["stopDeadline"] is not None, reply
        reply = rig.call("ptz", {**stop, "requestId": uuid.uuid4().hex}, "cam")
        assert reply["state"] == "COMMANDED", reply
        samples.append((time.perf_counter() - started) * 1000)
    assert rig.call("ptz", {"operation": "status"}, "cam")["moving"] is False
    harness.stop(rig)
    samples.sort()
    p50 = samples[len(samples) // 2]
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    return p50, p99


def test_camera_ptz_continuous_then_stop(benchmark, ratio, broker, tmp_path: Path) -> None:
    results: dict[str, tuple[float, float]] = {}

    def run() -> None:
        harness = CameraHarness(broker, tmp_path)
        try:
            results["ptz"] = ptz_round_trip(harness)
        finally:
            harness.close()

    benchmark.pedantic(run, rounds=1, iterations=1)
    p50, p99 = results["ptz"]
    # No anchor exists (issue 20): the row is recorded against itself (ratio 1.00) so that
    # later changes compare their p50/p99 with these.
    row = ratio(
        "camera sim sb/ptz continuous+stop p99 (1/p99 s)",
        1000 / p99,
        "none (recorded baseline)",
        1000 / p99,
        p50_ms=round(p50, 2),
        p99_ms=round(p99, 2),
    )
    print(f"\n{row}")
