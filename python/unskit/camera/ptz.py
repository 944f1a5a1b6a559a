"""sb/ptz and sb/ptz-presets: pan-tilt-zoom control over a camera's backend-neutral PTZ head.

Checks run in this order: the body's shape and the fields each operation takes (BAD_ARGS),
the camera (NO_SUCH_INSTANCE, CAMERA_DISABLED), the gates (PTZ_DISABLED; a backend without
a head: UNSUPPORTED_CAPABILITY), then the normalized ranges (PTZ_RANGE_ERROR). Neither verb
looks at the pause flag: the specification leaves them unaffected by pause.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from unskit.camera.backends import AXES, PtzHead
from unskit.camera.config import MAX_CONTINUOUS_MOVE_MS
from unskit.camera.jobs import now_ms, rfc3339
from unskit.camera.pages import Pages, snapshot_owner
from unskit.camera.sessions import CameraSession, CameraSessions
from unskit.commands import (
    CURSOR,
    LIMIT,
    BodySpec,
    Choice,
    CommandContext,
    Param,
    RequestIdRule,
    Scope,
    Verb,
    bad_args,
)
from unskit.commands.codes import ErrorCode
from unskit.commands.fields import Integer, ListOf, Number, ObjectOf, Text
from unskit.errors import CommandError

__all__ = ["PtzStops", "PtzVerbs"]

_log = logging.getLogger(__name__)

PTZ_OPERATIONS = ("continuous", "absolute", "relative", "stop", "home", "status")
PRESET_OPERATIONS = ("list", "goto", "set", "remove")
#: operation -> (required fields, optional fields) beyond operation, instance and requestId.
_PTZ_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "continuous": (("velocity", "timeoutMs"), ()),
    "absolute": (("position",), ("speed",)),
    "relative": (("translation",), ("speed",)),
    "stop": (("axes",), ()),
    "home": ((), ()),
    "status": ((), ()),
}
_PRESET_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "list": ((), ("limit", "cursor")),
    "goto": (("token",), ()),
    "set": (("name",), ()),
    "remove": (("token",), ()),
}
#: axis -> (lowest, highest) of a position; velocities, translations are -1..1, speeds 0..1.
_POSITION = {"pan": (-1.0, 1.0), "tilt": (-1.0, 1.0), "zoom": (0.0, 1.0)}
_SIGNED = {axis: (-1.0, 1.0) for axis in AXES}
_SPEED = {axis: (0.0, 1.0) for axis in AXES}

_AXES_OBJECT = ObjectOf({axis: Param(Number()) for axis in AXES})
PRESET_TOKEN = Text(min_bytes=1, max_bytes=1024, no_control=True)
PRESET_NAME = Text(min_bytes=1, max_bytes=256, no_control=True)


def _check_fields(
    table: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]], body: Mapping[str, Any]
) -> str:
    operation = str(body["operation"])
    required, optional = table[operation]
    for name in required:
        if name not in body:
            raise bad_args(f"operation {operation} needs the field {name}")
    allowed = {"operation", "instance", "requestId", *required, *optional}
    for name in body:
        if name not in allowed:
            raise bad_args(f"the field {name} does not apply to operation {operation}")
    return operation


def _ranged(
    name: str, value: Mapping[str, float], bounds: Mapping[str, tuple[float, float]]
) -> dict[str, float]:
    if not value:
        raise bad_args(f"{name} must name at least one of pan, tilt, zoom")
    for axis, number in value.items():
        low, high = bounds[axis]
        if not low <= number <= high:
            raise CommandError(
                ErrorCode.PTZ_RANGE_ERROR,
                f"{name}.{axis} must be within {low:g} to {high:g}, not {number}",
            )
    return {axis: float(number) for axis, number in value.items()}


class PtzStops:
    """The stops the adapter arms for continuous moves: one timer per camera, whose axes a
    later command on the same axes takes over (so the timer never stops that command)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, tuple[threading.Timer, set[str]]] = {}

    def arm(self, instance: str, head: PtzHead, axes: set[str], delay_s: float) -> None:
        """Stops `axes` of `head` after `delay_s`, replacing the camera's earlier stop."""
        timer = threading.Timer(delay_s, self._fire, (instance, head))
        timer.daemon = True
        with self._lock:
            earlier = self._armed.pop(instance, None)
            if earlier is not None:
                earlier[0].cancel()
                axes = axes | earlier[1]
            self._armed[instance] = (timer, axes)
            timer.start()

    def release(self, instance: str, axes: tuple[str, ...]) -> None:
        """A new command drives `axes`: the armed stop leaves them alone."""
        with self._lock:
            armed = self._armed.get(instance)
            if armed is None:
                return
            armed[1].difference_update(axes)
            if not armed[1]:
                armed[0].cancel()
                del self._armed[instance]

    def _fire(self, instance: str, head: PtzHead) -> None:
        with self._lock:
            armed = self._armed.pop(instance, None)
        if armed is None or not armed[1]:
            return
        try:
            head.stop(tuple(axis for axis in AXES if axis in armed[1]))
        except Exception as error:
            _log.warning("camera %s: the armed PTZ stop failed: %s", instance, error)

    def stop_now(self, instance: str) -> None:
        """Fires the camera's armed stop at once (a reload restarts or removes it: its head
        must not be left moving)."""
        with self._lock:
            armed = self._armed.get(instance)
        if armed is not None:
            armed[0].cancel()
            armed[0].function(*armed[0].args)

    def close(self) -> None:
        """Cancels every armed stop."""
        with self._lock:
            armed = list(self._armed.values())
            self._armed.clear()
        for timer, _ in armed:
            timer.cancel()


