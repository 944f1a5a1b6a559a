"""Live reload of the camera adapter (reload-config): per camera, a changed camera restarts
alone with its queued work kept or failed with a documented code, added and removed cameras
start and stop, profile and limit changes apply to new captures, an invalid candidate is
rejected whole, and evt/info/config-applied lists what changed."""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, Rig, sim
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.errors import CommandError

Document = dict[str, Any]


def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def base() -> dict[str, Any]:
    return {
        # c is slow: a reload lands while its first capture is in hand.
        "cameras": [sim("a"), sim("b"), sim("c", latencyMs=1500)],
        "captureProfiles": {"hq": {"quality": 95}},
    }


def cameras(document: Document) -> list[dict[str, Any]]:
    return list(document["component"]["cameras"])


def camera(document: Document, instance: str) -> dict[str, Any]:
    return next(c for c in document["component"]["cameras"] if c["instance"] == instance)


@server_fixture
def rig(harness: CameraHarness) -> Rig:
    return harness.start(base())


def changed(rig: Rig, change: Callable[[Document], None]) -> Document:
    document = copy.deepcopy(rig.document)
    change(document)
    return document


def add_d(doc: Document) -> None:
    doc["component"]["cameras"].append(sim("d"))


def remove_b(doc: Document) -> None:
    doc["component"]["cameras"] = [c for c in cameras(doc) if c["instance"] != "b"]


def narrow_b(doc: Document) -> None:
    camera(doc, "b")["connection"]["width"] = 160


def lower_quality(doc: Document) -> None:
    doc["component"]["captureProfiles"]["hq"]["quality"] = 10


def fewer_queued(doc: Document) -> None:
    doc["component"]["limits"] = {"maxQueuedCapturesPerCamera": 7}


def lifecycle_on(doc: Document) -> None:
    doc["component"]["global"] = {"operatorEvents": {"captureLifecycle": True}}


def nothing(doc: Document) -> None:
    pass


def check_added(rig: Rig) -> None:
    assert "image" in rig.call("capture", {"requestId": rid()}, "d")


def check_removed(rig: Rig) -> None:
    assert rig.error("capture", {"requestId": rid()}, "b") == "NO_SUCH_INSTANCE"
    assert [c["instance"] for c in rig.call("list")["cameras"]] == ["a", "c"]


def check_narrowed(rig: Rig) -> None:
    # The pause flag is the operator's: a restart keeps it.
    assert rig.call("status", instance="b")["paused"] is True
    rig.call("resume", instance="b")
    body = rig.call("capture", {"requestId": rid()}, "b")
    assert body["frame"]["width"] == 160
    assert rig.call("status", instance="b")["generation"] == 2
    assert rig.call("status", instance="a")["generation"] == 1


def check_quality(rig: Rig) -> None:
    low = rig.call("capture", {"requestId": rid(), "captureProfile": "hq"}, "a")
    assert "image" in low


def check_limits(rig: Rig) -> None:
    assert rig.call("queue-status")["limits"]["maxQueuedCapturesPerCamera"] == 7


def check_lifecycle(rig: Rig) -> None:
    body = rig.call("capture", {"requestId": rid()}, "a")
    topic = f"{rig.runtime.topics.topic('evt', instance='a')}/info/capture-started"
    wait_until(lambda: rig.seen.on(topic), 10, "capture-started after the reload")
    assert rig.seen.on(topic)[0].body["context"]["captureId"] == body["captureId"]


def check_nothing(rig: Rig) -> None:
    assert rig.call("status", instance="a")["generation"] == 1


# The reload table: change -> reload-config reply -> what the adapter then does.
ROWS = [
    pytest.param(nothing, [], [], ["a", "b", "c"], [], check_nothing, id="unchanged"),
    pytest.param(add_d, ["d"], [], ["a", "b", "c"], [], check_added, id="camera-added"),
    pytest.param(remove_b, [], ["b"], ["a", "c"], [], check_removed, id="camera-removed"),
    pytest.param(narrow_b, ["b"], [], ["a", "c"], [], check_narrowed, id="camera-changed"),
    pytest.param(
        lower_quality, [], [], ["a", "b", "c"], ["captureProfiles"], check_quality, id="profile"
    ),
    pytest.param(fewer_queued, [], [], ["a", "b", "c"], ["limits"], check_limits, id="limits"),
    pytest.param(lifecycle_on, [], [], ["a", "b", "c"], ["global"], check_lifecycle, id="global"),
]


