"""Camera sessions: each configured camera at run time (its backend's live session, generation,
pause flag and last error) and the snapshots sb/list and sb/status report.

Whatever acts on a camera rather than on a capture (pause, reconnect, whether it moves)
lives here, so that admission and the pipeline ask one place about a camera.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from unskit.camera.backends import Backend
from unskit.camera.config import CameraSpec, capture_mode
from unskit.camera.freshness import FreshnessMemory
from unskit.camera.jobs import now_ms, rfc3339
from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError

__all__ = ["CameraSession", "CameraSessions"]


class CameraSession:
    """A configured camera at run time: its backend (None while disabled) and pause flag."""

    def __init__(self, spec: CameraSpec, backend: Backend | None) -> None:
        self.spec = spec
        self.backend = backend
        self.paused = False
        self.generation = 1
        self.connected_ms: int | None = now_ms() if backend is not None else None
        self.last_error: str | None = None
        self.updated_ms = now_ms()
        #: The previous capture's frame, that the next one is judged fresh against.
        self.freshness = FreshnessMemory()
        #: Held by the dispatcher while it runs a capture; a reload restarting the camera
        #: takes it to swap the backend between captures.
        self.in_use = threading.Lock()
        #: Cleared while a reload restarts the camera: the dispatcher starts no capture
        #: (a lock alone would let it take the camera straight back after each capture).
        self.ready = threading.Event()
        self.ready.set()

    def restart(self, spec: CameraSpec, backend: Backend | None) -> Backend | None:
        """Takes a changed configuration (the caller holds `in_use`); the old backend, for
        the caller to close. The pause flag is kept: it is the operator's, not the file's."""
        old, self.spec, self.backend = self.backend, spec, backend
        self.generation += 1
        self.connected_ms = now_ms() if backend is not None else None
        self.last_error = None
        self.updated_ms = now_ms()
        self.freshness.forget()
        return old

    @property
    def instance(self) -> str:
        """The camera's instance token."""
        return self.spec.instance

    @property
    def state(self) -> str:
        """ONLINE, DEGRADED (the last capture failed in the camera) or DISABLED."""
        if not self.spec.enabled:
            return "DISABLED"
        return "ONLINE" if self.last_error is None else "DEGRADED"

    @property
    def offers_ptz(self) -> bool:
        """Whether ptz.enabled is on and the backend has a head (the sim always has)."""
        return self.spec.ptz.enabled and (
            self.spec.backend == "sim" if self.backend is None else self.backend.ptz is not None
        )

    @property
    def moving(self) -> bool:
        """Whether the camera's PTZ head is moving now (False without PTZ)."""
        if self.backend is None or self.backend.ptz is None or not self.spec.ptz.enabled:
            return False
        head = self.backend.ptz
        # Admission asks under its lock: a head that would ask its camera over the network
        # answers from what it knows instead (the onvif backend's known_moving).
        known = getattr(head, "known_moving", None)
        return bool(known() if known is not None else head.status().moving)

    def capabilities(self) -> dict[str, Any]:
        """The backend's capabilities with the ptz, presets and presetMutation the camera's
        ptz settings allow (a disabled camera's are derived from its backend)."""
        capabilities = self._backend_capabilities()
        ptz = self.offers_ptz
        capabilities["ptz"] = ptz
        capabilities["presets"] = ptz
        capabilities["presetMutation"] = ptz and self.spec.ptz.allow_preset_mutation
        return capabilities

    def _backend_capabilities(self) -> dict[str, Any]:
        if self.backend is not None:
            return dict(self.backend.capabilities())
        mode = capture_mode(self.spec)
        return {
            "captureModes": [mode],
            "ptz": False,
            "presets": False,
            "presetMutation": False,
            "vendor": None,
            "model": None,
            "warnings": [],
        }

    def snapshot(self, full: bool = True) -> dict[str, Any]:
        """The camera snapshot of sb/list and sb/status (compact: four fields)."""
        compact: dict[str, Any] = {
            "instance": self.spec.instance,
            "enabled": self.spec.enabled,
            "state": self.state,
            "backend": self.spec.backend,
        }
        if not full:
            return compact
        capabilities = self.capabilities()
        canonical = json.dumps(capabilities, sort_keys=True, separators=(",", ":"))
        return {
            **compact,
            "generation": self.generation,
            "capabilities": capabilities,
            "capabilitiesDigest": "sha256:" + hashlib.sha256(canonical.encode()).hexdigest(),
            "connectedAt": rfc3339(self.connected_ms) if self.connected_ms else None,
            "lastError": self.last_error,
            "updatedAt": rfc3339(self.updated_ms),
        }

    def status(self) -> dict[str, Any]:
        """The sb/status element: the full snapshot and the pause flag."""
        return {**self.snapshot(True), "paused": self.paused}

    def camera_block(self) -> dict[str, Any]:
        """The terminal body's camera object: backend, and vendor, model, firmware and serial
        when the backend knows them."""
        block: dict[str, Any] = {"backend": self.spec.backend}
        capabilities = self.capabilities()
        for key in ("vendor", "model", "firmware", "serial"):
            if capabilities.get(key):
                block[key] = capabilities[key]
        return block

    def record_error(self, message: str) -> None:
        """A capture failed in the camera: the session is DEGRADED until one succeeds."""
        self.last_error = message
        self.updated_ms = now_ms()

    def record_success(self) -> None:
        """A frame arrived: a DEGRADED session is ONLINE again."""
        if self.last_error is not None:
            self.last_error = None
            self.updated_ms = now_ms()