class PtzVerbs:
    """sb/ptz and sb/ptz-presets over the sessions' heads."""

    def __init__(self, sessions: CameraSessions, stops: PtzStops, pages: Pages) -> None:
        self._sessions = sessions
        self._stops = stops
        self._pages = pages

    def verbs(self) -> list[Verb]:
        """The two PTZ verbs."""
        return [
            Verb(
                "ptz",
                self._ptz,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.CONDITIONAL,
                request_id_needed=lambda body: body.get("operation") != "status",
                body=BodySpec(
                    {
                        "operation": Param(Choice(PTZ_OPERATIONS), required=True),
                        "velocity": Param(_AXES_OBJECT),
                        "timeoutMs": Param(Integer()),
                        "position": Param(_AXES_OBJECT),
                        "translation": Param(_AXES_OBJECT),
                        "speed": Param(_AXES_OBJECT),
                        "axes": Param(ListOf(Choice(AXES), min_items=1, max_items=3)),
                    }
                ),
                summary="pan-tilt-zoom: continuous, absolute, relative, stop, home, status",
            ),
            Verb(
                "ptz-presets",
                self._presets,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.CONDITIONAL,
                request_id_needed=lambda body: body.get("operation") != "list",
                body=BodySpec(
                    {
                        "operation": Param(Choice(PRESET_OPERATIONS), required=True),
                        "token": Param(PRESET_TOKEN),
                        "name": Param(PRESET_NAME),
                        "limit": Param(LIMIT),
                        "cursor": Param(CURSOR),
                    }
                ),
                summary="PTZ presets: list, goto, set, remove",
            ),
        ]

    def _head(self, context: CommandContext) -> tuple[CameraSession, PtzHead]:
        assert context.instance is not None
        session = self._sessions.enabled(context.instance)
        if not session.spec.ptz.enabled:
            raise CommandError(
                ErrorCode.PTZ_DISABLED,
                f"PTZ is not enabled on camera {session.instance!r} (ptz.enabled)",
            )
        head = None if session.backend is None else session.backend.ptz
        if head is None:
            raise CommandError(
                ErrorCode.UNSUPPORTED_CAPABILITY,
                f"the {session.spec.backend} backend of camera {session.instance!r} has no PTZ",
            )
        return session, head

    # -- sb/ptz -------------------------------------------------------------------------------

    def _ptz(self, context: CommandContext) -> Mapping[str, Any]:
        body = context.body
        operation = _check_fields(_PTZ_FIELDS, body)
        if operation == "status" and context.request_id is not None:
            raise bad_args("operation status is read-only and takes no requestId")
        if operation == "stop" and len(set(body["axes"])) != len(body["axes"]):
            raise bad_args("axes must be distinct")
        session, head = self._head(context)
        instance = session.instance
        if operation == "status":
            status = head.status()
            return {
                "position": None if status.position is None else dict(status.position),
                "moving": status.moving,
                "available": status.available,
                "observedAt": rfc3339(now_ms()),
            }
        accepted_ms = now_ms()
        deadline: str | None = None
        if operation == "continuous":
            velocity = _ranged("velocity", body["velocity"], _SIGNED)
            timeout_ms = int(body["timeoutMs"])
            bound = min(MAX_CONTINUOUS_MOVE_MS, session.spec.ptz.maximum_continuous_move_ms)
            if not 0 < timeout_ms <= bound:
                raise CommandError(
                    ErrorCode.PTZ_RANGE_ERROR,
                    f"timeoutMs must be greater than 0 and at most {bound} "
                    f"(ptz.maximumContinuousMoveMs of camera {instance!r}), not {timeout_ms}",
                )
            head.continuous(velocity)
            self._stops.arm(instance, head, set(velocity), timeout_ms / 1000)
            deadline = rfc3339(accepted_ms + timeout_ms)
        elif operation in ("absolute", "relative"):
            field, bounds = (
                ("position", _POSITION) if operation == "absolute" else ("translation", _SIGNED)
            )
            target = _ranged(field, body[field], bounds)
            speed = _ranged("speed", body["speed"], _SPEED) if "speed" in body else {}
            self._stops.release(instance, tuple(target))
            if operation == "absolute":
                head.absolute(target, speed)
            else:
                head.relative(target, speed)
        elif operation == "stop":
            axes = tuple(body["axes"])
            self._stops.release(instance, axes)
            head.stop(axes)
        else:  # home
            self._stops.release(instance, AXES)
            head.absolute(dict(session.spec.ptz.home), {})
        return {
            "operation": operation,
            "state": "COMMANDED",
            "acceptedAt": rfc3339(accepted_ms),
            "stopDeadline": deadline,
        }

    # -- sb/ptz-presets -----------------------------------------------------------------------

    def _presets(self, context: CommandContext) -> Mapping[str, Any]:
        body = context.body
        operation = _check_fields(_PRESET_FIELDS, body)
        if operation == "list" and context.request_id is not None:
            raise bad_args("operation list is read-only and takes no requestId")
        session, head = self._head(context)
        if operation == "list":
            owner = snapshot_owner("ptz-presets", session.instance)
            presets: list[Any] = []
            if "cursor" not in body:
                presets = [{"token": p.token, "name": p.name} for p in head.presets()]
            items, cursor, _ = self._pages.page(context, owner, presets, {})
            return {"presets": items, "nextCursor": cursor}
        if operation == "goto":
            self._stops.release(session.instance, AXES)
            head.goto_preset(str(body["token"]))
            return {"operation": operation, "state": "COMMANDED"}
        if not session.spec.ptz.allow_preset_mutation:
            raise CommandError(
                ErrorCode.PTZ_DISABLED,
                f"preset {operation} needs ptz.allowPresetMutation on camera {session.instance!r}",
            )
        if operation == "set":
            return {"operation": operation, "token": head.set_preset(str(body["name"]))}
        head.remove_preset(str(body["token"]))
        return {"operation": operation, "removed": True}
