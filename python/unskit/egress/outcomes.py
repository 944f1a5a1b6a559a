"""What each delivery attempt came to, recorded in the progress store and announced in
metrics and events: progress as it goes, a failure and when it is tried again (the retry
schedule), or a verified copy (which may complete the file)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from unskit.egress.backends import Outcome
from unskit.egress.config import DestinationSpec
from unskit.egress.context import InstanceContext, ProgressSink
from unskit.egress.lifecycle import SourceLifecycle
from unskit.egress.records import FileRecord, Part

__all__ = ["DeliveryJournal", "DeliveryOutcomes"]

_log = logging.getLogger(__name__)


@dataclass
class DeliveryJournal:
    """Records one delivery's progress in the state store and reports it."""

    outcomes: DeliveryOutcomes
    file: FileRecord
    dest: str
    sent_total: int = 0
    last_event: float = field(default_factory=time.monotonic)

    def offset(self, offset: int) -> None:
        """Bytes 0..offset are at the destination."""
        self.outcomes.context.state.save_offset(self.file.id, self.dest, offset, self.sent_total)

    def upload(self, upload_id: str | None) -> None:
        """The multipart upload this delivery resumes into."""
        self.outcomes.context.state.save_upload(self.file.id, self.dest, upload_id)

    def part(self, part: Part) -> None:
        """One part is uploaded."""
        self.outcomes.context.state.save_part(self.file.id, self.dest, part, self.sent_total)

    def forget_part(self, number: int) -> None:
        """A recorded part is not at the destination as recorded."""
        self.outcomes.context.state.forget_part(self.file.id, self.dest, number)

    def sent(self, amount: int) -> None:
        """`amount` more bytes went out."""
        self.sent_total += amount
        self.outcomes.on_sent(self, amount)


class DeliveryOutcomes:
    """Records and announces the outcomes of one instance's delivery attempts."""

    def __init__(
        self,
        context: InstanceContext,
        lifecycle: SourceLifecycle,
        *,
        progress: ProgressSink | None = None,
        progress_interval_s: float = 1.0,
    ) -> None:
        self.context = context
        self.lifecycle = lifecycle
        self.progress = progress
        self.progress_interval_s = progress_interval_s

    def journal(self, file: FileRecord, dest: str) -> DeliveryJournal:
        """A journal for one delivery of `file` to `dest`."""
        return DeliveryJournal(self, file, dest)

    def on_sent(self, journal: DeliveryJournal, amount: int) -> None:
        """Progress of one transfer: metrics always, an event at most every interval."""
        ctx = self.context
        dims = {"instance": ctx.id, "destination": journal.dest}
        ctx.metrics.counter("egress", "bytesSent", dims, unit="Bytes").inc(amount)
        if self.progress is not None:
            self.progress(
                ctx.id, journal.dest, journal.file.rel, journal.sent_total, journal.file.size
            )
        now = time.monotonic()
        if now - journal.last_event >= self.progress_interval_s:
            journal.last_event = now
            ctx.announce(
                "info",
                "file-progress",
                {
                    "file": journal.file.rel,
                    "destination": journal.dest,
                    "bytesSent": journal.sent_total,
                    "size": journal.file.size,
                },
            )

    def failed_attempt(
        self,
        file: FileRecord,
        dest: DestinationSpec,
        error: str,
        *,
        permanent: bool = False,
        verification: bool = False,
    ) -> None:
        """Counts a failure; retried with backoff until maxAttempts, then failed for good."""
        ctx = self.context
        retry = ctx.spec.retry
        record = ctx.state.delivery(file.id, dest.id)
        attempts = (record.attempts if record else 0) + 1
        permanent = permanent or attempts >= retry.max_attempts
        # A failed verification is sent again at once: the destination answered, the
        # bytes were wrong.
        delay = 0.0 if verification else retry.backoff_seconds(attempts)
        ctx.state.mark_failed_attempt(
            file.id, dest.id, error, time.time() + delay, permanent=permanent
        )
        dims = {"instance": ctx.id, "destination": dest.id}
        ctx.metrics.counter("egress", "failures", dims).inc()
        context = {"file": file.rel, "destination": dest.id, "attempts": attempts, "error": error}
        if permanent:
            _log.error(
                "instance %s: %s -> %s failed for good after %d attempts: %s",
                ctx.id,
                file.rel,
                dest.id,
                attempts,
                error,
            )
            ctx.announce("error", "delivery-failed", context)
        else:
            ctx.metrics.counter("egress", "retries", dims).inc()
            _log.warning(
                "instance %s: %s -> %s attempt %d failed (%s); retry in %.1f s",
                ctx.id,
                file.rel,
                dest.id,
                attempts,
                error,
                delay,
            )
            kind = "verification-failed" if verification else "delivery-retry"
            ctx.announce("warning", kind, {**context, "retryInSeconds": delay})
        ctx.notify()

    def delivered(
        self, file: FileRecord, dest: DestinationSpec, outcome: Outcome, journal: DeliveryJournal
    ) -> None:
        """One destination verified its copy; the file completes when every one has."""
        ctx = self.context
        ctx.state.mark_verified(file.id, dest.id)
        dims = {"instance": ctx.id, "destination": dest.id}
        ctx.metrics.counter("egress", "filesDelivered", dims).inc()
        _log.info(
            "instance %s: %s delivered to %s and verified (resumed from %d, sent %d)",
            ctx.id,
            file.rel,
            dest.id,
            outcome.resumed_from,
            outcome.bytes_sent,
        )
        ctx.announce(
            "info",
            "file-delivered",
            {
                "file": file.rel,
                "destination": dest.id,
                "size": file.size,
                "resumedFrom": outcome.resumed_from,
                "bytesSent": outcome.bytes_sent,
                **dict(outcome.detail),
            },
        )
        self.lifecycle.complete_if_done(file)
        ctx.notify()
