"""Outcomes: a capture's terminal transition (success, failure, cancel, timeout, stop or
interruption), committed to the catalog before anything observes it, then announced once and
answered to every held reply.

The transition happens once, under the capture's lock, whoever gets there first: its worker,
the deadline watchdog, a cancel or the drain.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from unskit.camera.announcements import Announcer
from unskit.camera.backends import Acquired
from unskit.camera.bodies import terminal_body
from unskit.camera.catalog import Catalog
from unskit.camera.jobs import BACKLOG, NON_TERMINAL, STAGES, Job, JobState, now_ms
from unskit.camera.pending import PendingCapture, PendingCaptures
from unskit.camera.queries import CatalogQueries
from unskit.camera.sessions import CameraSessions
from unskit.camera.storage import Storage
from unskit.commands.codes import ErrorCode
from unskit.errors import CaptureError, CommandError
from unskit.runtime.metrics import MetricsRegistry

__all__ = ["Outcomes"]

_log = logging.getLogger(__name__)


class Outcomes:
    """Settles captures: commits the terminal state, frees admission, announces, replies."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        storage: Storage,
        pending: PendingCaptures,
        sessions: CameraSessions,
        queries: CatalogQueries,
        announcer: Announcer,
        metrics: MetricsRegistry,
    ) -> None:
        self._catalog = catalog
        self._storage = storage
        self._pending = pending
        self._sessions = sessions
        self._queries = queries
        self._announcer = announcer
        self._metrics = metrics

    def recover(self) -> list[Job]:
        """Commits every job a previous run left non-terminal as INTERRUPTED, then announces it."""
        interrupted = []
        for job in self._catalog.in_states(NON_TERMINAL):
            # An image renamed into place just before the crash has no committed SUCCEEDED:
            # it is not this capture's outcome, so it goes.
            if self._storage.remove_outputs(job.camera, job.capture_id, job.accepted_ms):
                _log.info("removed the uncommitted image of interrupted %s", job.capture_id)
            error = CaptureError(
                ErrorCode.PROCESS_INTERRUPTED,
                STAGES[job.state],
                f"the component stopped while the capture was {job.state.value}",
            )
            job.terminal_ms = now_ms()
            job.result = terminal_body(
                job,
                None,
                JobState.INTERRUPTED,
                self._sessions.camera_block(job.camera),
                failure=error.to_failure(),
            )
            job.state = JobState.INTERRUPTED
            job.error_code, job.error_message = error.code, error.message
            if self._catalog.finish(job):
                interrupted.append(job)
        for job in interrupted:
            self._announcer.terminal(job, None)
        if interrupted:
            _log.warning("%d captures were interrupted by the last stop", len(interrupted))
        return interrupted

    # -- transitions --------------------------------------------------------------------------

    def settle_locked(
        self,
        capture: PendingCapture,
        state: JobState,
        acquired: Acquired | None,
        *,
        image: Mapping[str, Any] | None = None,
        failure: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """Commits the terminal state (the caller holds capture.lock)."""
        job = capture.job
        previous = job.state
        job.terminal_ms = now_ms()
        body = terminal_body(
            job,
            acquired,
            state,
            self._sessions.camera_block(job.camera),
            image=image,
            failure=failure,
            marks=capture.marks,
            freshness=capture.freshness,
            frame_age_ms=capture.frame_age_ms,
        )
        if state is JobState.CANCELLED:
            job.error_code = ErrorCode.CAPTURE_CANCELLED.value
            job.error_message = reason
        elif failure is not None:
            job.error_code = str(failure["code"])
            job.error_message = str(failure["message"])
        job.result = body
        job.state = state
        if not self._catalog.finish(job):
            _log.error("capture %s was already terminal in the catalog", job.capture_id)
        capture.done = True
        _log.debug("capture %s: %s -> %s", job.capture_id, previous.value, state.value)

    def after_settle(self, capture: PendingCapture) -> None:
        """After the commit: frees admission, announces once, settles the held replies."""
        job = capture.job
        queue = self._pending.queues.get(job.camera)
        if queue is not None:  # None: the camera was removed by a reload
            queue.remove(capture)
        complete = self._pending.release(capture)
        self._metrics.counter("captures", "terminal", {"state": job.state.value}).inc()
        self._announcer.terminal(job, capture.thumbnail)
        assert job.result is not None
        for future in capture.waiters:
            future.set_result(job.result)
        if complete is not None and complete.waiters:
            reply = self._queries.group_reply(complete.record.group_id)
            for future in complete.waiters:
                future.set_result(reply)

    def fail(
        self, capture: PendingCapture, error: CaptureError, acquired: Acquired | None = None
    ) -> bool:
        """Settles a capture FAILED with `error`; False if it was already terminal. The body
        carries the frame the capture acquired, if any (and its age), unless `acquired` says."""
        with capture.lock:
            if capture.done:
                return False
            frame = acquired if acquired is not None else capture.frame
            self.settle_locked(capture, JobState.FAILED, frame, failure=error.to_failure())
        self.after_settle(capture)
        return True

    def cancel(self, capture_id: str, reason: str) -> tuple[bool, JobState]:
        """Cancels a non-terminal capture: (cancelled, state after)."""
        capture = self._pending.get(capture_id)
        if capture is not None:
            with capture.lock:
                if not capture.done:
                    capture.abandon.set()
                    # A frame it had acquired is reported (with its age), like a failure's.
                    self.settle_locked(capture, JobState.CANCELLED, capture.frame, reason=reason)
                    cancelled = True
                else:
                    cancelled = False
            if cancelled:
                self.after_settle(capture)
                return True, JobState.CANCELLED
        job = self._catalog.get(capture_id)
        if job is None:
            raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no capture {capture_id!r}")
        return False, job.state

    def cancel_group(self, group_id: str, reason: str) -> list[tuple[Job, bool, JobState]]:
        """Cancels every member not yet terminal: (member, cancelled, state after) each."""
        if self._catalog.group(group_id) is None:
            raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no capture group {group_id!r}")
        return [
            (job, *self.cancel(job.capture_id, reason)) for job in self._catalog.members(group_id)
        ]

    # -- deadlines and stopping ---------------------------------------------------------------

    def watch_deadlines(self, stopping: threading.Event) -> None:
        """Fails each capture past its deadline with CAPTURE_TIMEOUT (STALE_FRAME when
        `freshness: require` was still waiting for a frame young enough), until the stop."""
        while not stopping.is_set():
            for capture in self._pending.wait_expired():
                capture.abandon.set()
                with capture.lock:
                    if capture.done:
                        continue
                    # Under the lock the pipeline updates the frame and the refusal with.
                    error = capture.rejected or CaptureError(
                        ErrorCode.CAPTURE_TIMEOUT,
                        STAGES.get(capture.job.state, "queue"),
                        f"no terminal state within {capture.job.timeout_ms} ms",
                    )
                    failure = error.to_failure()
                    self.settle_locked(capture, JobState.FAILED, capture.frame, failure=failure)
                self.after_settle(capture)

    def stop_backlog(self) -> None:
        """Fails every capture not yet started with COMPONENT_STOPPING."""
        for capture in self._pending.in_states(BACKLOG):
            error = CaptureError(
                ErrorCode.COMPONENT_STOPPING, "queue", "the component stopped before the capture"
            )
            self.fail(capture, error)

    @staticmethod
    def abandon(captures: Iterable[PendingCapture]) -> None:
        """Leaves captures non-terminal in the catalog (INTERRUPTED at the next start); their
        workers see them done and stop touching the catalog."""
        for capture in captures:
            with capture.lock:
                capture.done = True
            capture.abandon.set()