@pytest.mark.parametrize(("change", "started", "stopped", "kept", "sections", "check"), ROWS)
def test_reload_table(
    rig: Rig,
    change: Callable[[Document], None],
    started: list[str],
    stopped: list[str],
    kept: list[str],
    sections: list[str],
    check: Callable[[Rig], None],
) -> None:
    rig.call("pause", instance="b")
    reply = rig.reload(changed(rig, change))
    expected: dict[str, Any] = {"started": started, "stopped": stopped, "kept": kept, "skipped": []}
    if sections:
        expected["changed"] = sections
    assert reply == expected
    applied = rig.runtime.topics.topic("evt", "info", "config-applied")
    wait_until(lambda: rig.seen.on(applied), 10, "config-applied")
    assert rig.seen.on(applied)[0].body["context"] == expected
    check(rig)


def test_reload_config_is_enabled(rig: Rig) -> None:
    verbs = {v["verb"]: v for v in rig.call("describe")["verbs"]}
    assert verbs["sb/reload-config"]["enabled"] is True


def submit_three(rig: Rig, instance: str, profile: str | None = None) -> list[str]:
    """Three captures of a slow camera: the first in flight, two queued behind it."""
    body: dict[str, Any] = {} if profile is None else {"captureProfile": profile}
    ids = [
        rig.call("capture-submit", {"requestId": rid(), **body}, instance)["captureId"]
        for _ in range(3)
    ]
    wait_until(lambda: rig.status(ids[0])["state"] == "ACQUIRING", 10, "the first in flight")
    assert [rig.status(i)["state"] for i in ids[1:]] == ["QUEUED", "QUEUED"]
    return ids


def narrow_c(doc: Document) -> None:
    camera(doc, "c")["connection"]["width"] = 160


def disable_c(doc: Document) -> None:
    camera(doc, "c")["enabled"] = False


def trigger_c(doc: Document) -> None:
    camera(doc, "c")["connection"]["captureMode"] = "software-trigger"


def remove_c(doc: Document) -> None:
    doc["component"]["cameras"] = [c for c in cameras(doc) if c["instance"] != "c"]


# A restarted or removed camera's queued captures: (change, queued outcome, failure code).
QUEUED = [
    pytest.param(narrow_c, "SUCCEEDED", None, id="changed-kept"),
    pytest.param(disable_c, "FAILED", "CAMERA_DISABLED", id="disabled"),
    pytest.param(trigger_c, "FAILED", "DEVICE_UNAVAILABLE", id="capture-mode-changed"),
    pytest.param(remove_c, "FAILED", "NO_SUCH_INSTANCE", id="removed"),
]


@pytest.mark.parametrize(("change", "state", "code"), QUEUED)
def test_queued_work_of_a_restarted_camera(
    rig: Rig, change: Callable[[Document], None], state: str, code: str | None
) -> None:
    ids = submit_three(rig, "c")
    rig.reload(changed(rig, change))
    # The capture in hand finishes on the camera as it was.
    first = rig.terminal(ids[0])
    assert first["state"] == "SUCCEEDED"
    assert first["result"]["frame"]["width"] == 320
    for capture_id in ids[1:]:
        job = rig.terminal(capture_id)
        assert job["state"] == state
        assert job["errorCode"] == code
        if code is None:
            # Kept: run by the restarted camera.
            assert job["result"]["frame"]["width"] == 160
        else:
            assert job["result"]["failure"]["stage"] == "queue"
            assert "configuration reload" in job["errorMessage"]
            topic, _ = rig.announced(capture_id)
            assert topic.endswith("/app/image/failed")
    # Other cameras never stopped.
    assert "image" in rig.call("capture", {"requestId": rid()}, "a")


def test_a_queued_capture_keeps_the_profile_it_was_admitted_with(harness: CameraHarness) -> None:
    component = {
        "cameras": [sim("noisy", pattern="noise", latencyMs=800)],
        "captureProfiles": {"hq": {"quality": 95}},
    }
    rig = harness.start(component)
    ids = submit_three(rig, "noisy", "hq")
    document = copy.deepcopy(rig.document)
    document["component"]["captureProfiles"]["hq"]["quality"] = 5
    assert rig.reload(document)["changed"] == ["captureProfiles"]
    after = rig.call("capture", {"requestId": rid(), "captureProfile": "hq"}, "noisy")
    before = [rig.terminal(i)["result"]["image"]["bytes"] for i in ids]
    # Noise at quality 95 is several times larger than at quality 5.
    assert min(before) > 3 * after["image"]["bytes"]


