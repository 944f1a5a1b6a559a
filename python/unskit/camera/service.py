"""The capture service: admission, per-camera dispatchers, the capture pipeline, deadlines,
cancellation, schedules and the terminal announcements.

Every job transition is committed to the catalog before anything observes it (a reply, an
event, an announcement). A job's terminal transition happens once, under the job's lock,
whoever gets there first: its worker, the deadline watchdog, or a cancel.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from unskit.camera.backends import Acquired, Backend, create_backend
from unskit.camera.catalog import Catalog, GroupRecord
from unskit.camera.codec import Thumbnail, encode_jpeg, jpeg_dimensions, thumbnail
from unskit.camera.config import BACKEND_MODES, CameraSettings, CameraSpec, ProfileSpec
from unskit.camera.jobs import (
    BACKLOG,
    IN_FLIGHT,
    NON_TERMINAL,
    PROGRESS,
    Job,
    JobState,
    new_id,
    now_ms,
    rfc3339,
)
from unskit.camera.storage import Storage
from unskit.commands.codes import ErrorCode
from unskit.config.secrets import SecretResolver
from unskit.envelope import MAX_OPAQUE_BYTES, EnvelopeStamp, MessageBuilder
from unskit.errors import CaptureError, CommandError, UnskitError
from unskit.messaging import MessagingClient
from unskit.runtime.events import Events
from unskit.runtime.metrics import MetricsRegistry
from unskit.topics import TopicScope

__all__ = ["CameraService", "CameraState", "CaptureRequest", "group_state"]

_log = logging.getLogger(__name__)

#: Outcome -> (envelope header name, channel) of the terminal announcement.
ANNOUNCEMENTS = {
    JobState.SUCCEEDED: ("ImageCaptured", "captured"),
    JobState.FAILED: ("ImageCaptureFailed", "failed"),
    JobState.INTERRUPTED: ("ImageCaptureFailed", "failed"),
    JobState.CANCELLED: ("ImageCaptureCancelled", "cancelled"),
}
#: The stage a failure is reported in, by the state the job was in.
STAGES = {
    JobState.ACCEPTED: "queue",
    JobState.QUEUED: "queue",
    JobState.ACQUIRING: "acquisition",
    JobState.ENCODING: "encoding",
    JobState.PERSISTING: "persistence",
}
# In-flight work a drain waits for before it leaves the rest to restart recovery.
DRAIN_WAIT_S = 5.0
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


@dataclass
class _Active:
    """A non-terminal job held in memory with what its pipeline measured."""

    job: Job
    #: The frame memory this capture needs while in flight (an estimate: width x height x 3).
    frame_bytes: int
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    abandon: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    #: Whether frame_bytes is counted in the in-flight budget right now.
    holding: bool = False
    waiters: list[Future[Mapping[str, Any]]] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    thumbnail: Thumbnail | None = None


@dataclass
class _GroupWaiter:
    record: GroupRecord
    remaining: set[str]
    waiters: list[Future[Mapping[str, Any]]] = field(default_factory=list)


class CameraState:
    """A configured camera at run time: its backend, pause flag and dispatcher queue."""

    def __init__(self, spec: CameraSpec, backend: Backend | None) -> None:
        self.spec = spec
        self.backend = backend
        self.paused = False
        self.queue: deque[_Active] = deque()
        self.ready = threading.Condition()
        self.generation = 1
        self.connected_ms: int | None = now_ms() if backend is not None else None
        self.last_error: str | None = None
        self.updated_ms = now_ms()
        self.thread: threading.Thread | None = None

    @property
    def state(self) -> str:
        """ONLINE, DEGRADED (the last capture failed in the camera) or DISABLED."""
        if not self.spec.enabled:
            return "DISABLED"
        return "ONLINE" if self.last_error is None else "DEGRADED"

    def capabilities(self) -> dict[str, Any]:
        """The backend's capabilities (a disabled camera's are derived from its backend)."""
        if self.backend is not None:
            return self.backend.capabilities()
        mode = BACKEND_MODES[self.spec.backend]
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


def group_state(members: Sequence[Job]) -> str:
    """COMPLETED, PARTIAL or FAILED once all members are terminal, else the laggard's state."""
    live = [job.state for job in members if not job.terminal]
    if live:
        return min(live, key=PROGRESS.index).value
    succeeded = sum(job.state is JobState.SUCCEEDED for job in members)
    if succeeded == len(members):
        return "COMPLETED"
    return "PARTIAL" if succeeded else "FAILED"


