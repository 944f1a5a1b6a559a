"""One device instance: its own thread that connects (with jittered backoff), polls its
groups on schedule (or, for a push source, drains what the device sends), publishes signal
updates, probes while paused, and runs the verbs' device work between polls. The driver is
only ever called from this thread."""

from __future__ import annotations

import functools
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

from unskit.commands import ErrorCode
from unskit.envelope import EnvelopeStamp, Message, MessageBuilder
from unskit.errors import CommandError, EnvelopeError, UnskitError
from unskit.messaging import MessagingClient
from unskit.runtime.supervision import Supervisor
from unskit.southbound.driver import (
    DeviceDriver,
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    PushDriver,
    SignalSpec,
)
from unskit.southbound.push import PushInbox
from unskit.southbound.signals import SignalTable, bounded_status, not_encodable
from unskit.topics import TopicScope

__all__ = ["DEVICE_UNREACHABLE", "InstanceContext", "InstanceRunner", "InstanceState"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

DEVICE_UNREACHABLE = "device-unreachable"
SIGNAL_UPDATE_NAME = "SouthboundSignalUpdate"
_STOP_TIMEOUT_S = 10.0
#: Counters with a pollGroup dimension, and those of the instance as a whole.
_GROUP_COUNTERS = ("reads", "readErrors")
_INSTANCE_COUNTERS = (
    "samplesPublished",
    "publishErrors",
    "reconnects",
    "samplesDropped",
    "encodeErrors",
    "threadFailures",
)
#: Signal updates built and not yet published, at most; a full queue holds the instance
#: thread back, as publishing on it did.
_OUTBOX_LIMIT = 1000


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


class InstanceRunner:
    """Runs one `InstanceSpec` with its `DeviceDriver`."""

    def __init__(
        self,
        spec: InstanceSpec,
        driver: DeviceDriver,
        context: InstanceContext,
        *,
        paused: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self.spec = spec
        self.driver = driver
        self._context = context
        self._rng = rng or random.Random()
        self._table = SignalTable(
            (group.id, s) for group in spec.poll_groups for s in group.signals
        )
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._paused = paused
        self._state = InstanceState.STARTING
        self._last_error = ""
        if spec.unavailable is not None:
            self._state = InstanceState.FAILED
            self._last_error = str(spec.unavailable)
        self._connected_since: float | None = None
        #: Failed cycles since the connection last proved itself; sizes the backoff window.
        self._attempt = 0
        #: When the next connect may start (None: now); set by every failure.
        self._retry_at: float | None = None
        #: Whether the current connection has proved itself, and whether the device has
        #: answered on it yet (see `_settle`).
        self._proven = False
        self._answered = False
        #: The inbox of the current connection of a push source (None when polled).
        self._inbox: PushInbox | None = None
        #: Why the thread last failed, until a connection proves itself again (see `dead`).
        self._thread_failure: str | None = None
        #: Signals whose last update could not be encoded (logged once until one encodes).
        self._unencodable: set[str] = set()
        self._thread = threading.Thread(target=self._run, name=f"sb-{spec.id}", daemon=True)
        # Updates go out on a thread of their own, in order, so the next read starts as soon
        # as the last one is recorded (publishing a cycle's updates on the instance thread
        # delayed every read by that much: docs/decisions.md). None ends it.
        self._outbox: queue.Queue[tuple[str, Message, int] | None] = queue.Queue(_OUTBOX_LIMIT)
        self._publisher = threading.Thread(
            target=self._publish_loop, name=f"sb-{spec.id}-publish", daemon=True
        )

    # -- control ----------------------------------------------------------------------------

    def start(self) -> InstanceRunner:
        """Starts the instance's thread; a failed instance gets none and never connects."""
        if self._state is InstanceState.FAILED:
            _log.error("instance %s failed: %s", self.spec.id, self._last_error)
            self._set_gauges()
            return self
        self._publisher.start()
        self._thread.start()
        return self

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Stops the thread, closes the connection and clears the unreachable alarm."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._thread.is_alive():
            _log.warning("instance %s did not stop within %.0f s", self.spec.id, timeout)

    def pause(self) -> bool:
        """Holds polling (the connection is kept and probed); returns whether it changed."""
        with self._lock:
            changed, self._paused = not self._paused, True
        self._wake.set()
        return changed

    def resume(self) -> bool:
        with self._lock:
            changed, self._paused = self._paused, False
        if changed:
            self._table.restart_staleness(time.monotonic())
        self._wake.set()
        return changed

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def connected(self) -> bool:
        return self._state is InstanceState.CONNECTED

    @property
    def state(self) -> InstanceState:
        return self._state

    @property
    def last_error(self) -> str:
        return self._last_error

    @property
    def dead(self) -> str | None:
        """Why the instance is down by a failure of its own: its thread failed and no
        connection has proved itself since (the rule that clears the unreachable alarm), or
        it ended without being stopped. None otherwise (running, reconnecting after a lost
        device, paused, stopped, or failed by its configuration)."""
        if self._thread_failure is not None:
            return self._thread_failure
        thread = self._thread
        if thread.ident is not None and not thread.is_alive() and not self._stop.is_set():
            return "its thread ended"
        return None

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Runs device work on the instance thread; DEVICE_UNAVAILABLE when not connected."""
        future: Future[T] = Future()
        if self._state is InstanceState.FAILED:
            future.set_exception(CommandError(ErrorCode.DEVICE_UNAVAILABLE, self._last_error))
            return future
        with self._lock:
            self._jobs.append((work, future))
        self._wake.set()
        return future

    # -- views ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The instance's part of sb/status."""
        now = time.monotonic()
        described = dict(self.driver.describe())
        security = described.pop("security", None)
        return {
            "instance": self.spec.id,
            "adapter": self.spec.adapter,
            "endpoint": self.spec.endpoint,
            "state": self._state.value,
            "connected": self.connected,
            "paused": self._paused,
            "connectedForSecs": None
            if self._connected_since is None
            else round(now - self._connected_since, 3),
            "lastError": self._last_error or None,
            "signals": len(self._table.by_id),
            "staleSignals": 0
            if self._paused
            else len(self._table.stale(now, self.spec.timing.stale_signal_secs)),
            "writable": sorted(self.spec.writes_allow),
            "counters": self._counters(),
            "device": described,
            "security": security
            or {"mode": "plaintext", "est": {"enabled": False}, "target": None},
        }

    def _counters(self) -> dict[str, float]:
        counter, groups = self._context.counter, [group.id for group in self.spec.poll_groups]
        totals = {
            name: sum(counter(self.spec.id, name, group).total for group in groups)
            for name in _GROUP_COUNTERS
        }
        for name in _INSTANCE_COUNTERS:
            totals[name] = counter(self.spec.id, name, None).total
        return totals

    def signal_views(self) -> list[dict[str, Any]]:
        """Every signal with its settings and last value (sb/signals)."""
        now = time.monotonic()
        stale = {id(s) for s in self._table.stale(now, self.spec.timing.stale_signal_secs)}
        views = []
        for state in self._table.by_id.values():
            spec = state.spec
            value, quality, status = state.last_value, state.last_quality, state.last_detail
            unfit = not_encodable(value)
            views.append(
                {
                    "id": spec.id,
                    "name": spec.name,
                    "channel": state.channel,
                    "group": state.group,
                    "type": spec.type,
                    "arrayCount": spec.array_count,
                    "publishMode": spec.publish_mode.value,
                    "deadband": {"type": spec.deadband.type, "value": spec.deadband.value},
                    "batchMs": spec.batch_ms,
                    # One value the envelope cannot carry must not fail the whole reply.
                    "value": None if unfit else value,
                    "quality": "BAD" if unfit else (None if quality is None else quality.value),
                    "serverTimestampMs": state.last_server_ms or None,
                    "status": unfit or status or None,
                    "stale": (not self._paused) and id(state) in stale,
                    "writable": spec.id in self.spec.writes_allow,
                }
            )
        return views

    # -- the thread -------------------------------------------------------------------------

    def signals(self) -> list[SignalSpec]:
        """The instance's signals now (a push source's change as it browses)."""
        return [state.spec for state in self._table.by_id.values()]

    def _run(self) -> None:
        self._table.restart_staleness(time.monotonic())
        try:
            while not self._stop.is_set():
                try:
                    if isinstance(self.driver, PushDriver):
                        self._run_push(self.driver)
                    else:
                        self._run_poll()
                except Exception as error:
                    self._thread_failed(error)
        finally:
            try:
                self._publish(time.monotonic(), flush=True)
            except Exception:
                _log.exception("instance %s: the last updates could not be built", self.spec.id)
            finally:
                self._outbox.put(None)
                self._publisher.join(_STOP_TIMEOUT_S)
                self._fail_jobs(CommandError(ErrorCode.DEVICE_UNAVAILABLE, "the instance stopped"))
                self._detach_inbox()
                self._close_driver()
                self._state = InstanceState.STOPPED
                self._set_gauges()
                if self._stop.is_set():
                    self._context.clear_alarm(DEVICE_UNREACHABLE, self.spec.id)

    def _thread_failed(self, error: Exception) -> None:
        """A failure of the thread, whatever raised it: logged and counted, the connection
        closed, the unreachable alarm raised with the error, and the loop run again after
        the instance's reconnect backoff (so a failure that repeats is paced, not spun)."""
        reason = f"its thread failed: {type(error).__name__}: {error}"
        try:
            self._thread_failure = reason
            counter = self._context.counter(self.spec.id, "threadFailures", None)
            self._context.thread_failed(f"sb-{self.spec.id}", error, counter)
            was_connected = self.connected
            self._lost(DeviceError(reason))
            if not was_connected:  # `_lost` closes a connected one; a half-open one too
                self._close_driver()
        except Exception:
            # The handling itself failed: still no spin, still a restart.
            _log.exception("instance %s: handling a thread failure failed", self.spec.id)
            self._state = InstanceState.BACKOFF
            self._retry_at = time.monotonic() + self.spec.timing.reconnect_backoff_min_ms / 1000

    def _close_driver(self) -> None:
        try:
            self.driver.close()
        except Exception:
            _log.exception("instance %s: closing the driver failed", self.spec.id)

    def _run_poll(self) -> None:
        groups = {group.id: group for group in self.spec.poll_groups}
        next_due: dict[str, float] = {}
        next_probe = 0.0
        while not self._stop.is_set():
            if not self.connected:
                if self._connect():
                    start = time.monotonic()
                    next_due = {group_id: start for group_id in groups}
                    next_probe = start + self.spec.timing.keepalive_probe_interval_ms / 1000
                continue
            now = time.monotonic()
            self._run_jobs()
            if not self.connected:
                continue
            if self._paused:
                if now >= next_probe:
                    next_probe = now + self.spec.timing.keepalive_probe_interval_ms / 1000
                    try:
                        self._guard(self.driver.probe)
                    except DeviceError:
                        continue
                    self._settle(answered=True)
            else:
                for group_id, due in next_due.items():
                    if now >= due and self.connected:
                        self._poll(groups[group_id], now)
                        interval = groups[group_id].interval_ms / 1000
                        # Fixed rate; a late cycle is not caught up in a burst.
                        next_due[group_id] = max(due + interval, now)
            self._publish(time.monotonic(), flush=False)
            self._set_gauges()
            self._wake.wait(self._sleep_for(next_due, next_probe))
            self._wake.clear()

    def _run_push(self, driver: PushDriver) -> None:
        next_probe = 0.0
        next_maintain: float | None = None
        held = False
        while not self._stop.is_set():
            if not self.connected:
                if self._connect(lambda deadline_s: self._subscribe(driver, deadline_s)):
                    start = time.monotonic()
                    next_maintain = start
                    next_probe = start + self.spec.timing.keepalive_probe_interval_ms / 1000
                continue
            self._run_jobs()
            now = time.monotonic()
            maintain_asked = self._drain(driver, now)
            if not self.connected:
                continue
            if self._paused != held:
                paused = self._paused
                try:
                    self._guard(functools.partial(driver.hold, paused))
                except DeviceError:
                    continue
                held = paused
            if maintain_asked or (next_maintain is not None and now >= next_maintain):
                try:
                    after = self._guard(driver.maintain)
                except DeviceError:
                    continue
                next_maintain = None if after is None else time.monotonic() + max(after, 0.0)
            if self._paused and now >= next_probe:
                next_probe = now + self.spec.timing.keepalive_probe_interval_ms / 1000
                try:
                    self._guard(driver.probe)
                except DeviceError:
                    continue
                self._settle(answered=True)
            # Pushed data proves the connection once it has stayed up a window since.
            self._settle(answered=False)
            self._publish(time.monotonic(), flush=False)
            self._set_gauges()
            wakes = [
                w
                for w in (next_maintain, self._table.next_window(), self._proof_due())
                if w is not None
            ]
            if self._paused:
                wakes.append(next_probe)
            timeout = max(0.0, min(wakes) - time.monotonic()) if wakes else 1.0
            self._wake.wait(timeout)
            self._wake.clear()

    def _subscribe(self, driver: PushDriver, deadline_s: float) -> None:
        """Connects, attaches a fresh inbox and has the driver start sending."""
        driver.connect(deadline_s)
        self._detach_inbox()
        self._inbox = PushInbox(self.spec.id, self._wake.set)
        driver.subscribe(self._inbox)
        self._define(driver)

    def _define(self, driver: PushDriver) -> None:
        self._table.define([("push", signal) for signal in driver.signals()], time.monotonic())

    def _drain(self, driver: PushDriver, now: float) -> bool:
        """Moves what the driver sent into the signal table; returns whether the driver
        asked for maintain. A loss it reported moves the instance to backoff."""
        inbox = self._inbox
        if inbox is None:
            return False
        lost, changed, maintain = inbox.take_flags()
        if changed:
            self._define(driver)
        readings = inbox.take()
        alive = inbox.take_alive()
        dropped = inbox.take_dropped()
        if dropped:
            self._context.counter(self.spec.id, "samplesDropped", None).inc(dropped)
        if readings and not self._paused:
            self._table.accept(readings, int(time.time() * 1000), now)
        if alive and not self._paused:
            self._table.touch(alive, now)
        if lost is not None and self.connected:
            self._lost(lost)
        if readings or alive or dropped:
            self._settle(answered=True)
        return maintain

    def _detach_inbox(self) -> None:
        if self._inbox is not None:
            self._inbox.close()
            self._inbox = None

    def _set_gauges(self) -> None:
        gauge, threshold = self._context.gauge, self.spec.timing.stale_signal_secs
        gauge(self.spec.id, "connected").set(1 if self.connected else 0)
        stale = 0 if self._paused else len(self._table.stale(time.monotonic(), threshold))
        gauge(self.spec.id, "staleSignals").set(stale)

    def _sleep_for(self, next_due: Mapping[str, float], next_probe: float) -> float:
        now = time.monotonic()
        wakes = [next_probe] if self._paused else list(next_due.values())
        window = self._table.next_window()
        if window is not None:
            wakes.append(window)
        return max(0.0, min(wakes, default=now + 1.0) - now)

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
        ceiling = min(
            timing.reconnect_backoff_max_ms,
            timing.reconnect_backoff_min_ms * 2 ** min(self._attempt, 30),
        )
        self._attempt += 1
        delay = self._rng.uniform(timing.reconnect_backoff_min_ms, ceiling) / 1000
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

    def _poll(self, group: PollGroupSpec, now: float) -> None:
        counter = self._context.counter
        try:
            readings = self._guard(lambda: self.driver.read(group)) or []
        except DeviceError as error:
            counter(self.spec.id, "readErrors", group.id).inc()
            _log.debug("instance %s: read of %s failed: %s", self.spec.id, group.id, error)
            return
        counter(self.spec.id, "reads", group.id).inc()
        self._settle(answered=True)
        bad = sum(1 for reading in readings if reading.quality.value != "GOOD")
        if bad:
            counter(self.spec.id, "readErrors", group.id).inc(bad)
        self._table.accept(readings, int(time.time() * 1000), now)

    def _publish(self, now: float, *, flush: bool) -> None:
        """Builds the due signal updates and hands them to the publisher thread."""
        for state in self._table.due(now, flush=flush):
            samples = self._table.take(state)
            message = self._signal_update(state.spec, samples)
            if state.topic is None:
                state.topic = self._context.topics.topic(
                    "data", state.channel, instance=self.spec.id
                )
            self._outbox.put((state.topic, message, len(samples)))

    def _signal_update(self, spec: SignalSpec, samples: list[dict[str, Any]]) -> Message:
        """The update of one signal. A sample whose value the envelope cannot carry goes
        out BAD, without its value, with a status saying why: one value never holds back
        the signal's other samples, nor any other signal."""
        try:
            message = self._build_update(spec, samples)
        except (EnvelopeError, TypeError, ValueError):
            samples = [self._encodable(spec, sample) for sample in samples]
            message = self._build_update(spec, samples)
        else:
            self._unencodable.discard(spec.id)
        return message

    def _build_update(self, spec: SignalSpec, samples: list[dict[str, Any]]) -> Message:
        return (
            MessageBuilder(SIGNAL_UPDATE_NAME, "1.0", self._context.stamp)
            .instance(self.spec.id)
            .signal_update(spec.id, samples, name=spec.name)
            .build()
        )

    def _encodable(self, spec: SignalSpec, sample: dict[str, Any]) -> dict[str, Any]:
        try:
            self._build_update(spec, [sample])
        except (EnvelopeError, TypeError, ValueError) as error:
            self._context.counter(self.spec.id, "encodeErrors", None).inc()
            status = not_encodable(sample.get("value")) or bounded_status(f"not encodable: {error}")
            if spec.id not in self._unencodable:
                self._unencodable.add(spec.id)
                _log.warning(
                    "instance %s: a sample of %s cannot be encoded, published BAD: %s",
                    self.spec.id,
                    spec.id,
                    status,
                )
            return {
                "value": None,
                "quality": "BAD",
                "source_timestamp_ms": sample.get("source_timestamp_ms", 0),
                "server_timestamp_ms": sample.get("server_timestamp_ms", 0),
                "status": status,
            }
        return sample

    def _publish_loop(self) -> None:
        while True:
            updates = [self._outbox.get()]
            # What else is waiting goes out in the same pass, counted once (a pass takes at
            # most a queue's worth, so a producer never keeps it from publishing).
            while (
                updates[-1] is not None
                and len(updates) < _OUTBOX_LIMIT
                and not self._outbox.empty()
            ):
                updates.append(self._outbox.get_nowait())
            published = 0
            for update in updates:
                if update is None:
                    break
                topic, message, count = update
                try:
                    self._context.messaging.publish(topic, message)
                except UnskitError as error:
                    self._context.counter(self.spec.id, "publishErrors", None).inc()
                    _log.debug(
                        "instance %s: update of %s not published: %s", self.spec.id, topic, error
                    )
                    continue
                except Exception:
                    self._context.counter(self.spec.id, "publishErrors", None).inc()
                    _log.exception("instance %s: update of %s not published", self.spec.id, topic)
                    continue
                published += count
            if published:
                self._context.counter(self.spec.id, "samplesPublished", None).inc(published)
            if updates[-1] is None:
                return

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
