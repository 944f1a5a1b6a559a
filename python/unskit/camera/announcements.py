"""What the camera adapter tells the namespace beyond replies: the terminal application message
of each capture, the optional lifecycle events and the storage-low alarm. All best effort:
none of them ever delays or fails a capture."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from unskit.camera.codec import Thumbnail
from unskit.camera.jobs import Job, JobState
from unskit.envelope import MAX_OPAQUE_BYTES, EnvelopeStamp, Message, MessageBuilder
from unskit.errors import UnskitError
from unskit.messaging import MessagingClient
from unskit.runtime.events import Events
from unskit.runtime.metrics import MetricsRegistry
from unskit.topics import TopicScope

__all__ = ["ANNOUNCEMENTS", "Announcer"]

_log = logging.getLogger(__name__)

#: Outcome -> (envelope header name, channel) of the terminal announcement.
ANNOUNCEMENTS = {
    JobState.SUCCEEDED: ("ImageCaptured", "captured"),
    JobState.FAILED: ("ImageCaptureFailed", "failed"),
    JobState.INTERRUPTED: ("ImageCaptureFailed", "failed"),
    JobState.CANCELLED: ("ImageCaptureCancelled", "cancelled"),
}


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
    ) -> None:
        self._messaging = messaging
        self._topics = topics
        self._stamp = stamp
        self._metrics = metrics
        self._events = events if lifecycle else None
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

    def _message(self, name: str, job: Job, body: Mapping[str, Any]) -> Message:
        return (
            MessageBuilder(name, "1.0", self._stamp)
            .instance(job.camera)
            .correlation_id(job.correlation_id)
            .body(dict(body))
            .build()
        )

    def lifecycle(self, severity: str, kind: str, job: Job, **extra: Any) -> None:
        """A capture-queued or capture-started event, when lifecycle events are enabled."""
        if self._events is None:
            return
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
