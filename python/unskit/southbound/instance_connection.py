"""The connection layer of `InstanceRunner`: its state (`InstanceState`, what it publishes
through, `InstanceContext`) and what keeps one device connection: connect after the backoff
window of the last failure, the proof that clears the unreachable alarm, the loss that opens
the next window, device work guarded against a lost connection, the verbs' device work run
or refused, the driver closed and the connected and staleSignals gauges."""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from unskit.backoff import jittered_delay
from unskit.commands import ErrorCode
from unskit.envelope import EnvelopeStamp, Message
from unskit.errors import CommandError
from unskit.messaging import MessagingClient
from unskit.runtime.supervision import Supervisor
from unskit.southbound.driver import DeviceDriver, DeviceError, InstanceSpec
from unskit.southbound.push import PushInbox
from unskit.southbound.signals import SignalTable
from unskit.topics import TopicScope

# The logger keeps the name it had before this module was split out of instance.py.
_log = logging.getLogger("unskit.southbound.instance")

T = TypeVar("T")

DEVICE_UNREACHABLE = "device-unreachable"


class InstanceState(str, Enum):
    STARTING = "starting"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    BACKOFF = "backoff"
    STOPPED = "stopped"
    #: The configuration asks for what this build cannot do: never connects, until changed.
    FAILED = "failed"


@dataclass(frozen=True)
class InstanceContext:
    """What an instance publishes through: messaging, topics, events, metrics, the stamp."""

    messaging: MessagingClient
    topics: TopicScope
    stamp: EnvelopeStamp | None
    raise_alarm: Callable[[str, str, Mapping[str, Any]], None]
    clear_alarm: Callable[[str, str], None]
    #: (instance, name, poll group or None) -> a counter of the southbound_health family.
    counter: Callable[[str, str, str | None], Any]
    #: (instance, name) -> a gauge of the southbound_health family.
    gauge: Callable[[str, str], Any]
    #: (thread name, error, counter) -> logs and counts a failure of the instance's thread
    #: (the component's `Supervisor.failed`).
    thread_failed: Callable[[str, BaseException, Any], None] = field(
        default_factory=lambda: Supervisor().failed
    )


