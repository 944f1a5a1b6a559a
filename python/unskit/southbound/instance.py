"""One device instance: its own thread that connects (with jittered backoff), polls its
groups on schedule (or, for a push source, drains what the device sends), publishes signal
updates, probes while paused, and runs the verbs' device work between polls. The driver is
only ever called from this thread.

`InstanceRunner` is joined here from its layers: `instance_connection` (its state, connect,
backoff, the proof and the loss of a connection, the verbs' device work), `instance_publish`
(signal updates built and published), `instance_loops` (the poll and push run loops) and
`instance_views` (sb/status and sb/signals). This module keeps the instance's life: start,
stop, pause, resume, submit, the thread and its failures."""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from unskit.commands import ErrorCode
from unskit.envelope import Message
from unskit.errors import CommandError
from unskit.southbound.driver import DeviceDriver, DeviceError, InstanceSpec, PushDriver
from unskit.southbound.instance_connection import DEVICE_UNREACHABLE as DEVICE_UNREACHABLE
from unskit.southbound.instance_connection import InstanceContext as InstanceContext
from unskit.southbound.instance_connection import InstanceState as InstanceState
from unskit.southbound.instance_loops import _Loops
from unskit.southbound.instance_publish import _OUTBOX_LIMIT
from unskit.southbound.instance_views import _Views
from unskit.southbound.push import PushInbox
from unskit.southbound.signals import SignalTable

__all__ = ["DEVICE_UNREACHABLE", "InstanceContext", "InstanceRunner", "InstanceState"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
_STOP_TIMEOUT_S = 10.0


class InstanceRunner(_Views, _Loops):
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

    # -- the thread -------------------------------------------------------------------------
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