class CameraSessions:
    """Every configured camera's session, by instance, in configuration order."""

    def __init__(
        self,
        cameras: Iterable[CameraSpec],
        backend: Callable[[CameraSpec], Backend],
        admission_lock: threading.Lock,
    ) -> None:
        self._sessions = {
            spec.instance: CameraSession(spec, backend(spec) if spec.enabled else None)
            for spec in cameras
        }
        # Admission checks the pause flag under this lock, so a pause never lands halfway
        # through an admission.
        self._admission_lock = admission_lock

    def __iter__(self) -> Iterator[CameraSession]:
        return iter(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    def names(self) -> tuple[str, ...]:
        """The configured instances."""
        return tuple(self._sessions)

    def get(self, instance: str) -> CameraSession:
        """A configured camera; NO_SUCH_INSTANCE otherwise."""
        session = self._sessions.get(instance)
        if session is None:
            raise CommandError(ErrorCode.NO_SUCH_INSTANCE, f"no camera named {instance!r}")
        return session

    def enabled(self, instance: str) -> CameraSession:
        """A configured, enabled camera; NO_SUCH_INSTANCE or CAMERA_DISABLED otherwise."""
        session = self.get(instance)
        if not session.spec.enabled:
            raise CommandError(ErrorCode.CAMERA_DISABLED, f"camera {instance!r} is disabled")
        return session

    def camera_block(self, instance: str) -> dict[str, Any]:
        """The terminal body's camera object ({"backend": "unknown"} for a camera gone)."""
        session = self._sessions.get(instance)
        if session is None:
            return {"backend": "unknown"}
        return session.camera_block()

    def set_paused(self, instance: str, paused: bool) -> bool:
        """Pauses or resumes a camera; whether it changed."""
        session = self.get(instance)
        with self._admission_lock:
            changed = session.paused != paused
            session.paused = paused
        return changed

    def reconnect(self, instance: str) -> None:
        """Drops the camera's live session; the next capture opens a new one."""
        session = self.get(instance)
        if session.backend is not None:
            session.backend.reconnect()
        session.generation += 1
        session.connected_ms = now_ms()
        session.updated_ms = now_ms()

    def add(self, session: CameraSession) -> None:
        """A camera a reload added (order follows `reorder`)."""
        self._sessions[session.instance] = session

    def remove(self, instance: str) -> CameraSession:
        """A camera a reload removed."""
        return self._sessions.pop(instance)

    def reorder(self, instances: Iterable[str]) -> None:
        """Lists the cameras in the configuration's order."""
        self._sessions = {name: self._sessions[name] for name in instances}

    def close(self) -> None:
        """Closes every backend."""
        for session in self._sessions.values():
            if session.backend is not None:
                session.backend.close()