class _Connection:
    """The connection layer of `InstanceRunner`: its state, connect, backoff, loss, jobs."""

    spec: InstanceSpec
    driver: DeviceDriver
    _context: InstanceContext
    _rng: random.Random
    _table: SignalTable
    _lock: threading.Lock
    _wake: threading.Event
    _stop: threading.Event
    _jobs: deque[tuple[Callable[[], Any], Future[Any]]]
    _paused: bool
    _state: InstanceState
    _last_error: str
    _connected_since: float | None
    _attempt: int
    _retry_at: float | None
    _proven: bool
    _answered: bool
    _inbox: PushInbox | None
    _thread_failure: str | None
    _unencodable: set[str]
    _thread: threading.Thread
    _outbox: queue.Queue[tuple[str, Message, int] | None]
    _publisher: threading.Thread

    @property
    def connected(self) -> bool:
        return self._state is InstanceState.CONNECTED

    def _close_driver(self) -> None:
        try:
            self.driver.close()
        except Exception:
            _log.exception("instance %s: closing the driver failed", self.spec.id)

    def _detach_inbox(self) -> None:
        if self._inbox is not None:
            self._inbox.close()
            self._inbox = None

    def _set_gauges(self) -> None:
        gauge, threshold = self._context.gauge, self.spec.timing.stale_signal_secs
        gauge(self.spec.id, "connected").set(1 if self.connected else 0)
        stale = 0 if self._paused else len(self._table.stale(time.monotonic(), threshold))
        gauge(self.spec.id, "staleSignals").set(stale)

    def _connect(self, establish: Callable[[float], None] | None = None) -> bool:
        """Waits out the backoff window of the last failure, then opens the session (and, for
        a push source, what makes it send); on failure the driver is closed and False returned."""
        if self._retry_at is not None:
            self._state = InstanceState.BACKOFF
            self._hold_off(self._retry_at)
            if self._stop.is_set():
                return False
            self._retry_at = None
        self._state = InstanceState.CONNECTING
        try:
            (establish or self.driver.connect)(self.spec.timing.connect_ms / 1000)
        except DeviceError as error:
            self._lost(error)
            self.driver.close()
            self._set_gauges()
            return False
        # The window and the alarm stay until the connection proves itself (`_settle`): a
        # device that accepts and then drops every session is a failure, not a recovery.
        self._proven = self._answered = False
        self._state = InstanceState.CONNECTED
        self._connected_since = time.monotonic()
        self._last_error = ""
        _log.info("instance %s: connected to %s", self.spec.id, self.spec.endpoint)
        return True

    def _settle(self, *, answered: bool) -> None:
        """Notes an answer of the device (a good poll or probe, pushed data); once the device
        has answered and the connection has stayed up one `reconnectBackoffMinMs` window, the
        connection has proved itself: the backoff resets and the unreachable alarm clears."""
        if self._proven or not self.connected:
            return
        self._answered = self._answered or answered
        due = self._proof_due()
        if due is None or time.monotonic() < due:
            return
        self._proven = True
        self._attempt = 0
        # Recovered as from any outage: a thread failure before it is over.
        self._thread_failure = None
        self._context.clear_alarm(DEVICE_UNREACHABLE, self.spec.id)

    def _proof_due(self) -> float | None:
        """When an answered, not yet proven connection will have stayed up long enough."""
        if self._proven or not self._answered or self._connected_since is None:
            return None
        return self._connected_since + self.spec.timing.reconnect_backoff_min_ms / 1000

    def _hold_off(self, deadline: float) -> None:
        """Sleeps until the deadline (or stop), refusing the verbs' device work meanwhile."""
        while not self._stop.is_set() and time.monotonic() < deadline:
            self._fail_jobs(
                CommandError(ErrorCode.DEVICE_UNAVAILABLE, f"not connected: {self._last_error}")
            )
            self._wake.wait(max(0.0, deadline - time.monotonic()))
            self._wake.clear()

    def _schedule_retry(self) -> None:
        """Opens the next backoff window: doubling per failed cycle, jittered, capped."""
        timing = self.spec.timing
        delay_ms = jittered_delay(
            timing.reconnect_backoff_min_ms,
            timing.reconnect_backoff_max_ms,
            self._attempt,
            self._rng.uniform,
        )
        self._attempt += 1
        delay = delay_ms / 1000
        self._retry_at = time.monotonic() + delay
        _log.info("instance %s: reconnect in %.2f s", self.spec.id, delay)

    def _lost(self, error: DeviceError) -> None:
        was_connected = self.connected
        self._state = InstanceState.BACKOFF
        self._connected_since = None
        self._last_error = str(error)
        self._detach_inbox()
        if was_connected:
            self._context.counter(self.spec.id, "reconnects", None).inc()
            self.driver.close()
        if self._retry_at is None:
            self._schedule_retry()
        _log.warning("instance %s: device unreachable: %s", self.spec.id, error)
        self._context.raise_alarm(
            DEVICE_UNREACHABLE,
            self.spec.id,
            {"endpoint": self.spec.endpoint, "error": str(error)},
        )

    def _guard(self, work: Callable[[], T]) -> T | None:
        """Runs device work; a lost connection moves the instance to backoff."""
        try:
            return work()
        except DeviceError as error:
            if error.connection_lost:
                self._lost(error)
            else:
                self._last_error = str(error)
            raise

    def _run_jobs(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    return
                work, future = self._jobs.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._guard(work))
            except BaseException as error:
                future.set_exception(error)

    def _fail_jobs(self, error: BaseException) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    return
                _, future = self._jobs.popleft()
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
