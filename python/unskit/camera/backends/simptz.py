"""The sim backend's PTZ head: a position that moves in time at a configured speed within
the normalized limits, and presets held in memory. Motion is computed from the clock when
asked, so the head needs no thread of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unskit.camera.backends import AXES, Preset, PtzStatus
from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError

__all__ = ["LIMITS", "SimPtzHead"]

#: axis -> (lowest, highest) normalized position.
LIMITS = {"pan": (-1.0, 1.0), "tilt": (-1.0, 1.0), "zoom": (0.0, 1.0)}
DEFAULT_SPEED = 0.5
DEFAULT_MAX_PRESETS = 64


@dataclass
class _Axis:
    """One axis: where it was at `since`, and how it moves from there."""

    origin: float
    since: float
    velocity: float = 0.0
    target: float | None = None
    rate: float = 0.0

    def at(self, now: float, low: float, high: float) -> float:
        elapsed = max(now - self.since, 0.0)
        if self.target is not None:
            gap = self.target - self.origin
            step = self.rate * elapsed
            if step >= abs(gap):
                # Exactly the target: origin + gap need not be (floating point).
                return self.target
            return self.origin + (step if gap >= 0 else -step)
        return min(max(self.origin + self.velocity * elapsed, low), high)

    def moving(self, now: float, low: float, high: float) -> bool:
        position = self.at(now, low, high)
        if self.target is not None:
            return position != self.target
        if self.velocity > 0:
            return position < high
        if self.velocity < 0:
            return position > low
        return False


class SimPtzHead:
    """A simulated head: `ptzSpeed` normalized units per second at full speed, presets from
    the connection's `presets` (name, pan, tilt, zoom), at most `maxPresets`."""

    def __init__(self, connection: Mapping[str, Any]) -> None:
        self.speed = float(connection.get("ptzSpeed", DEFAULT_SPEED))
        self.max_presets = int(connection.get("maxPresets", DEFAULT_MAX_PRESETS))
        now = time.monotonic()
        self._lock = threading.Lock()
        self._axes = {axis: _Axis(0.0, now) for axis in AXES}
        self._issued = 0
        self._presets: dict[str, tuple[str | None, dict[str, float]]] = {}
        for entry in connection.get("presets") or ():
            position = {axis: float(entry.get(axis, 0.0)) for axis in AXES}
            self._store(entry.get("name"), position)

    def _store(self, name: str | None, position: dict[str, float]) -> str:
        self._issued += 1
        token = f"preset-{self._issued}"
        self._presets[token] = (name, position)
        return token

    def _position(self, now: float) -> dict[str, float]:
        return {axis: self._axes[axis].at(now, *LIMITS[axis]) for axis in AXES}

    def position(self) -> dict[str, float]:
        """The normalized position now (what the rendered frame shows)."""
        with self._lock:
            return self._position(time.monotonic())

    def status(self) -> PtzStatus:
        """Position and motion now."""
        now = time.monotonic()
        with self._lock:
            position = self._position(now)
            moving = any(self._axes[axis].moving(now, *LIMITS[axis]) for axis in AXES)
        return PtzStatus({k: round(v, 6) for k, v in position.items()}, moving)

    def _restart(self, axis: str, now: float) -> _Axis:
        # Every new command on an axis starts from where that axis is now.
        state = _Axis(self._axes[axis].at(now, *LIMITS[axis]), now)
        self._axes[axis] = state
        return state

    def continuous(self, velocity: Mapping[str, float]) -> None:
        """Moves the given axes at their velocity until stopped or at a limit."""
        now = time.monotonic()
        with self._lock:
            for axis, value in velocity.items():
                self._restart(axis, now).velocity = value * self.speed

    def _move_to(self, targets: Mapping[str, float], speed: Mapping[str, float]) -> None:
        now = time.monotonic()
        for axis, target in targets.items():
            low, high = LIMITS[axis]
            state = self._restart(axis, now)
            rate = speed.get(axis, 1.0) * self.speed
            # A zero speed leaves the axis where it is (it would never arrive).
            if rate > 0:
                state.target = min(max(target, low), high)
                state.rate = rate

    def absolute(self, position: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """Moves the given axes to `position`."""
        with self._lock:
            self._move_to(position, speed)

    def relative(self, translation: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """Moves the given axes by `translation` (clamped to the limits)."""
        with self._lock:
            here = self._position(time.monotonic())
            self._move_to({axis: here[axis] + delta for axis, delta in translation.items()}, speed)

    def stop(self, axes: tuple[str, ...]) -> None:
        """Stops the named axes where they are."""
        now = time.monotonic()
        with self._lock:
            for axis in axes:
                self._restart(axis, now)

    def presets(self) -> list[Preset]:
        """The presets in the order they were stored."""
        with self._lock:
            return [Preset(token, name) for token, (name, _) in self._presets.items()]

    def _preset(self, token: str) -> dict[str, float]:
        entry = self._presets.get(token)
        if entry is None:
            raise CommandError(ErrorCode.BAD_ARGS, f"the camera holds no preset {token!r}")
        return entry[1]

    def goto_preset(self, token: str) -> None:
        """Moves to the preset at full speed."""
        with self._lock:
            self._move_to(self._preset(token), {})

    def set_preset(self, name: str) -> str:
        """Stores the position now under a new token."""
        with self._lock:
            if len(self._presets) >= self.max_presets:
                raise CommandError(
                    ErrorCode.RESOURCE_LIMIT,
                    f"the camera holds {len(self._presets)} presets, its maximum",
                )
            return self._store(name, self._position(time.monotonic()))

    def remove_preset(self, token: str) -> None:
        """Forgets the preset."""
        with self._lock:
            self._preset(token)
            del self._presets[token]
