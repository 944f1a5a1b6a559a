"""Request futures, the reply subscription behind them, and the one timer thread that arms
every request deadline."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import heapq
import itertools
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

from unskit.envelope import Message
from unskit.errors import MessagingError, RequestTimeoutError
from unskit.messaging.transport import QoS, Transport
from unskit.topics import REPLY_TOPIC_PREFIX

__all__ = [
    "DEADLINE_TAG",
    "REPLY_BATCH",
    "REPLY_LINGER_SECS",
    "DeadlineTimer",
    "ReplyTopics",
    "RequestFuture",
    "reply_token",
    "request_deadline_ms",
]

_log = logging.getLogger(__name__)

# Settled caller-chosen reply topics removed per UNSUBSCRIBE.
REPLY_BATCH = 16
#: The tag a request carries its sender's deadline in (epoch milliseconds), so a responder
#: that receives it late (held by the broker while it was down) knows whether anyone waits.
DEADLINE_TAG = "lib-deadline-ms"
# How long a settled chosen reply topic's subscription may wait for its UNSUBSCRIBE batch.
REPLY_LINGER_SECS = 0.05
# A client id usable as it is as the reply filter's topic level.
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class RequestFuture:
    """The reply to one request: `get(timeout)` blocks, `await future` suspends."""

    def __init__(
        self, topic: str, reply_topic: str, correlation_id: str, deadline_secs: float | None
    ) -> None:
        self.topic = topic
        self.reply_topic = reply_topic
        self.correlation_id = correlation_id
        self.deadline_secs = deadline_secs
        self._future: concurrent.futures.Future[Message] = concurrent.futures.Future()

    def get(self, timeout: float | None = None) -> Message:
        """The reply; RequestTimeoutError at the request deadline or after `timeout` seconds,
        whichever comes first (after `timeout` alone the request stays pending)."""
        try:
            return self._future.result(timeout)
        except RequestTimeoutError:  # the deadline's own error (a TimeoutError too)
            raise
        except concurrent.futures.TimeoutError:
            raise RequestTimeoutError(
                f"no reply on {self.reply_topic!r} to the request on {self.topic!r} "
                f"within the caller's {timeout} s wait"
            ) from None

    def done(self) -> bool:
        """True once the request was answered, timed out or cancelled."""
        return self._future.done()

    def cancelled(self) -> bool:
        """True when `cancel_request` settled it."""
        return self._future.cancelled()

    def add_done_callback(self, callback: Callable[[RequestFuture], Any]) -> None:
        """Calls `callback(self)` once settled (at once if it already is)."""
        self._future.add_done_callback(lambda _: callback(self))

    def __await__(self) -> Generator[Any, None, Message]:
        return asyncio.wrap_future(self._future).__await__()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"RequestFuture(topic={self.topic!r}, reply_topic={self.reply_topic!r}, {state})"

    # Settling is the client's job, through its one idempotent settle path.
    def _resolve(self, reply: Message) -> bool:
        if self._future.done():
            return False
        self._future.set_result(reply)
        return True

    def _fail(self, error: BaseException) -> bool:
        if self._future.done():
            return False
        self._future.set_exception(error)
        return True

    def _cancel(self) -> bool:
        return self._future.cancel()


class DeadlineTimer:
    """Runs callbacks at their deadlines on one daemon thread (a heap, one Condition wait)."""

    def __init__(
        self, name: str = "unskit-deadlines", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int]] = []
        # The callbacks still due, by handle. A cancelled handle stays in the heap until
        # popped or compacted, but its callback (and the request it holds) goes at once:
        # kept until compaction, they outlived the young GC generation and made every
        # older-generation collection, a request/reply tail pause, longer and more frequent.
        self._live: dict[int, Callable[[], None]] = {}
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_at(self, deadline: float, callback: Callable[[], None]) -> int:
        """Schedules `callback` at monotonic time `deadline`; returns a handle for `cancel`."""
        with self._wake:
            handle = next(self._seq)
            heapq.heappush(self._heap, (deadline, handle))
            self._live[handle] = callback
            if self._heap[0][1] == handle:
                self._wake.notify()
        return handle

    def call_later(self, delay: float, callback: Callable[[], None]) -> int:
        """Schedules `callback` after `delay` seconds."""
        return self.call_at(self._clock() + delay, callback)

    def cancel(self, handle: int) -> None:
        """Forgets a scheduled callback; a no-op once it ran."""
        with self._wake:
            self._live.pop(handle, None)
            if len(self._heap) > 2 * len(self._live) + 1024:
                self._heap = [entry for entry in self._heap if entry[1] in self._live]
                heapq.heapify(self._heap)

    def __len__(self) -> int:
        with self._wake:
            return len(self._live)

    def stop(self) -> None:
        """Stops the thread; pending callbacks never run."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._wake:
                while True:
                    if self._stopped:
                        return
                    while self._heap and self._heap[0][1] not in self._live:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._wake.wait()
                        continue
                    delay = self._heap[0][0] - self._clock()
                    if delay <= 0:
                        _, handle = heapq.heappop(self._heap)
                        callback = self._live.pop(handle)
                        break
                    self._wake.wait(delay)
            try:
                callback()
            except Exception:  # a deadline callback must never kill the timer
                _log.exception("deadline callback failed")


