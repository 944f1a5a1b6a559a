"""sb/ptz and sb/ptz-presets on the sim camera's simulated head: every operation, every bound
and code of the specification's tables, CAMERA_MOVING, schedule-skipped, pause, and the
head's position visible in the captured image."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from tests.camera.conftest import CameraHarness, Rig, sim
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.errors import CommandError

PRESETS = [
    {"name": "door", "pan": -0.5, "tilt": 0.25, "zoom": 0.2},
    {"name": "gate", "pan": 0.75, "tilt": -0.5},
    {"name": "yard"},
]


def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def fleet() -> dict[str, Any]:
    """A PTZ camera (fast head, presets, mutation allowed), a PTZ camera without preset
    mutation, one without PTZ and a disabled one."""
    return {
        "cameras": [
            sim(
                "ptz",
                ptzSpeed=4.0,
                presets=PRESETS,
                ptz={
                    "enabled": True,
                    "allowPresetMutation": True,
                    "maximumContinuousMoveMs": 20_000,
                    "home": {"pan": 0.1, "tilt": -0.2, "zoom": 0.3},
                },
            ),
            sim("fixed-presets", presets=PRESETS, ptz={"enabled": True}),
            sim("plain"),
            sim("off", enabled=False, ptz={"enabled": True}),
        ]
    }


@server_fixture
def rig(harness: CameraHarness) -> Rig:
    return harness.start(fleet())


def ptz(rig: Rig, body: dict[str, Any], instance: str = "ptz") -> dict[str, Any]:
    if body.get("operation") != "status":
        body = {"requestId": rid(), **body}
    return rig.call("ptz", body, instance)


def status(rig: Rig, instance: str = "ptz") -> dict[str, Any]:
    return rig.call("ptz", {"operation": "status"}, instance)


def settled(rig: Rig, instance: str = "ptz") -> dict[str, Any]:
    wait_until(lambda: status(rig, instance)["moving"] is False, 10, "the head stops", 0.02)
    return status(rig, instance)["position"]


def close_to(position: dict[str, float], **expected: float) -> bool:
    return all(abs(position[axis] - value) < 1e-6 for axis, value in expected.items())


# -- capabilities and status --------------------------------------------------------------------


def test_capabilities_follow_the_ptz_settings(rig: Rig) -> None:
    cameras = {
        c["instance"]: c["capabilities"]
        for c in rig.call("list", {"includeCapabilities": True})["cameras"]
    }
    flags = {name: (c["ptz"], c["presets"], c["presetMutation"]) for name, c in cameras.items()}
    assert flags == {
        "ptz": (True, True, True),
        "fixed-presets": (True, True, False),
        "plain": (False, False, False),
        "off": (True, True, False),
    }
    assert rig.call("status", instance="ptz")["capabilities"]["ptz"] is True


def test_status_of_a_resting_head(rig: Rig) -> None:
    reply = status(rig)
    assert reply["position"] == {"pan": 0.0, "tilt": 0.0, "zoom": 0.0}
    assert reply["moving"] is False
    assert reply["available"] is True
    assert reply["observedAt"].endswith("Z")


@pytest.mark.parametrize(
    ("instance", "verb", "body", "code"),
    [
        ("plain", "ptz", {"operation": "status"}, "PTZ_DISABLED"),
        ("plain", "ptz", {"operation": "home", "requestId": "h"}, "PTZ_DISABLED"),
        ("plain", "ptz-presets", {"operation": "list"}, "PTZ_DISABLED"),
        ("plain", "ptz-presets", {"operation": "goto", "requestId": "g", "token": "t"},
         "PTZ_DISABLED"),
        ("off", "ptz", {"operation": "status"}, "CAMERA_DISABLED"),
        ("nope", "ptz", {"operation": "status"}, "NO_SUCH_INSTANCE"),
        ("nope", "ptz-presets", {"operation": "list"}, "NO_SUCH_INSTANCE"),
    ],
)  # fmt: skip
def test_gates(rig: Rig, instance: str, verb: str, body: dict[str, Any], code: str) -> None:
    assert rig.error(verb, body, instance) == code


def test_addressing(rig: Rig) -> None:
    # Instance scope: several cameras and no instance is BAD_ARGS; body and topic must agree.
    assert rig.error("ptz", {"operation": "status"}) == "BAD_ARGS"
    assert rig.error("ptz", {"operation": "status", "instance": "plain"}, "ptz") == "BAD_ARGS"
    assert rig.call("ptz", {"operation": "status", "instance": "ptz"})["available"] is True


# -- sb/ptz bounds, row by row ------------------------------------------------------------------

V = {"pan": 0.5}
RANGE = "PTZ_RANGE_ERROR"
BAD = "BAD_ARGS"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        # continuous: velocities -1..1, timeoutMs > 0, <= 60000 and <= the camera's maximum
        ({"operation": "continuous", "velocity": {"pan": 1.01}, "timeoutMs": 100}, RANGE),
        ({"operation": "continuous", "velocity": {"pan": -1.01}, "timeoutMs": 100}, RANGE),
        ({"operation": "continuous", "velocity": {"tilt": 2}, "timeoutMs": 100}, RANGE),
        ({"operation": "continuous", "velocity": {"zoom": -1.5}, "timeoutMs": 100}, RANGE),
        ({"operation": "continuous", "velocity": V, "timeoutMs": 0}, RANGE),
        ({"operation": "continuous", "velocity": V, "timeoutMs": -1}, RANGE),
        ({"operation": "continuous", "velocity": V, "timeoutMs": 20_001}, RANGE),
        ({"operation": "continuous", "velocity": V, "timeoutMs": 60_001}, RANGE),
        ({"operation": "continuous", "velocity": V, "timeoutMs": 1.5}, BAD),
        ({"operation": "continuous", "velocity": V, "timeoutMs": "100"}, BAD),
        ({"operation": "continuous", "velocity": V}, BAD),
        ({"operation": "continuous", "timeoutMs": 100}, BAD),
        ({"operation": "continuous", "velocity": {}, "timeoutMs": 100}, BAD),
        ({"operation": "continuous", "velocity": {"roll": 1}, "timeoutMs": 100}, BAD),
        ({"operation": "continuous", "velocity": {"pan": "1"}, "timeoutMs": 100}, BAD),
        ({"operation": "continuous", "velocity": [1, 0, 0], "timeoutMs": 100}, BAD),
        ({"operation": "continuous", "velocity": V, "timeoutMs": 100, "speed": V}, BAD),
        # absolute: pan and tilt -1..1, zoom 0..1, speeds 0..1
        ({"operation": "absolute", "position": {"pan": 1.1}}, RANGE),
        ({"operation": "absolute", "position": {"tilt": -1.1}}, RANGE),
        ({"operation": "absolute", "position": {"zoom": -0.1}}, RANGE),
        ({"operation": "absolute", "position": {"zoom": 1.1}}, RANGE),
        ({"operation": "absolute", "position": V, "speed": {"pan": 1.1}}, RANGE),
        ({"operation": "absolute", "position": V, "speed": {"zoom": -0.1}}, RANGE),
        ({"operation": "absolute"}, BAD),
        ({"operation": "absolute", "position": V, "timeoutMs": 100}, BAD),
        ({"operation": "absolute", "position": V, "speed": {}}, BAD),
        # relative: translations -1..1 (zoom delta too), speeds 0..1
        ({"operation": "relative", "translation": {"pan": -1.5}}, RANGE),
        ({"operation": "relative", "translation": {"zoom": 1.5}}, RANGE),
        ({"operation": "relative", "translation": V, "speed": {"tilt": 2}}, RANGE),
        ({"operation": "relative"}, BAD),
        ({"operation": "relative", "position": V}, BAD),
        # stop: axes 1 to 3 of pan, tilt, zoom, distinct
        ({"operation": "stop"}, BAD),
        ({"operation": "stop", "axes": []}, BAD),
        ({"operation": "stop", "axes": ["pan", "pan"]}, BAD),
        ({"operation": "stop", "axes": ["roll"]}, BAD),
        ({"operation": "stop", "axes": ["pan", "tilt", "zoom", "pan"]}, BAD),
        ({"operation": "stop", "axes": "pan"}, BAD),
        # home takes nothing; the operation is kebab-case and required
        ({"operation": "home", "position": V}, BAD),
        ({"operation": "Home"}, BAD),
        ({"operation": "zoom-in"}, BAD),
        ({}, BAD),
        ({"operation": "home", "extra": 1}, BAD),
    ],
)  # fmt: skip
def test_ptz_refusals(rig: Rig, body: dict[str, Any], code: str) -> None:
    assert rig.error("ptz", {"requestId": rid(), **body}, "ptz") == code
    # A refusal never moves the head.
    assert status(rig)["moving"] is False


def test_request_id_rules(rig: Rig) -> None:
    for operation in ({"operation": "home"}, {"operation": "stop", "axes": ["pan"]}):
        assert rig.error("ptz", operation, "ptz") == "BAD_ARGS"
    assert rig.error("ptz", {"operation": "status", "requestId": rid()}, "ptz") == "BAD_ARGS"


@pytest.mark.parametrize(
    "body",
    [
        {"operation": "continuous", "velocity": {"pan": 1, "tilt": -1, "zoom": 1}, "timeoutMs": 1},
        {"operation": "continuous", "velocity": {"pan": -1}, "timeoutMs": 20_000},
        {"operation": "absolute", "position": {"pan": -1, "tilt": 1, "zoom": 0},
         "speed": {"pan": 0}},
        {"operation": "absolute", "position": {"pan": 1, "tilt": -1, "zoom": 1},
         "speed": {"zoom": 1}},
        {"operation": "relative", "translation": {"pan": 1, "tilt": -1, "zoom": -1}},
        {"operation": "stop", "axes": ["zoom", "pan", "tilt"]},
        {"operation": "home"},
    ],
)  # fmt: skip
def test_ptz_bounds_are_inclusive(rig: Rig, body: dict[str, Any]) -> None:
    reply = ptz(rig, body)
    assert reply["operation"] == body["operation"]
    assert reply["state"] == "COMMANDED"
    assert reply["acceptedAt"].endswith("Z")
    ptz(rig, {"operation": "stop", "axes": ["pan", "tilt", "zoom"]})


# -- motion -------------------------------------------------------------------------------------


def test_continuous_move_stops_itself_at_the_deadline(rig: Rig) -> None:
    before = time.monotonic()
    reply = ptz(rig, {"operation": "continuous", "velocity": {"pan": 0.25}, "timeoutMs": 400})
    assert reply["stopDeadline"] is not None
    accepted = np.datetime64(reply["acceptedAt"].rstrip("Z"))
    deadline = np.datetime64(reply["stopDeadline"].rstrip("Z"))
    assert (deadline - accepted) == np.timedelta64(400, "ms")
    assert status(rig)["moving"] is True
    position = settled(rig)
    elapsed = time.monotonic() - before
    assert elapsed >= 0.35
    # 0.25 of the head's 4 units/s for about 0.4 s: roughly 0.4 (never past the limit of 1).
    assert 0.3 <= position["pan"] < 1.0
    assert position["tilt"] == 0.0
    assert position["zoom"] == 0.0
    # Stopped means stopped: the position holds.
    assert status(rig)["position"] == position


def test_stop_stops_only_the_named_axes(rig: Rig) -> None:
    ptz(
        rig,
        {"operation": "continuous", "velocity": {"pan": 0.05, "tilt": -0.05}, "timeoutMs": 20_000},
    )
    reply = ptz(rig, {"operation": "stop", "axes": ["pan"]})
    assert reply["stopDeadline"] is None
    pan = status(rig)["position"]["pan"]
    wait_until(lambda: status(rig)["position"]["tilt"] < -0.05, 10, "tilt keeps moving")
    assert status(rig)["position"]["pan"] == pan
    assert status(rig)["moving"] is True
    ptz(rig, {"operation": "stop", "axes": ["tilt"]})
    assert status(rig)["moving"] is False


def test_a_continuous_move_stops_at_the_limit(rig: Rig) -> None:
    ptz(rig, {"operation": "continuous", "velocity": {"zoom": 1}, "timeoutMs": 20_000})
    position = settled(rig)
    assert position["zoom"] == 1.0


def test_absolute_relative_and_home(rig: Rig) -> None:
    ptz(rig, {"operation": "absolute", "position": {"pan": 0.5, "tilt": -0.25, "zoom": 0.5}})
    assert close_to(settled(rig), pan=0.5, tilt=-0.25, zoom=0.5)
    ptz(rig, {"operation": "relative", "translation": {"pan": -0.25, "zoom": 0.75}})
    # The zoom clamps at its limit.
    assert close_to(settled(rig), pan=0.25, tilt=-0.25, zoom=1.0)
    # A zero speed leaves that axis where it is.
    ptz(rig, {"operation": "absolute", "position": {"pan": -1, "tilt": 1}, "speed": {"tilt": 0}})
    assert close_to(settled(rig), pan=-1.0, tilt=-0.25)
    reply = ptz(rig, {"operation": "home"})
    assert reply["stopDeadline"] is None
    assert close_to(settled(rig), pan=0.1, tilt=-0.2, zoom=0.3)


def test_a_later_command_is_not_cut_short_by_the_armed_stop(rig: Rig) -> None:
    ptz(rig, {"operation": "continuous", "velocity": {"pan": 0.1}, "timeoutMs": 200})
    # A slow absolute move that outlasts the armed stop of the continuous one.
    ptz(rig, {"operation": "absolute", "position": {"pan": -0.9}, "speed": {"pan": 0.25}})
    assert close_to(settled(rig), pan=-0.9)


def test_timeout_bound_is_the_spec_maximum_by_default(harness: CameraHarness) -> None:
    rig = harness.start({"cameras": [sim("cam", ptz={"enabled": True})]})
    body = {"operation": "continuous", "velocity": {"pan": 0.01}}
    assert rig.error("ptz", {**body, "requestId": rid(), "timeoutMs": 60_001}) == "PTZ_RANGE_ERROR"
    reply = rig.call("ptz", {**body, "requestId": rid(), "timeoutMs": 60_000})
    assert reply["stopDeadline"] is not None
    rig.call("ptz", {"operation": "stop", "axes": ["pan"], "requestId": rid()})


# -- captures while moving, schedules, pause ----------------------------------------------------


def test_captures_are_refused_while_the_camera_moves(rig: Rig) -> None:
    ptz(rig, {"operation": "continuous", "velocity": {"pan": 0.01}, "timeoutMs": 20_000})
    assert rig.error("capture", {"requestId": rid()}, "ptz") == "CAMERA_MOVING"
    assert rig.error("capture-submit", {"requestId": rid()}, "ptz") == "CAMERA_MOVING"
    group = {"requestId": rid(), "instances": ["plain", "ptz"]}
    assert rig.error("capture-group", group) == "CAMERA_MOVING"
    # Other cameras are not affected.
    assert "image" in rig.call("capture", {"requestId": rid()}, "plain")
    ptz(rig, {"operation": "stop", "axes": ["pan"]})
    assert "image" in rig.call("capture", {"requestId": rid()}, "ptz")


def test_scheduled_captures_are_skipped_while_moving(harness: CameraHarness) -> None:
    schedule = {"id": "tick", "intervalMs": 150}
    rig = harness.start({"cameras": [sim("cam", schedules=[schedule], ptz={"enabled": True})]})
    topic = rig.runtime.topics.topic("evt", instance="cam") + "/warning/schedule-skipped"
    ptz(rig, {"operation": "continuous", "velocity": {"tilt": 0.001}, "timeoutMs": 20_000}, "cam")
    moving_ms = time.time_ns() // 1_000_000
    wait_until(lambda: len(rig.seen.on(topic)) >= 2, 10, "two schedule-skipped events")
    event = rig.seen.on(topic)[0].body
    assert event["severity"] == "warning"
    assert event["instance"] == "cam"
    context = event["context"]
    assert set(context) == {"scheduleId", "intendedFireTime", "reason"}
    assert context["scheduleId"] == "tick"
    assert context["reason"] == "camera-moving"
    assert context["intendedFireTime"].endswith("Z")
    skipped = rig.runtime.metrics.counter("schedules", "skipped", {"camera": "cam"})
    assert skipped.total >= 2
    ptz(rig, {"operation": "stop", "axes": ["tilt"]}, "cam")
    stopped_ms = time.time_ns() // 1_000_000

    def after_stop() -> list[dict[str, Any]]:
        jobs = rig.call("capture-status", {"states": ["SUCCEEDED"]})["jobs"]
        return [job for job in jobs if job["acceptedAtMs"] >= stopped_ms]

    wait_until(lambda: after_stop(), 10, "a scheduled capture after the stop")
    jobs = rig.call("capture-status", {"states": ["SUCCEEDED"]})["jobs"]
    assert not [j for j in jobs if moving_ms + 50 < j["acceptedAtMs"] < stopped_ms - 50]


def test_ptz_and_presets_work_while_paused(rig: Rig) -> None:
    rig.call("pause", instance="ptz")
    assert rig.error("capture", {"requestId": rid()}, "ptz") == "PAUSED"
    ptz(rig, {"operation": "absolute", "position": {"pan": 0.5}})
    assert close_to(settled(rig), pan=0.5)
    token = rig.call("ptz-presets", {"operation": "set", "requestId": rid(), "name": "p"}, "ptz")
    assert token["token"]
    rig.call("ptz-presets", {"operation": "goto", "requestId": rid(), "token": "preset-1"}, "ptz")
    assert close_to(settled(rig), pan=-0.5, tilt=0.25, zoom=0.2)
    assert rig.call("ptz-presets", {"operation": "list"}, "ptz")["presets"]
    assert rig.call("status", instance="ptz")["paused"] is True


# -- presets ------------------------------------------------------------------------------------


def test_presets_list_is_paged(rig: Rig) -> None:
    first = rig.call("ptz-presets", {"operation": "list", "limit": 2}, "ptz")
    assert first["presets"] == [
        {"token": "preset-1", "name": "door"},
        {"token": "preset-2", "name": "gate"},
    ]
    rest = rig.call(
        "ptz-presets", {"operation": "list", "limit": 2, "cursor": first["nextCursor"]}, "ptz"
    )
    assert rest == {"presets": [{"token": "preset-3", "name": "yard"}], "nextCursor": None}
    # A cursor serves only its own camera's list.
    cursor = {"operation": "list", "cursor": first["nextCursor"]}
    assert rig.error("ptz-presets", cursor, "fixed-presets") == "BAD_ARGS"


def test_set_goto_remove(rig: Rig) -> None:
    ptz(rig, {"operation": "absolute", "position": {"pan": 0.3, "tilt": 0.4, "zoom": 0.6}})
    settled(rig)
    name = "é" * 128  # 256 bytes: the name's bound
    reply = rig.call("ptz-presets", {"operation": "set", "requestId": rid(), "name": name}, "ptz")
    token = reply["token"]
    assert reply == {"operation": "set", "token": token}
    listed = rig.call("ptz-presets", {"operation": "list"}, "ptz")["presets"]
    assert listed[-1] == {"token": token, "name": name}
    ptz(rig, {"operation": "home"})
    settled(rig)
    goto = {"operation": "goto", "requestId": rid(), "token": token}
    assert rig.call("ptz-presets", goto, "ptz") == {"operation": "goto", "state": "COMMANDED"}
    assert close_to(settled(rig), pan=0.3, tilt=0.4, zoom=0.6)
    remove = {"operation": "remove", "requestId": rid(), "token": token}
    assert rig.call("ptz-presets", remove, "ptz") == {"operation": "remove", "removed": True}
    assert token not in [
        p["token"] for p in rig.call("ptz-presets", {"operation": "list"}, "ptz")["presets"]
    ]
    assert rig.error("ptz-presets", {**goto, "requestId": rid()}, "ptz") == "BAD_ARGS"
    assert rig.error("ptz-presets", {**remove, "requestId": rid()}, "ptz") == "BAD_ARGS"


def test_preset_mutation_is_gated(rig: Rig) -> None:
    body = {"operation": "set", "requestId": rid(), "name": "x"}
    assert rig.error("ptz-presets", body, "fixed-presets") == "PTZ_DISABLED"
    body = {"operation": "remove", "requestId": rid(), "token": "preset-1"}
    assert rig.error("ptz-presets", body, "fixed-presets") == "PTZ_DISABLED"
    # goto does not need the mutation gate.
    goto = {"operation": "goto", "requestId": rid(), "token": "preset-2"}
    assert rig.call("ptz-presets", goto, "fixed-presets")["state"] == "COMMANDED"
    assert len(rig.call("ptz-presets", {"operation": "list"}, "fixed-presets")["presets"]) == 3


@pytest.mark.parametrize(
    "body",
    [
        {"operation": "goto", "token": ""},
        {"operation": "goto", "token": "t" * 1025},
        {"operation": "goto", "token": "é" * 512 + "t"},
        {"operation": "goto"},
        {"operation": "goto", "token": 7},
        {"operation": "remove", "token": "t" * 1025},
        {"operation": "remove"},
        {"operation": "set", "name": ""},
        {"operation": "set", "name": "n" * 257},
        {"operation": "set", "name": "é" * 128 + "n"},
        {"operation": "set", "name": "a\nb"},
        {"operation": "set"},
        {"operation": "set", "name": "n", "token": "t"},
        {"operation": "goto", "token": "preset-1", "name": "n"},
        {"operation": "Goto", "token": "preset-1"},
        {"operation": "list", "limit": 0},
        {"operation": "list", "limit": 1001},
        {"operation": "list", "cursor": ""},
        {"operation": "goto", "token": "preset-1", "limit": 5},
        {},
    ],
)
def test_preset_refusals(rig: Rig, body: dict[str, Any]) -> None:
    if body.get("operation") != "list":
        body = {"requestId": rid(), **body}
    assert rig.error("ptz-presets", body, "ptz") == "BAD_ARGS"


def test_preset_request_id_rules_and_token_bound(rig: Rig) -> None:
    assert rig.error("ptz-presets", {"operation": "list", "requestId": rid()}, "ptz") == "BAD_ARGS"
    assert rig.error("ptz-presets", {"operation": "goto", "token": "preset-1"}, "ptz") == "BAD_ARGS"
    # A token of exactly 1024 bytes passes the bound and is then unknown to the camera.
    with pytest.raises(CommandError) as refused:
        rig.call(
            "ptz-presets", {"operation": "goto", "requestId": rid(), "token": "t" * 1024}, "ptz"
        )
    assert refused.value.code == "BAD_ARGS"
    assert "holds no preset" in refused.value.message


def test_the_preset_store_is_bounded(harness: CameraHarness) -> None:
    rig = harness.start(
        {"cameras": [sim("cam", maxPresets=1, ptz={"enabled": True, "allowPresetMutation": True})]}
    )
    rig.call("ptz-presets", {"operation": "set", "requestId": rid(), "name": "a"})
    assert (
        rig.error("ptz-presets", {"operation": "set", "requestId": rid(), "name": "b"})
        == "RESOURCE_LIMIT"
    )


# -- the move is visible in the image -----------------------------------------------------------


def marker(rig: Rig, path: str) -> tuple[float, float, int]:
    """Centre (x, y) and area of the sim head's red disc in a captured image."""
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    assert image is not None
    blue, green, red = (image[:, :, i].astype(int) for i in range(3))
    mask = (red > 200) & (green < 80) & (blue < 80)
    ys, xs = np.nonzero(mask)
    assert len(xs) > 0, "no marker in the image"
    return float(xs.mean()), float(ys.mean()), len(xs)


def test_the_rendered_frame_shows_the_move(rig: Rig) -> None:
    def shot() -> tuple[float, float, int]:
        reply = rig.call("capture", {"requestId": rid()}, "ptz")
        assert Path(reply["image"]["absolutePath"]).is_file()
        return marker(rig, reply["image"]["absolutePath"])

    x0, y0, area0 = shot()
    # 320 x 240 frame, centre at rest.
    assert abs(x0 - 159.5) < 3
    assert abs(y0 - 119.5) < 3
    ptz(rig, {"operation": "absolute", "position": {"pan": 0.5, "tilt": 0.5, "zoom": 0.0}})
    settled(rig)
    x1, y1, area1 = shot()
    assert abs(x1 - 239.25) < 3  # right by a quarter frame
    assert abs(y1 - 59.75) < 3  # up by a quarter frame
    assert abs(area1 - area0) < area0 * 0.2
    ptz(rig, {"operation": "absolute", "position": {"zoom": 1.0}})
    settled(rig)
    x2, y2, area2 = shot()
    assert abs(x2 - x1) < 3
    assert abs(y2 - y1) < 3
    assert area2 > area0 * 4  # three times the radius
