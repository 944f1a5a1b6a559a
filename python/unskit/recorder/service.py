"""The recording service: signal updates in, decoded through the envelope codec, rows out
through the `RecordWriter`; counters, alarms, pause, flush and live reconfiguration."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unskit.envelope import Message
from unskit.messaging import MessagingClient
from unskit.recorder.config import RecorderSettings
from unskit.recorder.subscription import SignalSubscription
from unskit.recorder.writer import (
    Batch,
    FileFailure,
    RecordWriter,
    Source,
    process_identity,
    recover_leftovers,
)
from unskit.runtime.periodic import PeriodicWatch
from unskit.topics import topic_matches_filter

__all__ = [
    "ALARM_INPUT",
    "ALARM_OVERFLOW",
    "ALARM_WRITE",
    "Recorder",
    "RejectReason",
]

_log = logging.getLogger(__name__)

ALARM_OVERFLOW = "recorder-queue-overflow"
ALARM_INPUT = "recorder-input-rejected"
ALARM_WRITE = "recorder-write-failed"
#: Rejections are logged on the first and then every this many.
LOG_EVERY = 1_000
#: Topics whose include/exclude verdict is remembered before the memo starts over.
MATCH_CACHE_SIZE = 10_000
TICK_S = 1.0
#: At stop, how long the queued messages may take to reach the files.
DRAIN_S = 5.0


class RejectReason:
    NOT_SIGNAL_UPDATE = "notSignalUpdate"
    OUTSIDE_FILTERS = "outsideFilters"
    EXCLUDED = "excluded"
    MALFORMED = "malformed"


Alarm = Callable[[str, bool, Mapping[str, Any]], None]
Count = Callable[[str, int, Mapping[str, str] | None], None]


@dataclass
class _Counts:
    messages: int = 0
    samples: int = 0
    overflow: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class _Tick(PeriodicWatch):
    thread_name = "unskit-recorder-tick"

    def __init__(self, recorder: Recorder) -> None:
        super().__init__(TICK_S)
        self._recorder = recorder

    def check(self) -> None:
        self._recorder.tick()


class Recorder:
    """One recorder process's subscriptions and open files."""

    def __init__(
        self,
        settings: RecorderSettings,
        messaging: MessagingClient,
        *,
        alarm: Alarm | None = None,
        count: Count | None = None,
        identity: str | None = None,
        device_level: int = 1,
    ) -> None:
        """`device_level` is the topic level naming the publishing device (1 under a
        one-level root), where a consumer group's partition cuts."""
        self.settings = settings
        self.identity = identity or process_identity()
        self._alarm = alarm
        self._count = count
        self._lock = threading.Lock()
        self._handled = threading.Condition(self._lock)
        self.counts = _Counts()
        self.writer = self._writer(settings)
        self._subscription = SignalSubscription(
            messaging, self._on_message, self._on_overflow, device_level=device_level
        )
        self._matches: dict[str, str | None] = {}
        self._sources: dict[tuple[str, str, str | None], Source] = {}
        self.paused = False
        self._stopped = False
        self._tick: _Tick | None = None
        self._seen_overflow = 0
        self._seen_rejected = 0
        self._write_failed = False

    def _writer(self, settings: RecorderSettings) -> RecordWriter:
        return RecordWriter(
            settings.output,
            partition_by=settings.partition_by,
            roll=settings.roll,
            row_group_rows=settings.row_group_rows,
            codec=settings.codec,
            level=settings.level,
            variant=settings.variant,
            fsync=settings.fsync,
            max_open_files=settings.max_open_files,
            identity=self.identity,
            on_failure=self._failed,
            on_closed=self._closed,
        )

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Recorder:
        """Sets aside what a crashed run left, subscribes, starts the roll clock."""
        self.settings.output.mkdir(parents=True, exist_ok=True)
        for path in recover_leftovers(self.settings.output, self.identity):
            _log.warning("recorder: unreadable leftover of a crashed run set aside as %s", path)
        self._subscribe()
        self._tick = _Tick(self).start()
        return self

    def _subscribe(self) -> None:
        s = self.settings
        self._subscription.open(s.include, s.group, s.queue_messages)

    def stop(self) -> None:
        """Unsubscribes, lets the queued messages reach the files (bounded), then closes
        every open file (or drops them when flushOnStop is false)."""
        if self._tick is not None:
            self._tick.stop()
        self._subscription.close()
        self._quiesce()
        with self._lock:
            self._stopped = True
            if self.settings.flush_on_stop:
                self.writer.close_all()
            else:
                rows = self.writer.abandon_all()
                if rows:
                    _log.warning("recorder: flushOnStop is false; %d buffered rows dropped", rows)

    def _quiesce(self) -> None:
        deadline = time.monotonic() + DRAIN_S
        with self._handled:
            # Each handled message notifies; a quiet 0.2 s means the queues are empty.
            while time.monotonic() < deadline and self._handled.wait(0.2):
                pass

    # -- the hot path (subscription worker) ----------------------------------------------

    def _on_message(self, topic: str, message: Message) -> None:
        verdict = self._matches.get(topic, "")
        if verdict == "":
            verdict = self._verdict(topic)
        if verdict is not None:
            self._reject(verdict, topic)
            return
        # The codec hands the samples over as column buffers: no object per sample.
        columns = message.signal_columns()
        if columns is None:
            self._reject(RejectReason.NOT_SIGNAL_UPDATE, topic)
            return
        try:
            source = self._source(topic, message, columns[0], columns[1])
        except ValueError:
            self._reject(RejectReason.MALFORMED, topic)
            return
        batch = Batch.from_columns(columns)
        receive_ms = time.time_ns() // 1_000_000
        with self._lock:
            if self._stopped:
                self.writer.stats.samples_lost += len(batch)
                return
            kept = self.writer.add_batch(source, batch, receive_ms)
            self.counts.messages += 1
            self.counts.samples += kept
            self._handled.notify_all()

    def _verdict(self, topic: str) -> str | None:
        s = self.settings
        verdict: str | None = None
        if not any(topic_matches_filter(f, topic) for f in s.include):
            verdict = RejectReason.OUTSIDE_FILTERS
        elif any(topic_matches_filter(f, topic) for f in s.exclude):
            verdict = RejectReason.EXCLUDED
        if len(self._matches) >= MATCH_CACHE_SIZE:
            self._matches.clear()
        self._matches[topic] = verdict
        return verdict

    def _source(self, topic: str, message: Message, signal_id: str, name: str | None) -> Source:
        tags = message.tags
        key = (topic, signal_id, name)
        known = self._sources.get(key)
        tag_items = tuple(sorted(tags.items())) if tags else ()
        if known is not None and known.tags == tag_items:
            return known
        identity = message.identity
        levels = topic.split("/")
        if identity is not None:
            device, component, instance = identity.device, identity.component, identity.instance
            head = f"/{device}/{component}/"
            root = topic.split(head, 1)[0] if head in topic else "/".join(levels[:-5])
        else:
            # {root}/{device}/{component}/{instance}/data/{signalPath} (spec 3).
            if len(levels) < 6:
                raise ValueError(f"topic {topic!r} does not name device, component and instance")
            root, device, component, instance = (
                "/".join(levels[:-5]),
                levels[-5],
                levels[-4],
                levels[-3],
            )
        if not signal_id:
            raise ValueError("a signal update without a signal id")
        source = Source(root or "_", device, component, instance, signal_id, name, tag_items)
        if len(self._sources) >= MATCH_CACHE_SIZE:
            self._sources.clear()
        self._sources[key] = source
        return source

    def _reject(self, reason: str, topic: str) -> None:
        with self._lock:
            rejected = self.counts.rejected
            rejected[reason] = rejected.get(reason, 0) + 1
            total = self.counts.rejected_total
            self._handled.notify_all()
        if self._count is not None:
            self._count("messagesRejected", 1, {"reason": reason})
        if total == 1 or total % LOG_EVERY == 0:
            _log.warning(
                "recorder: message on %r not recorded (%s); %d rejected so far",
                topic,
                reason,
                total,
            )

    def _on_overflow(self, _topic: str, _message: Message) -> None:
        # On the network thread: count only; the tick raises the alarm.
        self.counts.overflow += 1

    # -- writer callbacks (under the lock) -----------------------------------------------

    def _failed(self, failure: FileFailure) -> None:
        self._write_failed = True
        if self._alarm is not None:
            self._alarm(
                ALARM_WRITE, True, {"file": str(failure.path), "rowsLost": failure.rows_lost,
                                    "error": failure.error},
            )  # fmt: skip

    def _closed(self, path: Path) -> None:
        if self._write_failed:
            self._write_failed = False
            if self._alarm is not None:
                self._alarm(ALARM_WRITE, False, {"file": str(path)})

    # -- periodic: roll by age, alarms on counters ----------------------------------------

    def tick(self) -> None:
        """Closes files past roll.maxSeconds; raises or clears the overflow and input alarms
        (raised while their counter grows, cleared after a quiet second)."""
        with self._lock:
            if not self._stopped:
                self.writer.close_expired()
            overflow, rejected = self.counts.overflow, self.counts.rejected_total
            reasons = dict(self.counts.rejected)
        if self._alarm is None:
            return
        self._alarm(
            ALARM_OVERFLOW,
            overflow > self._seen_overflow,
            {"dropped": overflow, "maxMessages": self.settings.queue_messages},
        )
        self._alarm(ALARM_INPUT, rejected > self._seen_rejected, {"rejected": reasons})
        if self._count is not None and overflow > self._seen_overflow:
            self._count("queueOverflow", overflow - self._seen_overflow, None)
        self._seen_overflow, self._seen_rejected = overflow, rejected

    def queued(self) -> int:
        """Messages waiting in the subscriptions' queues."""
        return self._subscription.queued()

    # -- verbs ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """sb/status's body."""
        with self._lock:
            stats = self.writer.stats
            return {
                "paused": self.paused,
                "subscriptions": list(self._subscription.filters),
                "consumerGroup": self._subscription.group_status(),
                "openFiles": self.writer.open_files,
                "rowsBuffered": self.writer.rows_buffered,
                "filesClosed": stats.files_closed,
                "bytesWritten": stats.bytes_written,
                "samplesRecorded": stats.samples_written,
                "samplesAccepted": self.counts.samples,
                "samplesLost": stats.samples_lost,
                "jsonValues": stats.json_values,
                "writeErrors": stats.write_errors,
                "rejected": dict(self.counts.rejected),
                "queue": {
                    "depth": self._subscription.queued(),
                    "maxMessages": self.settings.queue_messages,
                    "overflow": self.counts.overflow,
                },
                "lastError": stats.last_error,
                "output": str(self.settings.output),
                "fileIdentity": self.identity,
            }

    def flush(self) -> dict[str, Any]:
        """Closes every open file now; returns how many closed and the errors seen."""
        with self._lock:
            errors = self.writer.stats.write_errors
            closed = self.writer.close_all()
            return {"closed": closed, "failed": self.writer.stats.write_errors - errors}

    def pause(self) -> bool:
        """Unsubscribes (a share group's other members take the load) and closes the open
        files; False when already paused."""
        if self.paused:
            return False
        self._subscription.close()
        self._quiesce()
        with self._lock:
            self.paused = True
            self.writer.close_all()
        return True

    def resume(self) -> bool:
        """Subscribes again; False when not paused."""
        if not self.paused:
            return False
        self._subscribe()
        self.paused = False
        return True

    def reconfigure(self, settings: RecorderSettings) -> tuple[list[str], list[str], list[str]]:
        """Applies new settings: a writer change closes the open files first; a filter
        change resubscribes. Returns the broker filters (added, removed, kept)."""
        before = set(self._subscription.filters)
        with self._lock:
            if settings.writer_settings() != self.settings.writer_settings():
                self.writer.close_all()
                previous = self.writer
                self.writer = self._writer(settings)
                self.writer.stats, self.writer.sequence = previous.stats, previous.sequence
            self.settings = settings
            self._matches.clear()
            self.writer.max_open_files = settings.max_open_files
        wanted = (settings.include, settings.group, settings.queue_messages)
        if not self.paused and wanted != self._subscription.opened_with:
            self._subscribe()
        after = set(self._subscription.filters) if not self.paused else before
        return sorted(after - before), sorted(before - after), sorted(after & before)
