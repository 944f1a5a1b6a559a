"""The capture pipeline: one dispatcher per camera takes its queued captures in order and runs
each through acquisition, encoding and persistence, within limits.maxConcurrentCaptures slots
and the in-flight frame budget.

Every step is committed to the catalog before the next begins; a step that finds its capture
already terminal (timed out, cancelled, drained) stops without touching it.
"""

from __future__ import annotations

import logging
import threading
import time

from unskit.camera.announcements import Announcer
from unskit.camera.backends import Acquired
from unskit.camera.bodies import sidecar
from unskit.camera.catalog import Catalog
from unskit.camera.codec import encode_jpeg, thumbnail
from unskit.camera.config import CameraSettings, ProfileSpec
from unskit.camera.freshness import Judgement
from unskit.camera.jobs import NON_TERMINAL, STAGES, JobState, now_ms
from unskit.camera.outcomes import Outcomes
from unskit.camera.pending import PendingCapture, PendingCaptures
from unskit.camera.sessions import CameraSession
from unskit.camera.storage import Storage
from unskit.commands.codes import ErrorCode
from unskit.errors import CaptureError
from unskit.runtime.metrics import MetricsRegistry

__all__ = ["CapturePipeline"]

_log = logging.getLogger(__name__)

#: The pause before asking a camera again for a frame `freshness: require` refused for its
#: age (a snapshot camera is asked by a new GET; a stream's grab waits for a new frame).
STALE_RETRY_S = 0.2