class ReplyTopics:
    """The reply topics of one link: one subscription, `lib/reply-{token}/#`, made when the
    link starts and restored with the other filters after every reconnect; each request
    gets a fresh topic under it, so a request costs no SUBSCRIBE or UNSUBSCRIBE.

    A reply topic the caller chose outside that filter is subscribed for its request alone
    and unsubscribed in batches once settled."""

    def __init__(
        self,
        transport: Transport,
        qos: QoS,
        timer: DeadlineTimer,
        *,
        client_id: str | None = None,
        batch: int = REPLY_BATCH,
        linger_secs: float = REPLY_LINGER_SECS,
    ) -> None:
        self._transport = transport
        self._qos = qos
        self._timer = timer
        self._batch = batch
        self._linger_secs = linger_secs
        self._lock = threading.Lock()
        self._settled: list[str] = []
        self._flush_handle: int | None = None
        self._opened = False
        #: The one reply filter of this link.
        self.filter = f"{REPLY_TOPIC_PREFIX}{reply_token(client_id)}/#"
        # A random stem per link and a counter: unique topics without a uuid4 each, and a
        # previous run's late reply (same client id, same filter) never lands on a topic
        # this run uses.
        self._stem = f"{self.filter[:-1]}{uuid.uuid4().hex[:12]}-"
        self._serial = itertools.count()

    def open(self) -> None:
        """Subscribes the reply filter (once; the transport restores it on reconnect)."""
        with self._lock:
            if self._opened:
                return
            self._transport.subscribe([self.filter], self._qos)
            self._opened = True

    def owns(self, topic: str) -> bool:
        """Whether `topic` lies under this link's reply filter."""
        return topic.startswith(self.filter[:-1])

    def take(self) -> str:
        """A fresh reply topic under the reply filter."""
        if not self._opened:
            self.open()
        return f"{self._stem}{next(self._serial)}"

    def adopt(self, topic: str) -> None:
        """Subscribes a reply topic the caller chose, unless the reply filter covers it or
        its own subscription is still live."""
        if self.owns(topic):
            if not self._opened:
                self.open()
            return
        # Under the lock: a flush must not send its UNSUBSCRIBE after this SUBSCRIBE.
        with self._lock:
            if topic in self._settled:  # reused before its UNSUBSCRIBE went out
                self._settled.remove(topic)
                return
            self._transport.subscribe([topic], self._qos)

    def release(self, topic: str) -> None:
        """The request on `topic` settled: a chosen topic's own subscription goes with the
        next batch, at the latest after the linger; a topic under the filter costs nothing."""
        if self.owns(topic):
            return
        with self._lock:
            self._settled.append(topic)
            full = len(self._settled) >= self._batch
            if not full and self._flush_handle is None:
                self._flush_handle = self._timer.call_later(self._linger_secs, self.flush)
        if full:
            self.flush()

    def flush(self) -> None:
        """Unsubscribes every settled chosen reply topic now, in one UNSUBSCRIBE."""
        with self._lock:
            settled, self._settled = self._settled, []
            handle, self._flush_handle = self._flush_handle, None
            # When the link is closing, the subscriptions go with it.
            if settled:
                with contextlib.suppress(MessagingError):
                    self._transport.unsubscribe(settled)
        if handle is not None:
            self._timer.cancel(handle)

    def close(self) -> None:
        """Unsubscribes the reply filter and the settled chosen topics, before the link
        closes."""
        with self._lock:
            if self._opened:
                self._settled.append(self.filter)
                self._opened = False
        self.flush()


def reply_token(client_id: str | None) -> str:
    """The topic level naming a client's reply filter: the client id when it is made of
    ``[A-Za-z0-9_.-]`` (at most 64), else ``h`` and 24 hex digits of its SHA-256; random
    without a client id."""
    if client_id is None:
        return f"r{uuid.uuid4().hex[:24]}"
    if _SAFE_TOKEN.fullmatch(client_id):
        return client_id
    return "h" + hashlib.sha256(client_id.encode()).hexdigest()[:24]


def request_deadline_ms(request: Message) -> int | None:
    """The sender's deadline the request carries (epoch ms), or None: absent or malformed."""
    raw = request.tags.get(DEADLINE_TAG)
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 15:
        return None
    return int(raw)
