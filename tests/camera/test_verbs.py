"""Every camera-adapter verb and error row of the specification, over a real Mosquitto."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, Rig, sim
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.camera.jobs import JobState


def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def fleet() -> dict[str, Any]:
    """Three sim cameras (one disabled, one slow), two profiles, a small group cap."""
    return {
        "cameras": [
            sim("cam-1"),
            sim("cam-2"),
            sim("slow", latencyMs=60_000),
            sim("off", enabled=False),
        ],
        "captureProfiles": {
            "thumb": {"quality": 80, "thumbnail": {"size": "small"}},
            "rtsp-only": {"captureMode": "rtsp-frame"},
        },
        "limits": {"maxCamerasPerGroup": 3, "maxMetadataBytes": 64},
    }


@server_fixture
def rig(harness: CameraHarness) -> Rig:
    return harness.start(fleet())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- sb/capture and sb/capture-submit -----------------------------------------------------------


def test_capture_replies_with_the_terminal_body_and_announces_it_once(rig: Rig) -> None:
    request_id = rid()
    body = rig.call("capture", {"requestId": request_id, "metadata": {"lot": 7}}, "cam-1")
    assert body["schemaVersion"] == 1
    assert body["captureId"].startswith("cap_")
    assert body["eventId"].startswith("evt_")
    assert body["cameraId"] == "cam-1"
    assert body["trigger"] == {"type": "command", "requestId": request_id}
    assert body["captureProfile"] == "default"
    assert body["captureMode"] == "simulated"
    assert body["metadata"] == {"lot": 7}
    assert "failure" not in body
    assert "thumbnail" not in body
    image = body["image"]
    path = Path(image["absolutePath"])
    assert path == rig.output / image["relativePath"]
    assert image["fileUri"] == path.as_uri()
    assert (image["contentType"], image["encoding"]) == ("image/jpeg", "jpeg")
    assert image["bytes"] == path.stat().st_size
    assert image["sha256"] == sha256(path)
    sidecar = json.loads((rig.output / image["metadataSidecarRelativePath"]).read_text())
    assert sidecar["captureId"] == body["captureId"]
    assert sidecar["image"]["sha256"] == image["sha256"]
    assert body["frame"] == {
        "width": 320,
        "height": 240,
        "pixelFormat": "bgr8",
        "sourceEncoding": "raw",
    }
    assert body["camera"]["backend"] == "sim"
    stamps = body["timestamps"]
    assert {"requestedAt", "acquisitionStartedAt", "cameraFrameAt", "frameReceivedAt"} <= set(
        stamps
    )
    assert stamps["persistedAt"] >= stamps["requestedAt"]
    assert stamps["cameraFrameTimestampQuality"] == "device"
    durations = body["durationsMs"]
    assert set(durations) == {"queue", "acquisition", "encoding", "persistence", "total"}
    assert durations["total"] >= durations["acquisition"]

    topic, message = rig.announced(body["captureId"])
    assert topic == rig.runtime.topics.topic("app", "image", "captured", instance="cam-1")
    assert message.header.name == "ImageCaptured"
    assert message.header.version == "1.0"
    assert message.correlation_id == body["correlationId"]
    assert message.body == body
    assert len(rig.announcements(body["captureId"])) == 1
    # sb/capture-status is authoritative and carries the same body.
    status = rig.status(body["captureId"])
    assert status["state"] == "SUCCEEDED"
    assert status["result"] == body
    assert status["instance"] == "cam-1"
    assert status["errorCode"] is None


def test_capture_submit_replies_at_once_and_the_capture_finishes(rig: Rig) -> None:
    reply = rig.call("capture-submit", {"requestId": rid()}, "cam-2")
    assert reply["captureId"].startswith("cap_")
    assert reply["state"] in ("ACCEPTED", "QUEUED")
    assert reply["statusVerb"] == "sb/capture-status"
    assert reply["acceptedAt"].endswith("Z")
    status = rig.terminal(reply["captureId"])
    assert status["state"] == "SUCCEEDED"
    assert Path(status["result"]["image"]["absolutePath"]).exists()


def test_a_single_camera_is_used_when_the_component_scope_names_none(
    harness: CameraHarness,
) -> None:
    rig = harness.start({"cameras": [sim("only")]})
    body = rig.call("capture", {"requestId": rid()})
    assert body["cameraId"] == "only"


def test_a_retry_returns_the_original_outcome_and_other_arguments_conflict(rig: Rig) -> None:
    request_id = rid()
    first = rig.call("capture-submit", {"requestId": request_id}, "cam-1")
    again = rig.call("capture-submit", {"requestId": request_id}, "cam-1")
    assert again == first
    code = rig.error("capture-submit", {"requestId": request_id, "timeoutMs": 5000}, "cam-1")
    assert code == "IDEMPOTENCY_CONFLICT"
    deferred = rig.call("capture", {"requestId": rid()}, "cam-1")
    assert deferred["trigger"]["type"] == "command"


def test_thumbnail_is_only_in_the_announcement(rig: Rig) -> None:
    body = rig.call("capture", {"requestId": rid(), "captureProfile": "thumb"}, "cam-1")
    assert "thumbnail" not in body
    _, message = rig.announced(body["captureId"])
    thumb = message.body["thumbnail"]
    assert thumb["encoding"] == "jpeg"
    assert (thumb["width"], thumb["height"]) == (160, 120)
    assert isinstance(thumb["data"], bytes)
    assert thumb["data"].startswith(b"\xff\xd8")
    assert thumb["bytes"] == len(thumb["data"])
    assert "thumbnail" not in rig.status(body["captureId"])["result"]
    sidecar = rig.output / body["image"]["metadataSidecarRelativePath"]
    assert "thumbnail" not in json.loads(sidecar.read_text())


CAPTURE_ERRORS = [
    ("no instance with several cameras", {}, None, "BAD_ARGS"),
    ("unknown field", {"colour": "red"}, "cam-1", "BAD_ARGS"),
    ("topic and body instance differ", {"instance": "cam-2"}, "cam-1", "BAD_ARGS"),
    ("unknown camera", {}, "cam-9", "NO_SUCH_INSTANCE"),
    ("unknown camera in the body", {"instance": "cam-9"}, None, "NO_SUCH_INSTANCE"),
    ("bad instance token", {"instance": "a/b"}, None, "BAD_ARGS"),
    ("disabled camera", {}, "off", "CAMERA_DISABLED"),
    ("unknown profile", {"captureProfile": "nope"}, "cam-1", "UNKNOWN_CAPTURE_PROFILE"),
    ("profile too long", {"captureProfile": "p" * 129}, "cam-1", "BAD_ARGS"),
    ("profile of another mode", {"captureProfile": "rtsp-only"}, "cam-1", "UNSUPPORTED_CAPABILITY"),
    ("timeout below 1000", {"timeoutMs": 999}, "cam-1", "BAD_ARGS"),
    ("timeout above 1800000", {"timeoutMs": 1_800_001}, "cam-1", "BAD_ARGS"),
    ("metadata too large", {"metadata": {"x": "y" * 80}}, "cam-1", "BAD_ARGS"),
    ("metadata not an object", {"metadata": [1]}, "cam-1", "BAD_ARGS"),
]


@pytest.mark.parametrize("verb", ["capture", "capture-submit"])
@pytest.mark.parametrize(
    ("case", "body", "instance", "code"), CAPTURE_ERRORS, ids=[c[0] for c in CAPTURE_ERRORS]
)
def test_capture_errors(
    rig: Rig, verb: str, case: str, body: dict[str, Any], instance: str | None, code: str
) -> None:
    assert rig.error(verb, {"requestId": rid(), **body}, instance) == code


@pytest.mark.parametrize("verb", ["capture", "capture-submit"])
def test_capture_requires_a_request_id(rig: Rig, verb: str) -> None:
    assert rig.error(verb, {}, "cam-1") == "BAD_ARGS"
    assert rig.error(verb, {"requestId": ""}, "cam-1") == "BAD_ARGS"
    assert rig.error(verb, {"requestId": "x" * 257}, "cam-1") == "BAD_ARGS"
    assert rig.error(verb, {"requestId": "a\nb"}, "cam-1") == "BAD_ARGS"


def test_failure_body_for_a_backend_error(harness: CameraHarness) -> None:
    rig = harness.start({"cameras": [sim("flaky", failFirst=1)]})
    body = rig.call("capture", {"requestId": rid()})
    assert body["failure"]["code"] == "BACKEND_ERROR"
    assert body["failure"]["stage"] == "acquisition"
    assert body["failure"]["retriable"] is True
    assert body["failure"]["message"]
    assert "image" not in body
    topic, message = rig.announced(body["captureId"])
    assert topic.endswith("/flaky/app/image/failed")
    assert message.header.name == "ImageCaptureFailed"
    status = rig.status(body["captureId"])
    assert (status["state"], status["errorCode"]) == ("FAILED", "BACKEND_ERROR")
    # The next grab succeeds: the failure was the camera's, not the adapter's.
    assert "image" in rig.call("capture", {"requestId": rid()})
    assert rig.call("status", instance="flaky")["lastError"] is None


def test_a_camera_slower_than_the_timeout_fails_with_capture_timeout(
    harness: CameraHarness,
) -> None:
    rig = harness.start({"cameras": [sim("slow", latencyMs=60_000)]})
    body = rig.call("capture", {"requestId": rid(), "timeoutMs": 1000})
    assert body["failure"]["code"] == "CAPTURE_TIMEOUT"
    assert body["failure"]["stage"] == "acquisition"
    assert 1000 <= body["durationsMs"]["total"] < 5000
    assert rig.status(body["captureId"])["state"] == "FAILED"


def test_a_queued_capture_times_out_in_the_queue(harness: CameraHarness) -> None:
    rig = harness.start({"cameras": [sim("slow", latencyMs=60_000)]})
    first = rig.call("capture-submit", {"requestId": rid(), "timeoutMs": 30_000})
    body = rig.call("capture", {"requestId": rid(), "timeoutMs": 1000})
    assert body["failure"]["code"] == "CAPTURE_TIMEOUT"
    assert body["failure"]["stage"] == "queue"
    rig.call("capture-cancel", {"requestId": rid(), "captureId": first["captureId"]})


# -- admission ----------------------------------------------------------------------------------


def wait_state(rig: Rig, capture_id: str, state: str) -> None:
    wait_until(lambda: rig.status(capture_id)["state"] == state, 10, f"{capture_id} {state}")


def test_queue_full_when_the_camera_queue_is_at_capacity(harness: CameraHarness) -> None:
    rig = harness.start(
        {"cameras": [sim("slow", latencyMs=60_000)], "limits": {"maxQueuedCapturesPerCamera": 1}}
    )
    running = rig.call("capture-submit", {"requestId": rid()})
    wait_state(rig, running["captureId"], "ACQUIRING")
    queued = rig.call("capture-submit", {"requestId": rid()})
    assert queued["state"] == "QUEUED"
    request_id = rid()
    assert rig.error("capture-submit", {"requestId": request_id}) == "QUEUE_FULL"
    queue = rig.call("queue-status")
    assert queue["cameras"] == [{"instance": "slow", "queued": 1, "capacity": 1}]
    assert queue["durableBacklog"] == 1
    assert queue["durableInFlight"] == 1
    assert queue["durable"]["ACQUIRING"] == 1
    # A refusal of the moment is not remembered: the same requestId runs once there is room.
    rig.call("capture-cancel", {"requestId": rid(), "captureId": queued["captureId"]})
    assert rig.call("capture-submit", {"requestId": request_id})["state"] == "QUEUED"
    rig.call("queue-clear", {"requestId": rid(), "allCameras": True, "includeInFlight": True})


@pytest.mark.parametrize(
    "limits",
    [{"maxPendingCaptures": 1}, {"maxInFlightBytes": 320 * 240 * 3 + 1}],
    ids=["pending", "bytes"],
)
def test_resource_limit_across_the_component(
    harness: CameraHarness, limits: dict[str, int]
) -> None:
    rig = harness.start({"cameras": [sim("slow", latencyMs=60_000), sim("b")], "limits": limits})
    first = rig.call("capture-submit", {"requestId": rid()}, "slow")
    # A capture holds its frame's bytes from the start of its acquisition, not from admission.
    wait_state(rig, first["captureId"], "ACQUIRING")
    assert rig.error("capture-submit", {"requestId": rid()}, "b") == "RESOURCE_LIMIT"
    rig.call("queue-clear", {"requestId": rid(), "allCameras": True, "includeInFlight": True})
    assert "image" in rig.call("capture", {"requestId": rid()}, "b")


def test_pause_refuses_new_captures_and_resume_admits_them(rig: Rig) -> None:
    assert rig.call("pause", instance="cam-1") == {"id": "cam-1", "paused": True, "changed": True}
    assert rig.call("pause", instance="cam-1")["changed"] is False
    assert rig.call("status", instance="cam-1")["paused"] is True
    assert rig.error("capture", {"requestId": rid()}, "cam-1") == "PAUSED"
    assert (
        rig.error("capture-group", {"requestId": rid(), "instances": ["cam-1", "cam-2"]})
        == "PAUSED"
    )
    # Read-only verbs and the other cameras are unaffected.
    assert "image" in rig.call("capture", {"requestId": rid()}, "cam-2")
    assert rig.call("resume", instance="cam-1") == {
        "id": "cam-1",
        "paused": False,
        "changed": True,
    }
    assert rig.call("resume", instance="cam-1")["changed"] is False
    assert "image" in rig.call("capture", {"requestId": rid()}, "cam-1")


@pytest.mark.parametrize("verb", ["pause", "resume"])
def test_pause_and_resume_addressing(rig: Rig, verb: str) -> None:
    assert rig.error(verb, {}, None) == "BAD_ARGS"
    assert rig.error(verb, {}, "cam-9") == "NO_SUCH_INSTANCE"
    assert rig.error(verb, {"instance": "cam-2"}, "cam-1") == "BAD_ARGS"
    assert rig.error(verb, {"requestId": "x"}, "cam-1") == "BAD_ARGS"
    assert rig.call(verb, {"instance": "cam-2"})["id"] == "cam-2"


# -- groups -------------------------------------------------------------------------------------


def test_capture_group_replies_when_every_member_is_terminal(rig: Rig) -> None:
    request_id = rid()
    reply = rig.call(
        "capture-group",
        {
            "requestId": request_id,
            "instances": ["cam-2", "cam-1"],
            "profileOverrides": {"cam-1": "thumb"},
            "metadata": {"line": 3},
        },
    )
    assert reply["captureGroupId"].startswith("grp_")
    assert reply["requestId"] == request_id
    assert reply["state"] == "COMPLETED"
    members = reply["members"]
    assert [m["cameraId"] for m in members] == ["cam-2", "cam-1"]
    assert [m["captureProfile"] for m in members] == ["default", "thumb"]
    for member in members:
        assert member["captureGroupId"] == reply["captureGroupId"]
        assert member["groupSize"] == 2
        assert member["trigger"] == {"type": "group-command", "requestId": request_id}
        assert member["metadata"] == {"line": 3}
        assert Path(member["image"]["absolutePath"]).exists()
    # GroupRequest and Group lookups, paged.
    page = rig.call("capture-status", {"requestId": request_id, "limit": 1})
    assert page["group"]["captureGroupId"] == reply["captureGroupId"]
    assert page["group"]["state"] == "COMPLETED"
    assert page["group"]["result"]["members"] == members
    assert len(page["members"]) == 1
    assert page["nextCursor"]
    rest = rig.call(
        "capture-status",
        {"requestId": request_id, "limit": 1, "cursor": page["nextCursor"]},
    )
    assert rest["nextCursor"] is None
    assert [m["instance"] for m in page["members"] + rest["members"]] == ["cam-2", "cam-1"]
    by_id = rig.call("capture-status", {"captureGroupId": reply["captureGroupId"]})
    assert [m["captureId"] for m in by_id["members"]] == [m["captureId"] for m in members]


def test_capture_group_submit_and_a_partial_group(harness: CameraHarness) -> None:
    rig = harness.start({"cameras": [sim("good"), sim("bad", failFirst=1)]})
    request_id = rid()
    reply = rig.call(
        "capture-group-submit", {"requestId": request_id, "instances": ["good", "bad"]}
    )
    assert reply["captureGroupId"].startswith("grp_")
    assert reply["state"] in ("ACCEPTED", "QUEUED")
    assert [m["instance"] for m in reply["members"]] == ["good", "bad"]
    for member in reply["members"]:
        rig.terminal(member["captureId"])
    page = rig.call("capture-status", {"captureGroupId": reply["captureGroupId"]})
    assert page["group"]["state"] == "PARTIAL"
    assert page["group"]["terminalAtMs"] is not None
    assert [m["state"] for m in page["members"]] == ["SUCCEEDED", "FAILED"]
    # The same requestId on the deferred sibling is the same namespace, other arguments.
    assert (
        rig.error("capture-group", {"requestId": request_id, "instances": ["good", "bad"]})
        == "IDEMPOTENCY_CONFLICT"
    )


GROUP_ERRORS = [
    ("one camera", {"instances": ["cam-1"]}, None, "BAD_ARGS"),
    ("no instances field", {}, None, "BAD_ARGS"),
    ("duplicates", {"instances": ["cam-1", "cam-1"]}, None, "BAD_ARGS"),
    ("above the cap", {"instances": ["cam-1", "cam-2", "slow", "off"]}, None, "GROUP_TOO_LARGE"),
    ("unknown member", {"instances": ["cam-1", "cam-9"]}, None, "NO_SUCH_INSTANCE"),
    ("disabled member", {"instances": ["cam-1", "off"]}, None, "CAMERA_DISABLED"),
    (
        "override outside instances",
        {"instances": ["cam-1", "cam-2"], "profileOverrides": {"slow": "thumb"}},
        None,
        "BAD_ARGS",
    ),
    (
        "unknown override profile",
        {"instances": ["cam-1", "cam-2"], "profileOverrides": {"cam-2": "nope"}},
        None,
        "UNKNOWN_CAPTURE_PROFILE",
    ),
    (
        "unknown profile",
        {"instances": ["cam-1", "cam-2"], "captureProfile": "nope"},
        None,
        "UNKNOWN_CAPTURE_PROFILE",
    ),
    ("instance on the topic", {"instances": ["cam-1", "cam-2"]}, "cam-1", "BAD_ARGS"),
    (
        "instance in the body",
        {"instances": ["cam-1", "cam-2"], "instance": "cam-1"},
        None,
        "BAD_ARGS",
    ),
    ("timeout out of range", {"instances": ["cam-1", "cam-2"], "timeoutMs": 10}, None, "BAD_ARGS"),
]


@pytest.mark.parametrize("verb", ["capture-group", "capture-group-submit"])
@pytest.mark.parametrize(
    ("case", "body", "instance", "code"), GROUP_ERRORS, ids=[c[0] for c in GROUP_ERRORS]
)
def test_capture_group_errors(
    rig: Rig, verb: str, case: str, body: dict[str, Any], instance: str | None, code: str
) -> None:
    assert rig.error(verb, {"requestId": rid(), **body}, instance) == code
    # All or nothing: a refused group wrote no durable work.
    assert rig.call("capture-status", {"states": ["ACCEPTED", "QUEUED"]})["jobs"] == []


# -- capture-status -----------------------------------------------------------------------------


def test_capture_status_camera_request_and_list_modes(rig: Rig) -> None:
    request_id = rid()
    body = rig.call("capture", {"requestId": request_id}, "cam-2")
    found = rig.call("capture-status", {"requestId": request_id}, "cam-2")
    assert found["captureId"] == body["captureId"]
    found = rig.call("capture-status", {"requestId": request_id, "instance": "cam-2"})
    assert found["captureId"] == body["captureId"]
    assert rig.error("capture-status", {"requestId": request_id}, "cam-1") == "CAPTURE_NOT_FOUND"
    for _ in range(2):
        rig.call("capture", {"requestId": rid()}, "cam-2")
    page = rig.call("capture-status", {"states": ["SUCCEEDED"], "instance": "cam-2", "limit": 2})
    assert len(page["jobs"]) == 2
    assert all(job["instance"] == "cam-2" for job in page["jobs"])
    rest = rig.call(
        "capture-status",
        {"states": ["SUCCEEDED"], "instance": "cam-2", "limit": 2, "cursor": page["nextCursor"]},
    )
    assert rest["nextCursor"] is None
    ids = [job["captureId"] for job in page["jobs"] + rest["jobs"]]
    assert len(set(ids)) == 3
    assert body["captureId"] in ids
    # A capture addressed to another camera is not found there.
    assert (
        rig.error("capture-status", {"captureId": body["captureId"]}, "cam-1")
        == "CAPTURE_NOT_FOUND"
    )


STATUS_ERRORS = [
    ("empty", {}, None, "BAD_ARGS"),
    ("ambiguous", {"captureId": "cap_x", "requestId": "r"}, None, "BAD_ARGS"),
    ("capture and group", {"captureId": "cap_x", "captureGroupId": "grp_x"}, None, "BAD_ARGS"),
    ("capture with paging", {"captureId": "cap_x", "limit": 5}, None, "BAD_ARGS"),
    ("missing capture", {"captureId": "cap_missing"}, None, "CAPTURE_NOT_FOUND"),
    ("missing group", {"captureGroupId": "grp_missing"}, None, "CAPTURE_NOT_FOUND"),
    ("missing group request", {"requestId": "nobody"}, None, "CAPTURE_NOT_FOUND"),
    ("group with instance", {"captureGroupId": "grp_x"}, "cam-1", "BAD_ARGS"),
    ("empty states", {"states": []}, None, "BAD_ARGS"),
    ("unknown state", {"states": ["DONE"]}, None, "BAD_ARGS"),
    ("repeated state", {"states": ["FAILED", "FAILED"]}, None, "BAD_ARGS"),
    ("limit 0", {"states": ["FAILED"], "limit": 0}, None, "BAD_ARGS"),
    ("limit 1001", {"states": ["FAILED"], "limit": 1001}, None, "BAD_ARGS"),
    ("foreign cursor", {"states": ["FAILED"], "cursor": "abc"}, None, "BAD_ARGS"),
    ("id too long", {"captureId": "c" * 257}, None, "BAD_ARGS"),
    ("unknown field", {"captureId": "cap_x", "verbose": True}, None, "BAD_ARGS"),
    ("unknown camera", {"states": ["FAILED"]}, "cam-9", "NO_SUCH_INSTANCE"),
]


@pytest.mark.parametrize(
    ("case", "body", "instance", "code"), STATUS_ERRORS, ids=[c[0] for c in STATUS_ERRORS]
)
def test_capture_status_errors(
    rig: Rig, case: str, body: dict[str, Any], instance: str | None, code: str
) -> None:
    assert rig.error("capture-status", body, instance) == code


# -- cancel and queue-clear ---------------------------------------------------------------------


def test_cancel_a_queued_and_an_in_flight_capture(rig: Rig) -> None:
    running = rig.call("capture-submit", {"requestId": rid()}, "slow")
    wait_state(rig, running["captureId"], "ACQUIRING")
    queued = rig.call("capture-submit", {"requestId": rid()}, "slow")
    for target in (queued, running):
        reply = rig.call(
            "capture-cancel",
            {"requestId": rid(), "captureId": target["captureId"], "reason": "test"},
        )
        assert reply == {
            "captureId": target["captureId"],
            "cancelled": True,
            "state": "CANCELLED",
            "cancellationInProgress": False,
        }
        topic, message = rig.announced(target["captureId"])
        assert topic.endswith("/slow/app/image/cancelled")
        assert message.header.name == "ImageCaptureCancelled"
        assert "image" not in message.body
        assert "failure" not in message.body
        status = rig.status(target["captureId"])
        assert (status["state"], status["errorCode"]) == ("CANCELLED", "CAPTURE_CANCELLED")
        assert status["errorMessage"] == "test"
    again = rig.call("capture-cancel", {"requestId": rid(), "captureId": running["captureId"]})
    assert (again["cancelled"], again["state"]) == (False, "CANCELLED")
    # Admission capacity came back.
    assert rig.call("queue-status", instance="slow")["durableInFlight"] == 0


def test_cancel_a_group(rig: Rig) -> None:
    group = rig.call("capture-group-submit", {"requestId": rid(), "instances": ["slow", "cam-1"]})
    rig.terminal(group["members"][1]["captureId"])
    reply = rig.call(
        "capture-cancel", {"requestId": rid(), "captureGroupId": group["captureGroupId"]}
    )
    assert reply["captureGroupId"] == group["captureGroupId"]
    assert (reply["cancelledMembers"], reply["unchangedMembers"]) == (1, 1)
    assert [(m["instance"], m["cancelled"], m["state"]) for m in reply["members"]] == [
        ("slow", True, "CANCELLED"),
        ("cam-1", False, "SUCCEEDED"),
    ]
    page = rig.call("capture-status", {"captureGroupId": group["captureGroupId"]})
    assert page["group"]["state"] == "PARTIAL"


CANCEL_ERRORS = [
    ("no target", {}, "BAD_ARGS"),
    ("two targets", {"captureId": "cap_x", "captureGroupId": "grp_x"}, "BAD_ARGS"),
    ("missing capture", {"captureId": "cap_missing"}, "CAPTURE_NOT_FOUND"),
    ("missing group", {"captureGroupId": "grp_missing"}, "CAPTURE_NOT_FOUND"),
    ("reason too long", {"captureId": "cap_x", "reason": "r" * 1025}, "BAD_ARGS"),
    ("instance", {"captureId": "cap_x", "instance": "cam-1"}, "BAD_ARGS"),
]


@pytest.mark.parametrize(("case", "body", "code"), CANCEL_ERRORS, ids=[c[0] for c in CANCEL_ERRORS])
def test_capture_cancel_errors(rig: Rig, case: str, body: dict[str, Any], code: str) -> None:
    assert rig.error("capture-cancel", {"requestId": rid(), **body}) == code


def test_capture_cancel_requires_a_request_id(rig: Rig) -> None:
    assert rig.error("capture-cancel", {"captureId": "cap_x"}) == "BAD_ARGS"


def test_queue_clear_backlog_then_in_flight(harness: CameraHarness) -> None:
    rig = harness.start({"cameras": [sim("slow", latencyMs=60_000), sim("other")]})
    ids = [rig.call("capture-submit", {"requestId": rid()}, "slow")["captureId"] for _ in range(3)]
    wait_state(rig, ids[0], "ACQUIRING")
    reply = rig.call("queue-clear", {"requestId": rid()}, "slow")
    assert reply == {"cancelled": 2, "alreadyTerminal": 0, "failed": []}
    assert [rig.status(i)["state"] for i in ids] == ["ACQUIRING", "CANCELLED", "CANCELLED"]
    for capture_id in ids[1:]:
        rig.announced(capture_id)
    reply = rig.call(
        "queue-clear", {"requestId": rid(), "allCameras": True, "includeInFlight": True}
    )
    assert reply["cancelled"] == 1
    assert rig.status(ids[0])["state"] == "CANCELLED"
    queue = rig.call("queue-status")
    assert (queue["durableBacklog"], queue["durableInFlight"], queue["dispatchQueued"]) == (0, 0, 0)


QUEUE_CLEAR_ERRORS = [
    ("no target", {}, None, "BAD_ARGS"),
    ("allCameras false", {"allCameras": False}, None, "BAD_ARGS"),
    ("both targets", {"allCameras": True}, "slow", "BAD_ARGS"),
    ("unknown camera", {}, "cam-9", "NO_SUCH_INSTANCE"),
    ("bad includeInFlight", {"allCameras": True, "includeInFlight": "yes"}, None, "BAD_ARGS"),
]


@pytest.mark.parametrize(
    ("case", "body", "instance", "code"), QUEUE_CLEAR_ERRORS, ids=[c[0] for c in QUEUE_CLEAR_ERRORS]
)
def test_queue_clear_errors(
    rig: Rig, case: str, body: dict[str, Any], instance: str | None, code: str
) -> None:
    assert rig.error("queue-clear", {"requestId": rid(), **body}, instance) == code


def test_queue_clear_requires_a_request_id(rig: Rig) -> None:
    assert rig.error("queue-clear", {"allCameras": True}) == "BAD_ARGS"


def test_queue_status_fields(rig: Rig) -> None:
    queue = rig.call("queue-status")
    assert set(queue["admission"]) == {
        "availableAcquisitions",
        "availableResourceGroupAcquisitions",
        "availableMemoryBytes",
        "outstandingDiskBytes",
        "availableEncoders",
        "availableWriters",
    }
    assert queue["limits"] == {
        "maxConcurrentCaptures": 4,
        "maxInFlightBytes": 512 * 1024 * 1024,
        "maxQueuedCapturesPerCamera": 32,
        "maxPendingCaptures": 256,
    }
    assert [c["instance"] for c in queue["cameras"]] == ["cam-1", "cam-2", "slow", "off"]
    assert set(queue["durable"]) == {"ACCEPTED", "QUEUED", "ACQUIRING", "ENCODING", "PERSISTING"}
    one = rig.call("queue-status", instance="cam-2")
    assert [c["instance"] for c in one["cameras"]] == ["cam-2"]
    assert rig.error("queue-status", {"verbose": True}) == "BAD_ARGS"


# -- cameras ------------------------------------------------------------------------------------


def test_list_compact_full_and_paged(rig: Rig) -> None:
    listed = rig.call("list")
    assert listed["cameras"][0] == {
        "instance": "cam-1",
        "enabled": True,
        "state": "ONLINE",
        "backend": "sim",
    }
    assert listed["cameras"][3]["state"] == "DISABLED"
    assert listed["unconfigured"] == []
    assert listed["nextCursor"] is None
    full = rig.call("list", {"includeCapabilities": True, "limit": 3})
    assert len(full["cameras"]) == 3
    first = full["cameras"][0]
    assert first["capabilities"]["captureModes"] == ["simulated"]
    assert first["capabilities"]["ptz"] is False
    assert first["capabilitiesDigest"].startswith("sha256:")
    assert {"generation", "connectedAt", "lastError", "updatedAt"} <= set(first)
    rest = rig.call("list", {"includeCapabilities": True, "limit": 3, "cursor": full["nextCursor"]})
    assert [c["instance"] for c in rest["cameras"]] == ["off"]
    assert rest["nextCursor"] is None
    assert rig.call("list", {"includeUnconfigured": True})["unconfigured"] == []
    assert rig.error("list", {}, "cam-1") == "BAD_ARGS"
    assert rig.error("list", {"limit": 0}) == "BAD_ARGS"
    assert rig.error("list", {"cursor": ""}) == "BAD_ARGS"


def test_status_of_one_camera_and_of_all(rig: Rig) -> None:
    one = rig.call("status", instance="cam-2")
    assert one["instance"] == "cam-2"
    assert one["paused"] is False
    assert one["state"] == "ONLINE"
    every = rig.call("status")
    assert [c["instance"] for c in every["cameras"]] == ["cam-1", "cam-2", "slow", "off"]
    assert all("paused" in c for c in every["cameras"])
    assert every["messaging"]["local"]["connected"] is True
    assert every["messaging"]["local"]["endpoint"].startswith("127.0.0.1:")
    assert rig.error("status", {}, "cam-9") == "NO_SUCH_INSTANCE"


def test_reconnect_drops_the_session(rig: Rig) -> None:
    before = rig.call("status", instance="cam-1")["generation"]
    reply = rig.call("reconnect", {"requestId": rid(), "reason": "test"}, "cam-1")
    assert reply["operationId"].startswith("op_")
    assert (reply["instance"], reply["state"]) == ("cam-1", "ACCEPTED")
    assert rig.call("status", instance="cam-1")["generation"] == before + 1
    assert "image" in rig.call("capture", {"requestId": rid()}, "cam-1")
    assert rig.error("reconnect", {"requestId": rid()}, "off") == "CAMERA_DISABLED"
    assert rig.error("reconnect", {"requestId": rid()}) == "BAD_ARGS"
    assert rig.error("reconnect", {}, "cam-1") == "BAD_ARGS"
    # Unaffected by pause.
    rig.call("pause", instance="cam-1")
    assert rig.call("reconnect", {"requestId": rid()}, "cam-1")["state"] == "ACCEPTED"


def test_describe_lists_every_verb_and_the_unbuilt_ones_disabled(rig: Rig) -> None:
    verbs = {v["verb"]: v for v in rig.call("describe")["verbs"]}
    expected = {
        "sb/capture": ("instance", "deferred", "required"),
        "sb/capture-submit": ("instance", "immediate", "required"),
        "sb/capture-group": ("component", "deferred", "required"),
        "sb/capture-group-submit": ("component", "immediate", "required"),
        "sb/capture-cancel": ("component", "immediate", "required"),
        "sb/capture-status": ("both", "immediate", "none"),
        "sb/list": ("component", "immediate", "none"),
        "sb/discover": ("component", "immediate", "none"),
        "sb/status": ("both", "immediate", "none"),
        "sb/queue-status": ("both", "immediate", "none"),
        "sb/queue-clear": ("both", "immediate", "required"),
        "sb/reconnect": ("instance", "immediate", "required"),
        "sb/pause": ("instance", "immediate", "none"),
        "sb/resume": ("instance", "immediate", "none"),
        "sb/ptz": ("instance", "immediate", "conditional"),
        "sb/ptz-presets": ("instance", "immediate", "conditional"),
    }
    for name, (scope, kind, request_id) in expected.items():
        assert (verbs[name]["scope"], verbs[name]["kind"], verbs[name]["requestId"]) == (
            scope,
            kind,
            request_id,
        ), name
    assert verbs["sb/discover"]["enabled"] is False
    assert "discovery.enabled" in verbs["sb/discover"]["reason"]
    assert rig.error("discover") == "UNSUPPORTED_CAPABILITY"
    # PTZ is built; these cameras have no ptz section, so PTZ is off on them.
    assert verbs["sb/ptz"]["enabled"] is True
    assert verbs["sb/ptz-presets"]["enabled"] is True
    assert rig.error("ptz", {"operation": "status"}, "cam-1") == "PTZ_DISABLED"
    assert rig.error("ptz-presets", {"operation": "list"}, "cam-1") == "PTZ_DISABLED"


# -- schedules and events -----------------------------------------------------------------------


def test_schedules_fire_and_are_held_while_paused(harness: CameraHarness) -> None:
    schedule = {"id": "tick", "intervalMs": 200}
    rig = harness.start({"cameras": [sim("cam", schedules=[schedule])]})

    def scheduled() -> list[dict[str, Any]]:
        return rig.call("capture-status", {"states": ["SUCCEEDED"]})["jobs"]

    wait_until(lambda: len(scheduled()) >= 2, 10, "two scheduled captures")
    result = scheduled()[0]["result"]
    assert result["trigger"]["type"] == "schedule"
    assert result["trigger"]["scheduleId"] == "tick"
    assert result["trigger"]["intendedFireTime"].endswith("Z")
    _, message = rig.announced(result["captureId"])
    assert message.header.name == "ImageCaptured"

    rig.call("pause", instance="cam")
    paused_ms = time.time_ns() // 1_000_000
    held = rig.runtime.metrics.counter("schedules", "held", {"camera": "cam"})
    wait_until(lambda: held.total >= 3, 10, "three held fires")
    every = rig.call("capture-status", {"states": [s.value for s in JobState]})["jobs"]
    # Nothing was accepted while paused.
    assert max(job["acceptedAtMs"] for job in every) <= paused_ms
    count = len(scheduled())
    rig.call("resume", instance="cam")
    wait_until(lambda: len(scheduled()) > count, 10, "a scheduled capture after resume")


def test_lifecycle_events_when_enabled(harness: CameraHarness) -> None:
    rig = harness.start(
        {
            "cameras": [sim("cam")],
            "global": {"operatorEvents": {"captureLifecycle": True}},
        }
    )
    body = rig.call("capture", {"requestId": rid()})
    base = rig.runtime.topics.topic("evt", instance="cam")
    queued = f"{base}/debug/capture-queued"
    started = f"{base}/info/capture-started"
    wait_until(lambda: rig.seen.on(queued) and rig.seen.on(started), 10, "lifecycle events")
    context = rig.seen.on(queued)[0].body["context"]
    assert context == {
        "captureId": body["captureId"],
        "trigger": "command",
        "captureProfile": "default",
        "queuePosition": 1,
    }
    assert rig.seen.on(started)[0].body["context"]["captureMode"] == "simulated"


def test_no_lifecycle_events_by_default(rig: Rig) -> None:
    body = rig.call("capture", {"requestId": rid()}, "cam-1")
    rig.announced(body["captureId"])
    assert not [t for t in rig.seen.topics() if "/evt/" in t and "capture-" in t]


def test_a_thumbnail_too_big_for_the_message_is_dropped_and_counted(
    harness: CameraHarness,
) -> None:
    rig = harness.start(
        {
            "cameras": [sim("noisy", width=1280, height=720, pattern="noise")],
            "captureProfiles": {"big": {"thumbnail": {"size": "large"}}},
        }
    )
    body = rig.call("capture", {"requestId": rid(), "captureProfile": "big"})
    _, message = rig.announced(body["captureId"])
    assert "thumbnail" not in message.body
    assert message.body == body
    assert rig.runtime.metrics.counter("captures", "thumbnailsDropped").total == 1


def test_a_deferred_capture_without_reply_to_is_reply_required(rig: Rig) -> None:
    from unskit.envelope import MessageBuilder

    request = MessageBuilder("CommandRequest", "1.0").body({"requestId": rid()}).build()
    rig.client.messaging.publish(rig.client.topic("capture", "cam-1"), request)
    replies = rig.runtime.metrics.counter(
        "commands", "replies", {"verb": "capture", "outcome": "REPLY_REQUIRED"}
    )
    wait_until(lambda: replies.total == 1, 10, "the REPLY_REQUIRED outcome")
    assert rig.call("capture-status", {"states": [s.value for s in JobState]})["jobs"] == []


@pytest.mark.slow
def test_stopping_fails_the_backlog_and_interrupts_what_runs(harness: CameraHarness) -> None:
    component = {"cameras": [sim("slow", latencyMs=60_000)]}
    document = harness.document(component)
    rig = harness.start(component, document)
    running = rig.call("capture-submit", {"requestId": rid()})
    wait_state(rig, running["captureId"], "ACQUIRING")
    queued = rig.call("capture-submit", {"requestId": rid()})
    harness.stop(rig)
    rig.announced(queued["captureId"])
    after = harness.start(component, document)
    stopped = after.status(queued["captureId"])
    assert (stopped["state"], stopped["errorCode"]) == ("FAILED", "COMPONENT_STOPPING")
    assert stopped["result"]["failure"]["stage"] == "queue"
    interrupted = after.status(running["captureId"])
    assert (interrupted["state"], interrupted["errorCode"]) == (
        "INTERRUPTED",
        "PROCESS_INTERRUPTED",
    )
    assert interrupted["result"]["failure"]["stage"] == "acquisition"