class CapturePipeline:
    """Runs queued captures: acquire from the camera, encode, persist, settle."""

    def __init__(
        self,
        settings: CameraSettings,
        *,
        pending: PendingCaptures,
        outcomes: Outcomes,
        catalog: Catalog,
        storage: Storage,
        announcer: Announcer,
        metrics: MetricsRegistry,
        stopping: threading.Event,
        ipc: bool,
    ) -> None:
        self._metrics = metrics
        self._settings = settings
        self._pending = pending
        self._outcomes = outcomes
        self._catalog = catalog
        self._storage = storage
        self._announcer = announcer
        self._stopping = stopping
        self._ipc = ipc
        self._slots = threading.BoundedSemaphore(settings.limits.max_concurrent_captures)

    def dispatch(self, session: CameraSession) -> None:
        """A camera's dispatcher: runs its queued captures one at a time, until the stop."""
        queue = self._pending.queues[session.instance]
        while True:
            capture = queue.take(self._stopping)
            if capture is None:
                return
            if capture.done:
                continue
            remaining = capture.deadline - time.monotonic()
            # A reload may replace the semaphore: the slot goes back where it was taken.
            slots = self._slots
            if not slots.acquire(timeout=max(remaining, 0.0)):
                continue  # the deadline watchdog fails it
            try:
                # A reload restarting this camera waits for the capture in hand, and
                # the next one waits for the restarted camera.
                session.ready.wait(max(capture.deadline - time.monotonic(), 0.0))
                if self._pending.hold_budget(capture, self._stopping):
                    with session.in_use:
                        self._process(session, capture)
            except Exception:
                _log.exception("capture %s failed unexpectedly", capture.job.capture_id)
                self._outcomes.fail(
                    capture,
                    CaptureError(
                        ErrorCode.BACKEND_ERROR,
                        STAGES.get(capture.job.state, "acquisition"),
                        "internal error; see the log",
                    ),
                )
            finally:
                slots.release()

    def _advance(self, capture: PendingCapture, to: JobState) -> bool:
        with capture.lock:
            if capture.done:
                return False
            self._catalog.advance(capture.job.capture_id, to, NON_TERMINAL)
            capture.job.state = to
            return True

    def _process(self, session: CameraSession, capture: PendingCapture) -> None:
        job = capture.job
        assert session.backend is not None
        if not self._advance(capture, JobState.ACQUIRING):
            return
        capture.marks["acquisitionStarted"] = now_ms()
        self._announcer.lifecycle("info", "capture-started", job, captureMode=job.capture_mode)
        acquired = self._acquire(session, capture)
        if acquired is None or not self._advance(capture, JobState.ENCODING):
            return
        data = self._encode(capture, acquired)
        if data is None or not self._advance(capture, JobState.PERSISTING):
            return
        self._persist(session, capture, acquired, data)

    def reconfigure(self, settings: CameraSettings) -> None:
        """New captures follow `settings` (profiles, limits, storage); captures in flight
        finish as they began."""
        if settings.limits.max_concurrent_captures != self._settings.limits.max_concurrent_captures:
            self._slots = threading.BoundedSemaphore(settings.limits.max_concurrent_captures)
        self._settings = settings

    def _profile(self, capture: PendingCapture) -> ProfileSpec:
        if capture.profile is not None:
            return capture.profile
        return self._settings.profiles[capture.job.profile]

    def _acquire(self, session: CameraSession, capture: PendingCapture) -> Acquired | None:
        """The capture's frame, judged; under `freshness: require` a frame too old for the
        request is refused and the camera asked again until the deadline. None when the
        capture failed (or was settled by someone else)."""
        assert session.backend is not None
        while True:
            try:
                acquired = session.backend.grab(capture.deadline, capture.abandon)
            except CaptureError as error:
                session.record_error(error.message)
                # Out of time while waiting for a fresher frame: the old frame is the reason.
                if error.code == ErrorCode.CAPTURE_TIMEOUT and capture.rejected is not None:
                    error = capture.rejected
                self._outcomes.fail(capture, error)
                return None
            session.record_success()
            capture.marks["acquired"] = now_ms()
            age = max(0, round((capture.requested - acquired.arrived_at) * 1000))
            judgement, refusal = self._judge(session, capture, acquired, age)
            with capture.lock:  # the deadline watchdog settles with all four
                capture.frame, capture.frame_age_ms = acquired, age
                capture.freshness = judgement.body
                capture.rejected = refusal if judgement.too_old else None
            if refusal is None:
                return acquired
            if refusal is not capture.rejected:
                self._outcomes.fail(capture, refusal, acquired)
                return None
            pause = min(STALE_RETRY_S, max(capture.deadline - time.monotonic(), 0.0))
            if capture.abandon.wait(pause) or time.monotonic() >= capture.deadline:
                self._outcomes.fail(capture, refusal, acquired)
                return None

    def _judge(
        self, session: CameraSession, capture: PendingCapture, acquired: Acquired, age: int
    ) -> tuple[Judgement, CaptureError | None]:
        """Judges a frame `age` ms older than its request: the judgement, and None to take
        the frame or the STALE_FRAME refusal (a newer frame may be tried if only too old)."""
        profile = self._profile(capture)
        limit = session.spec.max_frame_age_ms
        judgement = session.freshness.judge(
            capture.job.capture_id, acquired, profile.freshness, age_ms=age, max_age_ms=limit
        )
        if not judgement.stale:
            return judgement, None
        if capture.rejected is None:  # counted once per capture, however often it asks again
            self._metrics.counter("captures", "staleFrames", {"camera": session.instance}).inc()
        method = judgement.body["method"]
        if judgement.too_old:
            message = (
                f"no frame young enough: the newest arrived {age} ms before the request "
                f"(maxFrameAgeMs {limit})"
            )
        else:
            previous = judgement.body["evidence"].get("previousCaptureId")
            message = f"the frame is provably {previous}'s again (by {method})"
        if profile.freshness != "require":
            _log.warning("capture %s: %s; profile %s only warns", capture.job.capture_id,
                         message, profile.name)  # fmt: skip
            return judgement, None
        return judgement, CaptureError(ErrorCode.STALE_FRAME, "acquisition", message)

    def _encode(self, capture: PendingCapture, acquired: Acquired) -> bytes | None:
        """The image to store (and the thumbnail), or None when the capture failed."""
        profile = self._profile(capture)
        try:
            if acquired.encoded is not None and profile.store_as_received:
                data = acquired.encoded
            else:
                data = encode_jpeg(acquired.frame, profile.quality)
            if profile.thumbnail_size is not None:
                # The edge-runtime IPC bus carries only the small size.
                size = "small" if self._ipc else profile.thumbnail_size
                capture.thumbnail = thumbnail(acquired.frame, size)
        except ValueError as error:
            self._outcomes.fail(
                capture,
                CaptureError(ErrorCode.UNSUPPORTED_PIXEL_FORMAT, "encoding", str(error)),
                acquired,
            )
            return None
        capture.marks["encoded"] = now_ms()
        return data

    def _persist(
        self, session: CameraSession, capture: PendingCapture, acquired: Acquired, data: bytes
    ) -> None:
        job = capture.job
        meta = None
        if self._settings.storage.sidecar:
            meta = sidecar(
                job,
                capture.marks,
                acquired,
                data,
                session.camera_block(),
                capture.freshness,
                capture.frame_age_ms,
            )
        try:
            staged = self._storage.stage(
                job.camera, job.capture_id, data, "jpg", meta, job.accepted_ms
            )
        except CaptureError as error:
            self._outcomes.fail(capture, error, acquired)
            return
        failure: CaptureError | None = None
        with capture.lock:
            if capture.done:
                self._storage.discard(staged)
                return
            try:
                self._storage.install(staged)
            except CaptureError as error:
                failure = error
            else:
                capture.marks["persisted"] = now_ms()
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
                self._outcomes.settle_locked(capture, JobState.SUCCEEDED, acquired, image=image)
        if failure is not None:
            self._outcomes.fail(capture, failure, acquired)
            return
        self._outcomes.after_settle(capture)
