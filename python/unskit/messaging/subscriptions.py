"""One subscription's bounded queue and its handler workers.

The transport's network thread only ever enqueues (never blocks, never runs a handler);
workers start on demand up to `max_concurrency` and leave when idle.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from unskit.envelope import Message
from unskit.topics import topic_matches_filter, unshared_filter

__all__ = ["DEFAULT_MAX_MESSAGES", "UNCAPPED_WORKERS", "Handler", "Subscription"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGES = 10_000
# "Uncapped" concurrency still runs on a bounded number of threads.
UNCAPPED_WORKERS = 64
IDLE_WORKER_EXIT_SECS = 30.0
# A full queue logs its first drop and then every this many more.
DROP_LOG_EVERY = 1_000

Handler = Callable[[str, Message], None]


class Subscription:
    """A topic filter's handler, its bounded queue and its workers."""

    def __init__(
        self,
        topic_filter: str,
        handler: Handler,
        *,
        max_concurrency: int | None = None,
        max_messages: int | None = None,
        on_overflow: Handler | None = None,
    ) -> None:
        if max_messages is not None and max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, not {max_messages}")
        self.topic_filter = topic_filter
        # A shared subscription ($share/<group>/<filter>) delivers topics of its filter.
        self._match_filter = unshared_filter(topic_filter)
        self._handler = handler
        # 0 or less means uncapped, as in the Java and Python variants.
        self.max_concurrency = (
            max_concurrency if max_concurrency is not None and max_concurrency > 0 else None
        )
        self.max_messages = max_messages or DEFAULT_MAX_MESSAGES
        # Called on the network thread for a message the full queue refuses (the command
        # inbox answers it busy): it must be quick and must not block.
        self._on_overflow = on_overflow
        # A C-level queue bounded by our own check: only the link's network thread offers.
        # None is the stop sentinel, queued behind what is left to handle.
        self._queue: queue.SimpleQueue[tuple[str, Message] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers_left = threading.Condition(self._lock)
        self._workers = 0
        self._idle = 0
        self._closing = False
        self.delivered = 0
        self.dropped = 0
        self.failed = 0
        #: Dropped messages whose overflow handler raised.
        self.overflow_failed = 0

    def matches(self, topic: str) -> bool:
        """Whether `topic` falls under this subscription's filter."""
        return topic_matches_filter(self._match_filter, topic)

    @property
    def worker_limit(self) -> int:
        """How many handler calls may run at once."""
        return self.max_concurrency or UNCAPPED_WORKERS

    @property
    def closing_workers(self) -> bool:
        """True while a closed subscription still has workers finishing their messages."""
        return self._closing and self._workers > 0

    @property
    def queued(self) -> int:
        """Messages waiting for a worker."""
        return self._queue.qsize()

    def offer(self, topic: str, message: Message) -> bool:
        """Enqueues without blocking; a full queue drops the message (counted, logged) after
        handing it to the overflow handler, if any."""
        if self._closing:
            return False
        if self._queue.qsize() >= self.max_messages:
            self._overflow(topic, message)
            return False
        self._queue.put((topic, message))
        # Unlocked first look: the common cases (a worker idle, or all busy at the cap)
        # take no lock at all.
        if self._idle == 0 and self._workers < self.worker_limit:
            with self._lock:
                if self._idle == 0 and self._workers < self.worker_limit:
                    self._workers += 1
                    threading.Thread(
                        target=self._work, name=f"unskit-sub-{self.topic_filter}", daemon=True
                    ).start()
        return True

    def _overflow(self, topic: str, message: Message) -> None:
        error: Exception | None = None
        if self._on_overflow is not None:
            try:
                self._on_overflow(topic, message)
            except Exception as raised:
                # Never raised into the network thread; counted, and shown in the drop line.
                error = raised
        with self._lock:
            self.dropped += 1
            dropped = self.dropped
            if error is not None:
                self.overflow_failed += 1
        if dropped == 1 or dropped % DROP_LOG_EVERY == 0:
            _log.warning(
                "subscription %r: queue of %d full, dropped %d messages so far%s%s",
                self.topic_filter,
                self.max_messages,
                dropped,
                "" if self._on_overflow is None else " (each handed to its overflow handler)",
                "" if error is None else f"; the overflow handler failed: {error!r}",
            )

    def close(self, timeout: float | None = None) -> bool:
        """Lets the workers finish what is queued; True when they all left within `timeout`.
        Calling it again waits again (the first call may have given up at once)."""
        with self._lock:
            if not self._closing:
                self._closing = True
                for _ in range(self._workers):
                    self._queue.put(None)
            drained = self._workers_left.wait_for(lambda: self._workers == 0, timeout)
        if not drained and timeout:
            _log.warning(
                "subscription %r: %d messages still queued at close",
                self.topic_filter,
                self._queue.qsize(),
            )
        return drained

    def _work(self) -> None:
        q = self._queue
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                with self._lock:
                    self._idle += 1
                try:
                    item = q.get(timeout=IDLE_WORKER_EXIT_SECS)
                except queue.Empty:
                    with self._lock:
                        self._idle -= 1
                        # An offer that saw us idle relies on us: stay while anything waits.
                        if q.empty():
                            self._leave()
                            return
                    continue
                with self._lock:
                    self._idle -= 1
            if item is None:
                with self._lock:
                    self._leave()
                return
            topic, message = item
            handled = False
            try:
                self._handler(topic, message)
                handled = True
            except Exception:
                _log.exception("subscription %r: handler failed on %r", self.topic_filter, topic)
            finally:
                with self._lock:
                    if handled:
                        self.delivered += 1
                    else:
                        self.failed += 1

    def _leave(self) -> None:
        # Called with the lock held.
        self._workers -= 1
        self._workers_left.notify_all()