class CameraService:
    """Owns the cameras, the catalog and the pipeline; the verbs call into it."""

    def __init__(
        self,
        settings: CameraSettings,
        *,
        messaging: MessagingClient,
        topics: TopicScope,
        stamp: EnvelopeStamp,
        metrics: MetricsRegistry,
        events: Events | None,
        secrets: SecretResolver | None = None,
        ipc: bool = False,
    ) -> None:
        self.settings = settings
        self.limits = settings.limits
        self._messaging = messaging
        self._topics = topics
        self._stamp = stamp
        self._metrics = metrics
        self._events = events if settings.capture_lifecycle_events else None
        self._alarms = events
        self._ipc = ipc
        self.storage = Storage(settings.storage)
        self.storage.prepare()
        self.catalog = Catalog(
            settings.storage.state_root / "catalog.sqlite3",
            synchronous_full=settings.storage.fsync,
            retention=settings.retention,
        )

        def factory(spec: CameraSpec) -> Backend:
            return create_backend(spec.backend, spec.connection, secrets)

        self.cameras: dict[str, CameraState] = {}
        for spec in settings.cameras.values():
            self.cameras[spec.instance] = CameraState(spec, factory(spec) if spec.enabled else None)
        self._lock = threading.Lock()
        self._active: dict[str, _Active] = {}
        self._groups: dict[str, _GroupWaiter] = {}
        # Frame memory of the captures in flight (ACQUIRING to PERSISTING), against
        # limits.maxInFlightBytes; queued captures hold none and wait for room.
        self._in_flight_bytes = 0
        self._budget = threading.Condition(self._lock)
        self._slots = threading.BoundedSemaphore(self.limits.max_concurrent_captures)
        self._busy_slots = 0
        self._stopping = threading.Event()
        self._deadlines: list[tuple[float, str]] = []
        self._deadline_ready = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._idle = threading.Condition(self._lock)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Recovers what the previous run left, then starts dispatchers, watchdog, schedules."""
        self.recover()
        for camera in self.cameras.values():
            if camera.spec.enabled:
                camera.thread = self._spawn(
                    f"camera-{camera.spec.instance}", self._dispatch, camera
                )
        self._spawn("camera-deadlines", self._watch_deadlines)
        if any(camera.spec.schedules for camera in self.cameras.values()):
            self._spawn("camera-schedules", self._run_schedules)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def recover(self) -> list[Job]:
        """Commits every job a previous run left non-terminal as INTERRUPTED, then announces it."""
        interrupted = []
        for job in self.catalog.in_states(NON_TERMINAL):
            # An image renamed into place just before the crash has no committed SUCCEEDED:
            # it is not this capture's outcome, so it goes.
            if self.storage.remove_outputs(job.camera, job.capture_id, job.accepted_ms):
                _log.info("removed the uncommitted image of interrupted %s", job.capture_id)
            error = CaptureError(
                ErrorCode.PROCESS_INTERRUPTED,
                STAGES[job.state],
                f"the component stopped while the capture was {job.state.value}",
            )
            job.terminal_ms = now_ms()
            job.result = self._body(job, None, JobState.INTERRUPTED, failure=error.to_failure())
            job.state = JobState.INTERRUPTED
            job.error_code, job.error_message = error.code, error.message
            if self.catalog.finish(job):
                interrupted.append(job)
        for job in interrupted:
            self._announce(job, None)
        if interrupted:
            _log.warning("%d captures were interrupted by the last stop", len(interrupted))
        return interrupted

    def drain(self) -> None:
        """Fails the backlog with COMPONENT_STOPPING and lets in-flight captures finish."""
        # What still runs after DRAIN_WAIT_S becomes INTERRUPTED at the next start.
        self._stopping.set()
        with self._lock:
            backlog = [a for a in self._active.values() if a.job.state in BACKLOG]
        for active in backlog:
            error = CaptureError(
                ErrorCode.COMPONENT_STOPPING, "queue", "the component stopped before the capture"
            )
            self._fail(active, error)
        deadline = time.monotonic() + DRAIN_WAIT_S
        with self._lock:
            while self._active and time.monotonic() < deadline:
                self._idle.wait(max(deadline - time.monotonic(), 0.0))
            self._deadline_ready.notify_all()
            self._budget.notify_all()
            left = list(self._active.values())
        # What still runs is left non-terminal in the catalog (INTERRUPTED at the next start);
        # its worker sees it done and stops touching the catalog.
        for active in left:
            with active.lock:
                active.done = True
            active.abandon.set()
        for camera in self.cameras.values():
            with camera.ready:
                camera.ready.notify_all()
            if camera.backend is not None:
                camera.backend.close()
        self.catalog.close()

    @property
    def stopping(self) -> bool:
        """True once drain has begun."""
        return self._stopping.is_set()

    # -- admission --------------------------------------------------------------------------

    def camera(self, instance: str) -> CameraState:
        """A configured camera; NO_SUCH_INSTANCE otherwise."""
        camera = self.cameras.get(instance)
        if camera is None:
            raise CommandError(ErrorCode.NO_SUCH_INSTANCE, f"no camera named {instance!r}")
        return camera

    def profile(self, camera: CameraState, name: str | None) -> ProfileSpec:
        """The named profile (the camera's default when None); UNKNOWN_CAPTURE_PROFILE."""
        name = name or camera.spec.default_capture_profile
        profile = self.settings.profiles.get(name)
        if profile is None:
            raise CommandError(
                ErrorCode.UNKNOWN_CAPTURE_PROFILE, f"no capture profile named {name!r}"
            )
        mode = BACKEND_MODES[camera.spec.backend]
        if profile.capture_mode is not None and profile.capture_mode != mode:
            raise CommandError(
                ErrorCode.UNSUPPORTED_CAPABILITY,
                f"profile {name!r} needs captureMode {profile.capture_mode}; "
                f"camera {camera.spec.instance!r} captures {mode}",
            )
        return profile

    def timeout_ms(self, profile: ProfileSpec, requested: int | None) -> int:
        """The request's timeout, else the profile's, else global.timeouts.jobTerminalMs."""
        if requested is not None:
            return requested
        return profile.timeout_ms or self.settings.job_terminal_ms

    def _frame_bytes(self, camera: CameraState) -> int:
        connection = camera.spec.connection
        width = int(connection.get("width", 1920))
        height = int(connection.get("height", 1080))
        return width * height * _BYTES_PER_PIXEL

    def submit(
        self, requests: Sequence[CaptureRequest], group: GroupRecord | None = None
    ) -> list[Job]:
        """Admits all `requests` or none (ACCEPTED, then QUEUED), or raises the refusal."""
        self._check_storage()
        accepted_ms = now_ms()
        with self._lock:
            if self._stopping.is_set():
                raise CommandError(ErrorCode.COMPONENT_STOPPING, "the component is stopping")
            wanted: dict[str, int] = {}
            for request in requests:
                camera = self.cameras[request.camera]
                if not camera.spec.enabled:
                    raise CommandError(
                        ErrorCode.CAMERA_DISABLED, f"camera {request.camera!r} is disabled"
                    )
                if camera.paused:
                    raise CommandError(ErrorCode.PAUSED, f"camera {request.camera!r} is paused")
                wanted[request.camera] = wanted.get(request.camera, 0) + 1
                capacity = self.limits.max_queued_captures_per_camera
                if len(camera.queue) + wanted[request.camera] > capacity:
                    raise CommandError(
                        ErrorCode.QUEUE_FULL,
                        f"camera {request.camera!r} has {len(camera.queue)} captures queued; "
                        f"its capacity is {capacity}",
                    )
                need = self._frame_bytes(camera)
                if self._in_flight_bytes + need > self.limits.max_in_flight_bytes:
                    raise CommandError(
                        ErrorCode.RESOURCE_LIMIT,
                        f"captures in flight hold {self._in_flight_bytes} bytes of frames; "
                        f"another {need} would pass limits.maxInFlightBytes "
                        f"({self.limits.max_in_flight_bytes})",
                    )
            pending = len(self._active) + len(requests)
            if pending > self.limits.max_pending_captures:
                raise CommandError(
                    ErrorCode.RESOURCE_LIMIT,
                    f"{len(self._active)} captures are pending; limits.maxPendingCaptures is "
                    f"{self.limits.max_pending_captures}",
                )
            jobs = [
                Job(
                    capture_id=new_id("cap"),
                    camera=request.camera,
                    state=JobState.ACCEPTED,
                    trigger=dict(request.trigger),
                    profile=request.profile,
                    capture_mode=BACKEND_MODES[self.cameras[request.camera].spec.backend],
                    timeout_ms=request.timeout_ms,
                    accepted_ms=accepted_ms,
                    correlation_id=request.correlation_id,
                    event_id=new_id("evt"),
                    request_id=request.request_id,
                    group_id=None if group is None else group.group_id,
                    group_size=None if group is None else group.size,
                    metadata=dict(request.metadata),
                )
                for request in requests
            ]
            try:
                self.catalog.insert(jobs, group)
            except Exception as error:
                raise CommandError(
                    ErrorCode.PERSISTENCE_FAILED, f"the catalog did not take the job: {error}"
                ) from error
            started = time.monotonic()
            actives = []
            for job in jobs:
                camera = self.cameras[job.camera]
                active = _Active(job, self._frame_bytes(camera), started + job.timeout_ms / 1000)
                self._active[job.capture_id] = active
                heapq.heappush(self._deadlines, (active.deadline, job.capture_id))
                actives.append(active)
            if group is not None:
                self._groups[group.group_id] = _GroupWaiter(group, {job.capture_id for job in jobs})
            self._deadline_ready.notify_all()
        for active in actives:
            self._enqueue(active)
        return jobs

    def _check_storage(self) -> None:
        """STORAGE_PRESSURE while a root is below its floor; raises and clears the
        storage-low alarm as the answer changes."""
        reason = self.storage.pressure()
        if self._alarms is not None:
            try:
                if reason is not None:
                    self._alarms.raise_alarm("storage-low", {"reason": reason})
                else:
                    self._alarms.clear_alarm("storage-low")
            except UnskitError as error:
                _log.warning("storage-low alarm not published: %s", error)
        if reason is not None:
            raise CommandError(ErrorCode.STORAGE_PRESSURE, reason)

    def _enqueue(self, active: _Active) -> None:
        camera = self.cameras[active.job.camera]
        with active.lock:
            if active.done:
                return
            self.catalog.advance(active.job.capture_id, JobState.QUEUED, (JobState.ACCEPTED,))
            active.job.state = JobState.QUEUED
        with camera.ready:
            camera.queue.append(active)
            position = len(camera.queue)
            camera.ready.notify()
        self._lifecycle("debug", "capture-queued", active, queuePosition=position)

    def wait_capture(self, capture_id: str) -> Future[Mapping[str, Any]]:
        """A future of the terminal body of an admitted capture."""
        future: Future[Mapping[str, Any]] = Future()
        with self._lock:
            active = self._active.get(capture_id)
            if active is not None:
                active.waiters.append(future)
                return future
        job = self.catalog.get(capture_id)
        assert job is not None
        assert job.result is not None
        future.set_result(job.result)
        return future

    def wait_group(self, group_id: str) -> Future[Mapping[str, Any]]:
        """A future of the sb/capture-group reply, settled when every member is terminal."""
        future: Future[Mapping[str, Any]] = Future()
        with self._lock:
            waiter = self._groups.get(group_id)
            if waiter is not None:
                waiter.waiters.append(future)
                return future
        future.set_result(self.group_reply(group_id))
        return future

    def group_reply(self, group_id: str) -> dict[str, Any]:
        """The sb/capture-group reply: id, requestId, aggregate state, member bodies."""
        record = self.catalog.group(group_id)
        assert record is not None
        members = self.catalog.members(group_id)
        return {
            "captureGroupId": group_id,
            "requestId": record.request_id,
            "state": group_state(members),
            "members": [dict(job.result) for job in members if job.result is not None],
        }

    # -- the pipeline -----------------------------------------------------------------------

    def _dispatch(self, camera: CameraState) -> None:
        while True:
            with camera.ready:
                while not camera.queue and not self._stopping.is_set():
                    camera.ready.wait()
                if self._stopping.is_set() and not camera.queue:
                    return
                active = camera.queue.popleft()
            if active.done:
                continue
            remaining = active.deadline - time.monotonic()
            if not self._slots.acquire(timeout=max(remaining, 0.0)):
                continue  # the deadline watchdog fails it
            try:
                if self._hold_budget(active):
                    self._process(camera, active)
            except Exception:
                _log.exception("capture %s failed unexpectedly", active.job.capture_id)
                self._fail(
                    active,
                    CaptureError(
                        ErrorCode.BACKEND_ERROR,
                        STAGES.get(active.job.state, "acquisition"),
                        "internal error; see the log",
                    ),
                )
            finally:
                self._slots.release()

    def _hold_budget(self, active: _Active) -> bool:
        """Waits until the capture's frame fits limits.maxInFlightBytes (or its deadline)."""
        with self._lock:
            while self._in_flight_bytes + active.frame_bytes > self.limits.max_in_flight_bytes:
                remaining = active.deadline - time.monotonic()
                if active.done or remaining <= 0 or self._stopping.is_set():
                    return False
                self._budget.wait(remaining)
            if active.done:
                return False
            self._in_flight_bytes += active.frame_bytes
            active.holding = True
            return True

    def _advance(self, active: _Active, to: JobState) -> bool:
        with active.lock:
            if active.done:
                return False
            self.catalog.advance(active.job.capture_id, to, NON_TERMINAL)
            active.job.state = to
            return True

    def _process(self, camera: CameraState, active: _Active) -> None:
        job = active.job
        assert camera.backend is not None
        profile = self.settings.profiles[job.profile]
        if not self._advance(active, JobState.ACQUIRING):
            return
        active.marks["acquisitionStarted"] = now_ms()
        self._lifecycle("info", "capture-started", active, captureMode=job.capture_mode)
        try:
            acquired = camera.backend.grab(active.deadline, active.abandon)
        except CaptureError as error:
            camera.last_error = error.message
            camera.updated_ms = now_ms()
            self._fail(active, error)
            return
        if camera.last_error is not None:
            camera.last_error = None
            camera.updated_ms = now_ms()
        active.marks["acquired"] = now_ms()
        if not self._advance(active, JobState.ENCODING):
            return
        try:
            if acquired.encoded is not None and profile.store_as_received:
                data = acquired.encoded
            else:
                data = encode_jpeg(acquired.frame, profile.quality)
            if profile.thumbnail_size is not None:
                # The edge-runtime IPC bus carries only the small size.
                size = "small" if self._ipc else profile.thumbnail_size
                active.thumbnail = thumbnail(acquired.frame, size)
        except ValueError as error:
            self._fail(
                active,
                CaptureError(ErrorCode.UNSUPPORTED_PIXEL_FORMAT, "encoding", str(error)),
                acquired,
            )
            return
        active.marks["encoded"] = now_ms()
        if not self._advance(active, JobState.PERSISTING):
            return
        sidecar = None
        if self.settings.storage.sidecar:
            sidecar = self._sidecar(active, acquired, data)
        try:
            staged = self.storage.stage(
                job.camera, job.capture_id, data, "jpg", sidecar, job.accepted_ms
            )
        except CaptureError as error:
            self._fail(active, error, acquired)
            return
        failure: CaptureError | None = None
        with active.lock:
            if active.done:
                self.storage.discard(staged)
                return
            try:
                self.storage.install(staged)
            except CaptureError as error:
                failure = error
            else:
                active.marks["persisted"] = now_ms()
                image = {
                    "absolutePath": str(staged.image_path),
                    "relativePath": staged.relative_path,
                    "fileUri": staged.image_path.as_uri(),
                    "contentType": "image/jpeg",
                    "encoding": "jpeg",
                    "bytes": staged.size,
                    "sha256": staged.sha256,
                }
                if staged.sidecar_relative_path is not None:
                    image["metadataSidecarRelativePath"] = staged.sidecar_relative_path
                self._settle_locked(active, JobState.SUCCEEDED, acquired, image=image)
        if failure is not None:
            self._fail(active, failure, acquired)
            return
        self._after_terminal(active)

    def _sidecar(self, active: _Active, acquired: Acquired, data: bytes) -> dict[str, Any]:
        job = active.job
        width, height = jpeg_dimensions(data) or (acquired.frame.width, acquired.frame.height)
        return {
            "schemaVersion": 1,
            "captureId": job.capture_id,
            "cameraId": job.camera,
            "trigger": dict(job.trigger),
            "captureProfile": job.profile,
            "captureMode": job.capture_mode,
            "timestamps": self._timestamps(job, active.marks, acquired),
            "image": {
                "contentType": "image/jpeg",
                "encoding": "jpeg",
                "bytes": len(data),
                "width": width,
                "height": height,
                "sha256": None,
            },
            "frame": self._frame(acquired),
            "camera": self._camera_block(job.camera),
            "metadata": dict(job.metadata),
        }

    # -- terminal transitions ---------------------------------------------------------------

    def _fail(self, active: _Active, error: CaptureError, acquired: Acquired | None = None) -> bool:
        with active.lock:
            if active.done:
                return False
            self._settle_locked(active, JobState.FAILED, acquired, failure=error.to_failure())
        self._after_terminal(active)
        return True

    def cancel(self, capture_id: str, reason: str) -> tuple[bool, JobState]:
        """Cancels a non-terminal capture: (cancelled, state after)."""
        with self._lock:
            active = self._active.get(capture_id)
        if active is not None:
            with active.lock:
                if not active.done:
                    active.abandon.set()
                    self._settle_locked(active, JobState.CANCELLED, None, reason=reason)
                    cancelled = True
                else:
                    cancelled = False
            if cancelled:
                self._remove_queued(active)
                self._after_terminal(active)
                return True, JobState.CANCELLED
        job = self.catalog.get(capture_id)
        if job is None:
            raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no capture {capture_id!r}")
        return False, job.state

    def _remove_queued(self, active: _Active) -> None:
        camera = self.cameras[active.job.camera]
        with camera.ready, contextlib.suppress(ValueError):
            camera.queue.remove(active)

    def _settle_locked(
        self,
        active: _Active,
        state: JobState,
        acquired: Acquired | None,
        *,
        image: Mapping[str, Any] | None = None,
        failure: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """Commits the terminal state (the caller holds active.lock)."""
        job = active.job
        previous = job.state
        job.terminal_ms = now_ms()
        body = self._body(job, acquired, state, image=image, failure=failure, marks=active.marks)
        if state is JobState.CANCELLED:
            job.error_code = ErrorCode.CAPTURE_CANCELLED.value
            job.error_message = reason
        elif failure is not None:
            job.error_code = str(failure["code"])
            job.error_message = str(failure["message"])
        job.result = body
        job.state = state
        if not self.catalog.finish(job):
            _log.error("capture %s was already terminal in the catalog", job.capture_id)
        active.done = True
        _log.debug("capture %s: %s -> %s", job.capture_id, previous.value, state.value)

    def _after_terminal(self, active: _Active) -> None:
        """After the commit: frees admission, announces once, settles the held replies."""
        self._remove_queued(active)
        job = active.job
        group_done: _GroupWaiter | None = None
        with self._lock:
            self._active.pop(job.capture_id, None)
            if active.holding:
                self._in_flight_bytes -= active.frame_bytes
                active.holding = False
            # Also wakes a capture that waited for room and was cancelled meanwhile.
            self._budget.notify_all()
            if job.group_id is not None:
                waiter = self._groups.get(job.group_id)
                if waiter is not None:
                    waiter.remaining.discard(job.capture_id)
                    if not waiter.remaining:
                        group_done = self._groups.pop(job.group_id)
            self._idle.notify_all()
        self._metrics.counter("captures", "terminal", {"state": job.state.value}).inc()
        self._announce(job, active.thumbnail)
        assert job.result is not None
        for future in active.waiters:
            future.set_result(job.result)
        if group_done is not None and group_done.waiters:
            reply = self.group_reply(group_done.record.group_id)
            for future in group_done.waiters:
                future.set_result(reply)

    # -- bodies -----------------------------------------------------------------------------

    @staticmethod
    def _timestamps(
        job: Job, marks: Mapping[str, int], acquired: Acquired | None
    ) -> dict[str, Any]:
        stamps: dict[str, Any] = {"requestedAt": rfc3339(job.accepted_ms)}
        if "acquisitionStarted" in marks:
            stamps["acquisitionStartedAt"] = rfc3339(marks["acquisitionStarted"])
        quality = "unknown"
        if acquired is not None:
            if acquired.camera_frame_at_ms is not None:
                stamps["cameraFrameAt"] = rfc3339(acquired.camera_frame_at_ms)
                quality = "device"
            else:
                quality = "adapter-receive"
            stamps["frameReceivedAt"] = rfc3339(acquired.frame_received_at_ms)
        if "persisted" in marks:
            stamps["persistedAt"] = rfc3339(marks["persisted"])
        stamps["cameraFrameTimestampQuality"] = quality
        return stamps

    @staticmethod
    def _frame(acquired: Acquired) -> dict[str, Any]:
        return {
            "width": acquired.frame.width,
            "height": acquired.frame.height,
            "pixelFormat": acquired.frame.pixel_format,
            "sourceEncoding": acquired.frame.source_encoding,
        }

    def _camera_block(self, instance: str) -> dict[str, Any]:
        camera = self.cameras.get(instance)
        if camera is None:
            return {"backend": "unknown"}
        block: dict[str, Any] = {"backend": camera.spec.backend}
        capabilities = camera.capabilities()
        for key in ("vendor", "model"):
            if capabilities.get(key):
                block[key] = capabilities[key]
        return block

    def _body(
        self,
        job: Job,
        acquired: Acquired | None,
        state: JobState,
        *,
        image: Mapping[str, Any] | None = None,
        failure: Mapping[str, Any] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """The terminal capture body (schemaVersion 1)."""
        marks = marks or {}
        terminal_ms = job.terminal_ms or now_ms()
        stamps = self._timestamps(job, marks, acquired)
        durations: dict[str, int] = {}
        if "acquisitionStarted" in marks:
            durations["queue"] = marks["acquisitionStarted"] - job.accepted_ms
            if "acquired" in marks:
                durations["acquisition"] = marks["acquired"] - marks["acquisitionStarted"]
        if "encoded" in marks and "acquired" in marks:
            durations["encoding"] = marks["encoded"] - marks["acquired"]
        if "persisted" in marks and "encoded" in marks:
            durations["persistence"] = marks["persisted"] - marks["encoded"]
        durations["total"] = terminal_ms - job.accepted_ms
        body: dict[str, Any] = {
            "schemaVersion": 1,
            "eventId": job.event_id,
            "captureId": job.capture_id,
            "cameraId": job.camera,
            "correlationId": job.correlation_id,
            "trigger": dict(job.trigger),
            "captureProfile": job.profile,
            "captureMode": job.capture_mode,
            "timestamps": stamps,
            "durationsMs": durations,
        }
        if state is JobState.SUCCEEDED and image is not None:
            body["image"] = dict(image)
        if acquired is not None:
            body["frame"] = self._frame(acquired)
        body["camera"] = self._camera_block(job.camera)
        body["metadata"] = dict(job.metadata)
        if failure is not None:
            body["failure"] = dict(failure)
        if job.group_id is not None:
            body["captureGroupId"] = job.group_id
            body["groupSize"] = job.group_size
        if acquired is not None and acquired.backend_metadata:
            body["backendMetadata"] = dict(acquired.backend_metadata)
        return body

    # -- announcements and events -----------------------------------------------------------

    def _announce(self, job: Job, thumb: Thumbnail | None) -> None:
        """Publishes the terminal message once, best effort; a thumbnail the message cannot
        carry is dropped (and counted) and the result published without it."""
        name, channel = ANNOUNCEMENTS[job.state]
        topic = self._topics.topic("app", "image", channel, instance=job.camera)
        assert job.result is not None
        body = dict(job.result)
        if thumb is not None:
            if len(thumb.data) <= MAX_OPAQUE_BYTES:
                body["thumbnail"] = thumb.to_body()
            else:
                self._metrics.counter("captures", "thumbnailsDropped").inc()
        try:
            try:
                self._messaging.publish(topic, self._message(name, job, body))
            except UnskitError:
                if "thumbnail" not in body:
                    raise
                self._metrics.counter("captures", "thumbnailsDropped").inc()
                self._messaging.publish(topic, self._message(name, job, dict(job.result)))
        except UnskitError as error:
            self._metrics.counter("captures", "announcementsLost").inc()
            _log.warning("capture %s: announcement not published: %s", job.capture_id, error)

    def _message(self, name: str, job: Job, body: Mapping[str, Any]) -> Any:
        return (
            MessageBuilder(name, "1.0", self._stamp)
            .instance(job.camera)
            .correlation_id(job.correlation_id)
            .body(dict(body))
            .build()
        )

    def _lifecycle(self, severity: str, kind: str, active: _Active, **extra: Any) -> None:
        if self._events is None:
            return
        job = active.job
        context = {
            "captureId": job.capture_id,
            "trigger": job.trigger.get("type"),
            "captureProfile": job.profile,
            **extra,
        }
        try:
            self._events.emit(severity, kind, context, instance=job.camera)
        except UnskitError as error:
            # Diagnostics never delay or fail a capture.
            _log.debug("lifecycle event %s dropped: %s", kind, error)

    # -- deadlines --------------------------------------------------------------------------

    def _watch_deadlines(self) -> None:
        while not self._stopping.is_set():
            expired: list[_Active] = []
            with self._lock:
                now = time.monotonic()
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, capture_id = heapq.heappop(self._deadlines)
                    active = self._active.get(capture_id)
                    if active is not None:
                        expired.append(active)
                if not expired:
                    wait = self._deadlines[0][0] - now if self._deadlines else None
                    self._deadline_ready.wait(wait)
                    continue
            for active in expired:
                active.abandon.set()
                stage = STAGES.get(active.job.state, "queue")
                self._fail(
                    active,
                    CaptureError(
                        ErrorCode.CAPTURE_TIMEOUT,
                        stage,
                        f"no terminal state within {active.job.timeout_ms} ms",
                    ),
                )

    # -- schedules --------------------------------------------------------------------------

    def _run_schedules(self) -> None:
        start = time.monotonic()
        start_ms = now_ms()
        heap: list[tuple[float, int, str, int]] = []
        for camera in self.cameras.values():
            if not camera.spec.enabled:
                continue
            for index, schedule in enumerate(camera.spec.schedules):
                if schedule.enabled:
                    first = schedule.interval_ms / 1000
                    heapq.heappush(heap, (start + first, index, camera.spec.instance, 1))
        while heap and not self._stopping.is_set():
            due, index, instance, count = heap[0]
            if self._stopping.wait(max(due - time.monotonic(), 0.0)):
                return
            heapq.heappop(heap)
            camera = self.cameras[instance]
            schedule = camera.spec.schedules[index]
            intended_ms = start_ms + count * schedule.interval_ms
            self._fire(camera, schedule.id, schedule.capture_profile, intended_ms)
            # Fires missed while one was busy are skipped, not bunched up.
            following = count + 1
            now = time.monotonic()
            while start + following * schedule.interval_ms / 1000 <= now:
                following += 1
            heapq.heappush(
                heap,
                (start + following * schedule.interval_ms / 1000, index, instance, following),
            )

    def _fire(
        self, camera: CameraState, schedule_id: str, profile_name: str | None, at: int
    ) -> None:
        instance = camera.spec.instance
        if camera.paused:
            self._metrics.counter("schedules", "held", {"camera": instance}).inc()
            return
        try:
            profile = self.profile(camera, profile_name)
            request = CaptureRequest(
                camera=instance,
                profile=profile.name,
                timeout_ms=self.timeout_ms(profile, None),
                trigger={
                    "type": "schedule",
                    "scheduleId": schedule_id,
                    "intendedFireTime": rfc3339(at),
                },
                metadata={},
                correlation_id=str(uuid.uuid4()),
            )
            self.submit([request])
        except CommandError as error:
            self._metrics.counter("schedules", "refused", {"camera": instance}).inc()
            _log.warning("schedule %s of %s not admitted: %s", schedule_id, instance, error)

    # -- administration ---------------------------------------------------------------------

    def set_paused(self, instance: str, paused: bool) -> bool:
        """Pauses or resumes a camera; whether it changed."""
        camera = self.camera(instance)
        with self._lock:
            changed = camera.paused != paused
            camera.paused = paused
        return changed

    def reconnect(self, instance: str) -> None:
        """Drops the camera's live session; the next capture opens a new one."""
        camera = self.camera(instance)
        if camera.backend is not None:
            camera.backend.reconnect()
        camera.generation += 1
        camera.connected_ms = now_ms()
        camera.updated_ms = now_ms()

    def queued(self, instance: str) -> int:
        """Captures waiting in a camera's dispatcher."""
        camera = self.cameras[instance]
        with camera.ready:
            return len(camera.queue)

    def admission(self) -> dict[str, Any]:
        """What is free right now, for sb/queue-status."""
        with self._lock:
            in_flight = sum(a.job.state in IN_FLIGHT for a in self._active.values())
            reserved = self._in_flight_bytes
        available = max(self.limits.max_concurrent_captures - in_flight, 0)
        return {
            "availableAcquisitions": available,
            "availableResourceGroupAcquisitions": {},
            "availableMemoryBytes": max(self.limits.max_in_flight_bytes - reserved, 0),
            "outstandingDiskBytes": reserved,
            "availableEncoders": available,
            "availableWriters": available,
        }

    def active_ids(self, instance: str | None, states: Iterable[JobState]) -> list[str]:
        """captureIds of jobs held in memory in `states` (of one camera when given)."""
        wanted = set(states)
        with self._lock:
            return [
                capture_id
                for capture_id, active in self._active.items()
                if active.job.state in wanted
                and (instance is None or active.job.camera == instance)
            ]
