"""sb/discover end to end: one WS-Discovery pass to 50 simulated responders (unicast UDP on
loopback, each a distinct device with its own endpoint and device service), their
ProbeMatches collected, each identified by a credential-free GetDeviceInformation over SOAP,
and the first page of candidates returned through Mosquitto.

No anchor exists (issue 20): the row is recorded against itself (ratio 1.00) so that later
changes compare their pass times with these."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.camera.conftest import CameraHarness, sim
from tests.support.onvif_device import DiscoveryResponders, OnvifDevice

RESPONDERS = 50
PASSES = 20


def discover_passes(harness: CameraHarness) -> tuple[float, float, float]:
    """p50, p99 and mean (ms) of an sb/discover pass over RESPONDERS devices."""
    device = OnvifDevice(vendor="bench", model="cam")
    responders = DiscoveryResponders([device], count=RESPONDERS)
    try:
        component: dict[str, Any] = {
            "cameras": [sim("cam")],
            "discovery": {
                "enabled": True,
                "multicast": False,
                "probeAddresses": responders.addresses,
            },
        }
        rig = harness.start(component, harness.document(component, logging={"level": "WARNING"}))
        # Warm-up: the first pass loads the device WSDL (once per process).
        rig.call("discover", {"timeoutMs": 30_000, "limit": 1000})
        samples = []
        for _ in range(PASSES):
            started = time.perf_counter()
            reply = rig.call("discover", {"timeoutMs": 30_000, "limit": 1000})
            samples.append((time.perf_counter() - started) * 1000)
            candidates = reply["candidates"]
            assert len(candidates) == RESPONDERS, len(candidates)
            assert all(
                c["vendor"] == "bench" and not c["capabilities"]["warnings"] for c in candidates
            )
        harness.stop(rig)
    finally:
        responders.close()
        device.close()
    assert device.invalid == []
    assert device.errors == []
    samples.sort()
    p50 = samples[len(samples) // 2]
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    return p50, p99, sum(samples) / len(samples)


def test_camera_discover_50_responders(benchmark, ratio, broker, tmp_path: Path) -> None:
    results: dict[str, tuple[float, float, float]] = {}

    def run() -> None:
        harness = CameraHarness(broker, tmp_path)
        try:
            results["discover"] = discover_passes(harness)
        finally:
            harness.close()

    benchmark.pedantic(run, rounds=1, iterations=1)
    p50, p99, mean = results["discover"]
    row = ratio(
        f"camera sb/discover pass, {RESPONDERS} ONVIF responders (passes/s at p50)",
        1000 / p50,
        "none (recorded baseline)",
        1000 / p50,
        p50_ms=round(p50, 1),
        p99_ms=round(p99, 1),
        mean_ms=round(mean, 1),
    )
    print(f"\n{row}")
