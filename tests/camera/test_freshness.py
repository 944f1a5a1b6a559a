"""Capture freshness and the software-trigger capture mode on the sim camera: every capture
says how it knows its frame is new, and a frame that is provably the previous one fails
with STALE_FRAME under `freshness: require` (the RTSP and snapshot servers are in
test_rtsp.py and test_snapshot.py)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
import pytest

from tests.camera.conftest import CameraHarness, Rig, sim
from tests.support.tiers import server_fixture
from unskit.camera.backends import Acquired
from unskit.camera.codec import Frame
from unskit.camera.freshness import FreshnessMemory, fingerprint

PROFILES = {
    "strict": {"freshness": "require"},
    "lax": {"freshness": "warn"},
    "blind": {"freshness": "off"},
}


def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def trigger_camera(instance: str, **connection: Any) -> dict[str, Any]:
    return sim(instance, captureMode="software-trigger", **connection)


@server_fixture
def rig(harness: CameraHarness) -> Rig:
    return harness.start(
        {
            "cameras": [
                trigger_camera("trig", triggerDelayMs=40),
                # Every second trigger is answered by the previous frame.
                trigger_camera("repeating", repeatFrameEvery=2),
                sim("plain"),
                sim("failing", failFirst=1),
            ],
            "captureProfiles": PROFILES,
        }
    )


def test_a_software_trigger_then_a_frame_read_with_its_latency(rig: Rig) -> None:
    first = rig.call("capture", {"requestId": rid()}, "trig")
    second = rig.call("capture", {"requestId": rid()}, "trig")
    for body, trigger in ((first, 1), (second, 2)):
        assert body["captureMode"] == "software-trigger"
        assert "image" in body
        assert body["backendMetadata"]["triggerId"] == trigger
        # The sensor exposes for triggerDelayMs after the trigger: the latency includes it.
        assert body["backendMetadata"]["triggerToFrameMs"] >= 40
        fresh = body["freshness"]
        assert fresh["method"] == "trigger-latency"
        assert fresh["verdict"] == "fresh"
        assert fresh["evidence"]["frameTriggerId"] == trigger
        assert fresh["evidence"]["triggerToFrameMs"] == body["backendMetadata"]["triggerToFrameMs"]
    assert second["freshness"]["evidence"]["previousCaptureId"] == first["captureId"]
    # The sidecar beside the image carries the same evidence.
    sidecar = rig.output / second["image"]["metadataSidecarRelativePath"]
    assert json.loads(sidecar.read_text())["freshness"] == second["freshness"]
    assert second["freshness"]["evidence"]["identicalToPrevious"] is False
    status = rig.call("status", instance="trig")
    assert status["capabilities"]["captureModes"] == ["software-trigger"]
    started = rig.call("capture", {"requestId": rid(), "captureProfile": "strict"}, "plain")
    assert started["captureMode"] == "simulated"
    assert started["freshness"]["method"] == "first-capture"
    assert started["freshness"]["verdict"] == "unknown"


# Spec-style state table: (profile policy, frame) -> outcome of the capture.
TABLE = [
    ("strict", "fresh", "SUCCEEDED", "fresh"),
    ("strict", "repeated", "STALE_FRAME", "stale"),
    ("lax", "fresh", "SUCCEEDED", "fresh"),
    ("lax", "repeated", "SUCCEEDED", "stale"),
    ("blind", "fresh", "SUCCEEDED", "unchecked"),
    ("blind", "repeated", "SUCCEEDED", "unchecked"),
]


@pytest.mark.parametrize(("profile", "frame", "outcome", "verdict"), TABLE)
def test_freshness_policy_table(
    rig: Rig, profile: str, frame: str, outcome: str, verdict: str
) -> None:
    # Trigger 1 answers itself; trigger 2 is answered by frame 1 (repeatFrameEvery 2).
    rig.call("capture", {"requestId": rid(), "captureProfile": "lax"}, "repeating")
    if frame == "repeated":
        body = rig.call("capture", {"requestId": rid(), "captureProfile": profile}, "repeating")
    else:
        body = rig.call("capture", {"requestId": rid(), "captureProfile": profile}, "trig")
    assert body["freshness"]["policy"] == {"strict": "require", "lax": "warn"}.get(profile, "off")
    assert body["freshness"]["verdict"] == verdict
    if outcome == "SUCCEEDED":
        assert "image" in body
        assert "failure" not in body
    else:
        assert "image" not in body
        assert body["failure"]["code"] == outcome
        assert body["failure"]["stage"] == "acquisition"
        assert "trigger-latency" in body["failure"]["message"]
        status = rig.status(body["captureId"])
        assert status["state"] == "FAILED"
        assert status["errorCode"] == "STALE_FRAME"
        # Announced as failed, never as a new image.
        topic, message = rig.announced(body["captureId"])
        assert topic.endswith("/app/image/failed")
        assert message.body["freshness"] == body["freshness"]
    if verdict == "stale":
        evidence = body["freshness"]["evidence"]
        assert evidence["triggerId"] == 2
        assert evidence["frameTriggerId"] == 1
        assert evidence["identicalToPrevious"] is True
        assert evidence["perceptualDistance"] == 0


# Every terminal body where a frame was acquired carries its age: (camera, the capture
# before, profile) -> outcome, and whether a frame (and frameAgeMs) is in the body.
BODIES = [
    ("plain", None, "strict", "SUCCEEDED", True),
    ("plain", None, "blind", "SUCCEEDED", True),
    ("repeating", "lax", "strict", "STALE_FRAME", True),
    ("failing", None, "strict", "BACKEND_ERROR", False),
]


@pytest.mark.parametrize(("instance", "before", "profile", "outcome", "frame"), BODIES)
def test_every_terminal_body_with_a_frame_carries_its_age(
    rig: Rig, instance: str, before: str | None, profile: str, outcome: str, frame: bool
) -> None:
    if before is not None:
        rig.call("capture", {"requestId": rid(), "captureProfile": before}, instance)
    body = rig.call("capture", {"requestId": rid(), "captureProfile": profile}, instance)
    assert body.get("failure", {}).get("code", "SUCCEEDED") == outcome
    assert ("frame" in body) is frame
    assert ("frameAgeMs" in body) is frame
    if frame:
        # The sim draws its frame when asked: after the request.
        assert body["frameAgeMs"] == 0
        if profile != "blind":
            assert body["freshness"]["evidence"]["frameAgeMs"] == 0
            assert body["freshness"]["evidence"]["maxFrameAgeMs"] == 1000
    _, message = rig.announced(body["captureId"])
    assert message.body.get("frameAgeMs") == body.get("frameAgeMs")
    if "image" in body:
        sidecar = rig.output / body["image"]["metadataSidecarRelativePath"]
        assert json.loads(sidecar.read_text())["frameAgeMs"] == 0


def test_stale_counted(rig: Rig) -> None:
    rig.call("capture", {"requestId": rid(), "captureProfile": "lax"}, "repeating")
    rig.call("capture", {"requestId": rid(), "captureProfile": "lax"}, "repeating")
    counter = rig.runtime.metrics.counter("captures", "staleFrames", {"camera": "repeating"})
    assert counter.total == 1


@pytest.mark.unit
def test_the_judge_by_content_alone() -> None:
    rng = np.random.default_rng(5)
    pixels = np.asarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), np.uint8)
    memory = FreshnessMemory()

    def frame(data: np.ndarray[Any, np.dtype[np.uint8]]) -> Acquired:
        return Acquired(frame=Frame(data, "bgr8", "raw"), arrived_at=0.0)

    young = {"age_ms": 0, "max_age_ms": 1000}
    first = memory.judge("cap_1", frame(pixels), "require", **young)
    assert (first.verdict, first.body["method"]) == ("unknown", "first-capture")
    changed = pixels.copy()
    changed[0, 0, 0] ^= 1
    second = memory.judge("cap_2", frame(changed), "require", **young)
    assert (second.verdict, second.body["method"]) == ("fresh", "content-hash")
    # One bit differs: exactly different, perceptually the same picture.
    assert second.body["evidence"]["perceptualDistance"] == 0
    third = memory.judge("cap_3", frame(changed.copy()), "require", **young)
    assert (third.verdict, third.body["method"]) == ("stale", "content-hash")
    assert third.body["evidence"]["previousCaptureId"] == "cap_2"
    assert fingerprint(Frame(changed, "bgr8", "raw"))[0] == third.body["evidence"]["contentSha256"]


# The judge's age rule: (policy, frame age, maxFrameAgeMs) -> verdict and method, and
# whether the frame becomes the baseline of the next capture. A frame refused for its age
# under `require` does not: the capture waits for a newer one.
AGES = [
    ("require", 0, 500, "unknown", "first-capture", True),
    ("require", 500, 500, "unknown", "first-capture", True),
    ("require", 501, 500, "stale", "frame-age", False),
    ("warn", 501, 500, "stale", "frame-age", True),
    ("require", 3_600_000, 86_400_000, "unknown", "first-capture", True),
    ("off", 3_600_000, 0, "unchecked", None, False),
]


@pytest.mark.unit
@pytest.mark.parametrize(("policy", "age", "limit", "verdict", "method", "baseline"), AGES)
def test_the_judge_by_frame_age(
    policy: str, age: int, limit: int, verdict: str, method: str | None, baseline: bool
) -> None:
    memory = FreshnessMemory()
    rng = np.random.default_rng(9)
    pixels = np.asarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), np.uint8)
    acquired = Acquired(frame=Frame(pixels, "bgr8", "raw"), arrived_at=0.0)
    judged = memory.judge("cap_1", acquired, policy, age_ms=age, max_age_ms=limit)
    assert (judged.verdict, judged.body.get("method")) == (verdict, method)
    assert judged.too_old is (method == "frame-age")
    if policy != "off":
        assert judged.body["evidence"]["frameAgeMs"] == age
        assert judged.body["evidence"]["maxFrameAgeMs"] == limit
    again = memory.judge("cap_2", acquired, "warn", age_ms=0, max_age_ms=limit)
    # The same pixels again: provably the baseline's frame, if it became the baseline.
    assert (again.body["evidence"].get("previousCaptureId") == "cap_1") is baseline
    if baseline:
        assert (again.verdict, again.body["method"]) == ("stale", "content-hash")


@pytest.mark.unit
def test_a_frame_provably_the_previous_is_stale_by_that_even_when_young() -> None:
    memory = FreshnessMemory()
    pixels = np.zeros((16, 16, 3), np.uint8)
    acquired = Acquired(frame=Frame(pixels, "bgr8", "raw"), arrived_at=0.0)
    memory.judge("cap_1", acquired, "require", age_ms=0, max_age_ms=500)
    judged = memory.judge("cap_2", acquired, "require", age_ms=9_000, max_age_ms=500)
    # The stronger finding decides, and it is final (no newer frame is waited for).
    assert (judged.verdict, judged.body["method"], judged.too_old) == (
        "stale",
        "content-hash",
        False,
    )