def bad_backend(doc: Document) -> None:
    camera(doc, "a")["backend"] = "nope"


def unknown_profile(doc: Document) -> None:
    camera(doc, "a")["defaultCaptureProfile"] = "missing"


def duplicate(doc: Document) -> None:
    doc["component"]["cameras"].append(sim("a"))


def moved_output(doc: Document) -> None:
    doc["component"]["storage"]["outputRoot"] += "-elsewhere"


def metadata_bound(doc: Document) -> None:
    doc["component"]["limits"] = {"maxMetadataBytes": 100}


# Candidates rejected whole: (change, a fragment of the error naming the field).
INVALID = [
    pytest.param(bad_backend, "backend", id="schema"),
    pytest.param(unknown_profile, "defaultCaptureProfile", id="unknown-profile"),
    pytest.param(duplicate, "duplicate instance", id="duplicate-instance"),
    pytest.param(moved_output, "storage.outputRoot", id="restart-only-storage"),
    pytest.param(metadata_bound, "limits.maxMetadataBytes", id="restart-only-metadata"),
]


@pytest.mark.parametrize(("change", "named"), INVALID)
def test_an_invalid_candidate_is_rejected_whole(
    rig: Rig, change: Callable[[Document], None], named: str
) -> None:
    document = changed(rig, change)
    # A valid change beside the invalid one is not applied either.
    document["component"]["cameras"].append(sim("d"))
    with pytest.raises(CommandError) as raised:
        rig.reload(document)
    assert raised.value.code == "BAD_ARGS"
    assert named in raised.value.message
    assert "running one kept" in raised.value.message
    assert [c["instance"] for c in rig.call("list")["cameras"]] == ["a", "b", "c"]
    assert rig.call("status", instance="a")["generation"] == 1
    assert "image" in rig.call("capture", {"requestId": rid()}, "a")
    applied = rig.runtime.topics.topic("evt", "info", "config-applied")
    assert rig.seen.on(applied) == []


def test_verbs_answer_device_unavailable_while_a_reload_drains(harness: CameraHarness) -> None:
    # The reload waits for c's capture in hand: seconds in which every verb is refused.
    rig = harness.start({"cameras": [sim("a"), sim("c", latencyMs=4000)]})
    ids = [rig.call("capture-submit", {"requestId": rid()}, "c")["captureId"]]
    wait_until(lambda: rig.status(ids[0])["state"] == "ACQUIRING", 10, "in flight")
    replies: list[dict[str, Any]] = []
    reloading = threading.Thread(
        target=lambda: replies.append(rig.reload(changed(rig, narrow_c))), daemon=True
    )
    reloading.start()
    codes: set[str] = set()

    def refused() -> bool:
        try:
            rig.call("status", instance="a")
        except CommandError as error:
            codes.add(error.code)
        return "DEVICE_UNAVAILABLE" in codes or not reloading.is_alive()

    wait_until(refused, 20, "a verb refused while the reload drains", interval=0.02)
    reloading.join(20)
    assert "DEVICE_UNAVAILABLE" in codes
    assert replies
    assert replies[0]["started"] == ["c"]
    assert rig.terminal(ids[0])["state"] == "SUCCEEDED"


@pytest.mark.slow
def test_a_capture_in_hand_past_the_restart_wait_fails_device_unavailable(
    harness: CameraHarness,
) -> None:
    rig = harness.start({"cameras": [sim("a"), sim("stuck", latencyMs=30_000)]})
    capture_id = rig.call("capture-submit", {"requestId": rid(), "timeoutMs": 60_000}, "stuck")[
        "captureId"
    ]
    wait_until(lambda: rig.status(capture_id)["state"] == "ACQUIRING", 10, "in flight")
    document = copy.deepcopy(rig.document)
    camera(document, "stuck")["connection"]["latencyMs"] = 0
    # The reload waits RESTART_WAIT_S (5 s) for the capture in hand, then fails it.
    assert rig.reload(document)["started"] == ["stuck"]
    job = rig.terminal(capture_id)
    assert job["state"] == "FAILED"
    assert job["errorCode"] == "DEVICE_UNAVAILABLE"
    assert job["result"]["failure"]["stage"] == "acquisition"
    # The restarted camera captures at once.
    assert "image" in rig.call("capture", {"requestId": rid()}, "stuck")
