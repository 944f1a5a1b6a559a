"""Admission: turning capture requests into jobs. Resolves the profile and timeout, admits a
request (or a whole capture group) all or nothing against the limits, commits the jobs
ACCEPTED, queues them QUEUED on their cameras' dispatchers, and holds replies until they are
terminal."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from unskit.camera.announcements import Announcer
from unskit.camera.catalog import Catalog, GroupRecord
from unskit.camera.config import CameraSettings, ProfileSpec, capture_mode
from unskit.camera.jobs import Job, JobState, new_id, now_ms
from unskit.camera.pending import PendingCapture, PendingCaptures
from unskit.camera.queries import CatalogQueries
from unskit.camera.sessions import CameraSession, CameraSessions
from unskit.camera.storage import Storage
from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError

__all__ = ["Admission", "CaptureRequest"]

_BYTES_PER_PIXEL = 3


@dataclass(frozen=True)
class CaptureRequest:
    """One capture to admit: camera, profile, timeout, trigger and caller metadata."""

    camera: str
    profile: str
    timeout_ms: int
    trigger: Mapping[str, Any]
    metadata: Mapping[str, Any]
    correlation_id: str
    request_id: str | None = None


def frame_bytes(session: CameraSession) -> int:
    """The frame memory a capture of this camera holds in flight (width x height x 3)."""
    connection = session.spec.connection
    width = int(connection.get("width", 1920))
    height = int(connection.get("height", 1080))
    return width * height * _BYTES_PER_PIXEL


class Admission:
    """Admits captures against limits, pause, storage pressure and the stop."""

    def __init__(
        self,
        settings: CameraSettings,
        *,
        sessions: CameraSessions,
        pending: PendingCaptures,
        catalog: Catalog,
        storage: Storage,
        queries: CatalogQueries,
        announcer: Announcer,
        stopping: threading.Event,
    ) -> None:
        self._settings = settings
        self._limits = settings.limits
        self._sessions = sessions
        self._pending = pending
        self._catalog = catalog
        self._storage = storage
        self._queries = queries
        self._announcer = announcer
        self._stopping = stopping

    def reconfigure(self, settings: CameraSettings) -> None:
        """New requests follow `settings` (profiles, timeouts, limits)."""
        self._settings = settings
        self._limits = settings.limits

    # -- requests -----------------------------------------------------------------------------

    def profile(self, session: CameraSession, name: str | None) -> ProfileSpec:
        """The named profile (the camera's default when None); UNKNOWN_CAPTURE_PROFILE."""
        name = name or session.spec.default_capture_profile
        profile = self._settings.profiles.get(name)
        if profile is None:
            raise CommandError(
                ErrorCode.UNKNOWN_CAPTURE_PROFILE, f"no capture profile named {name!r}"
            )
        mode = capture_mode(session.spec)
        if profile.capture_mode is not None and profile.capture_mode != mode:
            raise CommandError(
                ErrorCode.UNSUPPORTED_CAPABILITY,
                f"profile {name!r} needs captureMode {profile.capture_mode}; "
                f"camera {session.spec.instance!r} captures {mode}",
            )
        return profile

    def timeout_ms(self, profile: ProfileSpec, requested: int | None) -> int:
        """The request's timeout, else the profile's, else global.timeouts.jobTerminalMs."""
        if requested is not None:
            return requested
        return profile.timeout_ms or self._settings.job_terminal_ms

    def request(
        self,
        session: CameraSession,
        profile_name: str | None,
        timeout_ms: int | None,
        trigger: Mapping[str, Any],
        *,
        metadata: Mapping[str, Any],
        correlation_id: str,
        request_id: str | None = None,
    ) -> CaptureRequest:
        """A capture request with its profile and timeout resolved."""
        profile = self.profile(session, profile_name)
        return CaptureRequest(
            camera=session.instance,
            profile=profile.name,
            timeout_ms=self.timeout_ms(profile, timeout_ms),
            trigger=trigger,
            metadata=metadata,
            correlation_id=correlation_id,
            request_id=request_id,
        )

    # -- admission ----------------------------------------------------------------------------

    def submit(
        self, requests: Sequence[CaptureRequest], group: GroupRecord | None = None
    ) -> list[Job]:
        """Admits all `requests` or none (ACCEPTED, then QUEUED), or raises the refusal."""
        self._check_storage()
        accepted_ms, requested = now_ms(), time.monotonic()
        with self._pending.lock:
            if self._stopping.is_set():
                raise CommandError(ErrorCode.COMPONENT_STOPPING, "the component is stopping")
            self._check_room_locked(requests)
            jobs = [self._job(request, accepted_ms, group) for request in requests]
            try:
                self._catalog.insert(jobs, group)
            except Exception as error:
                raise CommandError(
                    ErrorCode.PERSISTENCE_FAILED, f"the catalog did not take the job: {error}"
                ) from error
            started = time.monotonic()
            captures = [
                PendingCapture(
                    job,
                    frame_bytes(self._sessions.get(job.camera)),
                    started + job.timeout_ms / 1000,
                    profile=self._settings.profiles.get(job.profile),
                    requested=requested,
                )
                for job in jobs
            ]
            self._pending.add_locked(captures, group)
        for capture in captures:
            self._enqueue(capture)
        return jobs

    def _check_room_locked(self, requests: Sequence[CaptureRequest]) -> None:
        limits = self._limits
        wanted: dict[str, int] = {}
        for request in requests:
            session = self._sessions.get(request.camera)
            if not session.spec.enabled:
                raise CommandError(
                    ErrorCode.CAMERA_DISABLED, f"camera {request.camera!r} is disabled"
                )
            if session.paused:
                raise CommandError(ErrorCode.PAUSED, f"camera {request.camera!r} is paused")
            if session.moving:
                # A frame taken while the head moves is blurred and shows the wrong scene.
                raise CommandError(
                    ErrorCode.CAMERA_MOVING,
                    f"camera {request.camera!r} is moving (PTZ); capture when it stops",
                )
            wanted[request.camera] = wanted.get(request.camera, 0) + 1
            capacity = limits.max_queued_captures_per_camera
            queued = len(self._pending.queues[request.camera])
            if queued + wanted[request.camera] > capacity:
                raise CommandError(
                    ErrorCode.QUEUE_FULL,
                    f"camera {request.camera!r} has {queued} captures queued; "
                    f"its capacity is {capacity}",
                )
            need = frame_bytes(session)
            held = self._pending.in_flight_bytes_locked
            if held + need > limits.max_in_flight_bytes:
                raise CommandError(
                    ErrorCode.RESOURCE_LIMIT,
                    f"captures in flight hold {held} bytes of frames; "
                    f"another {need} would pass limits.maxInFlightBytes "
                    f"({limits.max_in_flight_bytes})",
                )
        count = self._pending.count_locked
        if count + len(requests) > limits.max_pending_captures:
            raise CommandError(
                ErrorCode.RESOURCE_LIMIT,
                f"{count} captures are pending; limits.maxPendingCaptures is "
                f"{limits.max_pending_captures}",
            )

    def _job(self, request: CaptureRequest, accepted_ms: int, group: GroupRecord | None) -> Job:
        return Job(
            capture_id=new_id("cap"),
            camera=request.camera,
            state=JobState.ACCEPTED,
            trigger=dict(request.trigger),
            profile=request.profile,
            capture_mode=capture_mode(self._sessions.get(request.camera).spec),
            timeout_ms=request.timeout_ms,
            accepted_ms=accepted_ms,
            correlation_id=request.correlation_id,
            event_id=new_id("evt"),
            request_id=request.request_id,
            group_id=None if group is None else group.group_id,
            group_size=None if group is None else group.size,
            metadata=dict(request.metadata),
        )

    def _check_storage(self) -> None:
        """STORAGE_PRESSURE while a root is below its floor; raises and clears the
        storage-low alarm as the answer changes."""
        reason = self._storage.pressure()
        self._announcer.storage_pressure(reason)
        if reason is not None:
            raise CommandError(ErrorCode.STORAGE_PRESSURE, reason)

    def _enqueue(self, capture: PendingCapture) -> None:
        with capture.lock:
            if capture.done:
                return
            self._catalog.advance(capture.job.capture_id, JobState.QUEUED, (JobState.ACCEPTED,))
            capture.job.state = JobState.QUEUED
        position = self._pending.queues[capture.job.camera].put(capture)
        self._announcer.lifecycle("debug", "capture-queued", capture.job, queuePosition=position)

    # -- held replies -------------------------------------------------------------------------

    def wait_capture(self, capture_id: str) -> Future[Mapping[str, Any]]:
        """A future of the terminal body of an admitted capture."""
        future: Future[Mapping[str, Any]] = Future()
        if self._pending.hold_reply(capture_id, future):
            return future
        job = self._catalog.get(capture_id)
        assert job is not None
        assert job.result is not None
        future.set_result(job.result)
        return future

    def wait_group(self, group_id: str) -> Future[Mapping[str, Any]]:
        """A future of the sb/capture-group reply, settled when every member is terminal."""
        future: Future[Mapping[str, Any]] = Future()
        if not self._pending.hold_group_reply(group_id, future):
            future.set_result(self._queries.group_reply(group_id))
        return future
