"""What the camera adapter tells the namespace beyond replies: the terminal application message
of each capture, the optional lifecycle events and the storage-low alarm. All best effort:
none of them ever delays or fails a capture.

Lifecycle events go through a bounded queue that one thread publishes from: a capture only
appends (never waits for the broker), and when the queue is full the new event is dropped
and counted (`captures.lifecycleEventsDropped`)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from unskit.camera.codec import Thumbnail
from unskit.camera.jobs import Job, JobState
from unskit.camera.storage import Storage
from unskit.envelope import MAX_OPAQUE_BYTES, EnvelopeStamp, Message, MessageBuilder
from unskit.errors import UnskitError
from unskit.messaging import MessagingClient
from unskit.runtime.events import Events
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.periodic import PeriodicWatch
from unskit.runtime.publish_watch import PublishWatch
from unskit.runtime.supervision import Supervisor
from unskit.topics import TopicScope

__all__ = ["ANNOUNCEMENTS", "TERMINAL_SOURCE", "Announcer", "LifecycleQueue", "StorageWatch"]

#: The message-publish-degraded source the terminal messages report as.
TERMINAL_SOURCE = "terminal-messages"

_log = logging.getLogger(__name__)

#: Outcome -> (envelope header name, channel) of the terminal announcement.
ANNOUNCEMENTS = {
    JobState.SUCCEEDED: ("ImageCaptured", "captured"),
    JobState.FAILED: ("ImageCaptureFailed", "failed"),
    JobState.INTERRUPTED: ("ImageCaptureFailed", "failed"),
    JobState.CANCELLED: ("ImageCaptureCancelled", "cancelled"),
}


class LifecycleQueue:
    """Lifecycle events waiting for their publisher thread, at most `bound` of them."""

    def __init__(
        self,
        events: Events,
        bound: int,
        metrics: MetricsRegistry,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._events = events
        self._bound = bound
        self._queue: deque[tuple[str, str, dict[str, Any], str]] = deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._dropped = metrics.counter("captures", "lifecycleEventsDropped")
        # Supervised: a failure is logged, counted and the publisher restarted, so events
        # never pile up behind a dead thread. Set once closed: no restart after that.
        self._closed = threading.Event()
        supervisor = supervisor or Supervisor(metrics)
        self._thread = supervisor.thread("camera-lifecycle", self._run, self._closed)
        self._thread.start()

    def offer(self, severity: str, kind: str, context: dict[str, Any], instance: str) -> bool:
        """Queues an event without waiting; False (and counted) when the queue is full."""
        with self._ready:
            if self._stopping or len(self._queue) >= self._bound:
                self._dropped.inc()
                return False
            self._queue.append((severity, kind, context, instance))
            self._ready.notify()
            return True

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._ready.wait()
                if not self._queue:
                    return
                severity, kind, context, instance = self._queue.popleft()
            try:
                self._events.emit(severity, kind, context, instance=instance)
            except UnskitError as error:
                self._dropped.inc()
                _log.debug("lifecycle event %s dropped: %s", kind, error)

    def close(self, timeout_s: float) -> None:
        """Publishes what is queued (for at most `timeout_s`), then stops."""
        with self._ready:
            self._stopping = True
            self._ready.notify_all()
        self._thread.join(timeout_s)
        self._closed.set()


class Announcer:
    """Publishes terminal messages, lifecycle events (when enabled) and the storage alarm."""

    def __init__(
        self,
        *,
        messaging: MessagingClient,
        topics: TopicScope,
        stamp: EnvelopeStamp,
        metrics: MetricsRegistry,
        events: Events | None,
        lifecycle: bool,
        max_queued_events: int = 256,
        publish_watch: PublishWatch | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._publish_watch = publish_watch
        self._supervisor = supervisor
        self._messaging = messaging
        self._topics = topics
        self._stamp = stamp
        self._metrics = metrics
        self._lifecycle = (
            LifecycleQueue(events, max_queued_events, metrics, supervisor)
            if lifecycle and events is not None
            else None
        )
        self._lifecycle_settings = (lifecycle, max_queued_events)
        self._alarms = events

    def terminal(self, job: Job, thumb: Thumbnail | None) -> None:
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
        # A QoS 0 publish while the link is down is dropped without an error: the link's
        # loss count is what tells (a loss of another publisher at the same instant counts
        # too; the link is down for both).
        lost_before = self._messaging.publish_status().failures
        try:
            try:
                self._messaging.publish(topic, self._message(name, job, body))
            except UnskitError:
                if "thumbnail" not in body:
                    raise
                self._metrics.counter("captures", "thumbnailsDropped").inc()
                self._messaging.publish(topic, self._message(name, job, dict(job.result)))
        except UnskitError as error:
            self._lost(job, str(error))
            return
        if self._messaging.publish_status().failures > lost_before:
            self._lost(job, "the link is down and the message was dropped (QoS 0)")
        elif self._publish_watch is not None:
            self._publish_watch.report(TERMINAL_SOURCE, None)

    def _lost(self, job: Job, reason: str) -> None:
        self._metrics.counter("captures", "announcementsLost").inc()
        _log.warning("capture %s: announcement not published: %s", job.capture_id, reason)
        if self._publish_watch is not None:
            self._publish_watch.report(
                TERMINAL_SOURCE, {"captureId": job.capture_id, "reason": reason}
            )

    def _message(self, name: str, job: Job, body: Mapping[str, Any]) -> Message:
        return (
            MessageBuilder(name, "1.0", self._stamp)
            .instance(job.camera)
            .correlation_id(job.correlation_id)
            .body(dict(body))
            .build()
        )

    def lifecycle(self, severity: str, kind: str, job: Job, **extra: Any) -> None:
        """Queues a capture-queued or capture-started event, when lifecycle events are enabled
        (dropped and counted when the queue is full: diagnostics never delay a capture)."""
        if self._lifecycle is None:
            return
        context = {
            "captureId": job.capture_id,
            "trigger": job.trigger.get("type"),
            "captureProfile": job.profile,
            **extra,
        }
        self._lifecycle.offer(severity, kind, context, job.camera)

    def reconfigure(self, lifecycle: bool, max_queued_events: int) -> None:
        """Turns lifecycle events on or off, or rebounds their queue (a reload)."""
        if (lifecycle, max_queued_events) == self._lifecycle_settings:
            return
        self.close()
        self._lifecycle_settings = (lifecycle, max_queued_events)
        self._lifecycle = (
            LifecycleQueue(self._alarms, max_queued_events, self._metrics, self._supervisor)
            if lifecycle and self._alarms is not None
            else None
        )

    def close(self, timeout_s: float = 1.0) -> None:
        """Stops the lifecycle publisher after what it holds (bounded by `timeout_s`)."""
        if self._lifecycle is not None:
            self._lifecycle.close(timeout_s)

    def schedule_skipped(self, instance: str, context: dict[str, Any]) -> None:
        """The schedule-skipped warning event (always on, unlike the lifecycle events)."""
        if self._alarms is None:
            return
        try:
            self._alarms.emit("warning", "schedule-skipped", context, instance=instance)
        except UnskitError as error:
            _log.warning("schedule-skipped event not published: %s", error)

    def storage_pressure(self, reason: str | None) -> None:
        """Raises storage-low with `reason`, or clears it when None."""
        if self._alarms is None:
            return
        try:
            if reason is not None:
                self._alarms.raise_alarm("storage-low", {"reason": reason})
            else:
                self._alarms.clear_alarm("storage-low")
        except UnskitError as error:
            _log.warning("storage-low alarm not published: %s", error)


class StorageWatch(PeriodicWatch):
    """Raises storage-low when a root falls below its floor (or cannot be read) and clears it
    when both have room again, every `storage.checkIntervalMs`, captures or not."""

    thread_name = "camera-storage-watch"

    def __init__(self, storage: Storage, announcer: Announcer, interval_s: float) -> None:
        super().__init__(interval_s)
        self._storage = storage
        self._announcer = announcer

    def check(self) -> None:
        """One look at both roots."""
        self._announcer.storage_pressure(self._storage.pressure())
        self.checks += 1
