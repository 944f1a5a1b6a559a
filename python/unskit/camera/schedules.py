"""Schedules: each enabled camera's periodic captures, fired at start + n periods and admitted
like any other capture (trigger type schedule). Fires missed while one was busy are skipped;
fires while the camera is paused are held; fires while it moves (PTZ) are skipped with a
schedule-skipped warning event."""

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid

from unskit.camera.admission import Admission
from unskit.camera.announcements import Announcer
from unskit.camera.jobs import now_ms, rfc3339
from unskit.camera.sessions import CameraSession, CameraSessions
from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError
from unskit.runtime.metrics import MetricsRegistry

__all__ = ["Schedules"]

_log = logging.getLogger(__name__)


class Schedules:
    """Fires the configured schedules until the stop."""

    def __init__(
        self,
        sessions: CameraSessions,
        admission: Admission,
        metrics: MetricsRegistry,
        stopping: threading.Event,
        announcer: Announcer,
    ) -> None:
        self._announcer = announcer
        self._sessions = sessions
        self._admission = admission
        self._metrics = metrics
        self._stopping = stopping

    @property
    def configured(self) -> bool:
        """Whether any camera has a schedule."""
        return any(session.spec.schedules for session in self._sessions)

    def run(self) -> None:
        """The scheduler thread: fires each schedule when due, until the stop."""
        start = time.monotonic()
        start_ms = now_ms()
        heap: list[tuple[float, int, str, int]] = []
        for session in self._sessions:
            if not session.spec.enabled:
                continue
            for index, schedule in enumerate(session.spec.schedules):
                if schedule.enabled:
                    first = schedule.interval_ms / 1000
                    heapq.heappush(heap, (start + first, index, session.instance, 1))
        while heap and not self._stopping.is_set():
            due, index, instance, count = heap[0]
            if self._stopping.wait(max(due - time.monotonic(), 0.0)):
                return
            heapq.heappop(heap)
            session = self._sessions.get(instance)
            schedule = session.spec.schedules[index]
            intended_ms = start_ms + count * schedule.interval_ms
            self._fire(session, schedule.id, schedule.capture_profile, intended_ms)
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
        self, session: CameraSession, schedule_id: str, profile_name: str | None, at: int
    ) -> None:
        instance = session.instance
        if session.paused:
            self._metrics.counter("schedules", "held", {"camera": instance}).inc()
            return
        try:
            request = self._admission.request(
                session,
                profile_name,
                None,
                {"type": "schedule", "scheduleId": schedule_id, "intendedFireTime": rfc3339(at)},
                metadata={},
                correlation_id=str(uuid.uuid4()),
            )
            self._admission.submit([request])
        except CommandError as error:
            if error.code == ErrorCode.CAMERA_MOVING.value:
                self._metrics.counter("schedules", "skipped", {"camera": instance}).inc()
                self._announcer.schedule_skipped(
                    instance,
                    {
                        "scheduleId": schedule_id,
                        "intendedFireTime": rfc3339(at),
                        "reason": "camera-moving",
                    },
                )
                return
            self._metrics.counter("schedules", "refused", {"camera": instance}).inc()
            _log.warning("schedule %s of %s not admitted: %s", schedule_id, instance, error)
