"""The runtime's side of a push source: a bounded, thread-safe inbox the driver delivers to
from its own thread, drained by the instance thread. One inbox per connection, so nothing a
previous session sends after it was lost reaches the signal table."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from unskit.southbound.driver import DeviceError, Reading

__all__ = ["MAX_QUEUED_READINGS", "PushInbox"]

_log = logging.getLogger(__name__)

#: Readings waiting for the instance thread; beyond it new readings are dropped and counted
#: (a stalled publisher must not grow memory without bound).
MAX_QUEUED_READINGS = 100_000
_DROP_LOG_INTERVAL_S = 60.0


class PushInbox:
    """A `ReadingSink` for one connection of one instance."""

    def __init__(
        self,
        instance_id: str,
        wake: Callable[[], None],
        *,
        capacity: int = MAX_QUEUED_READINGS,
    ) -> None:
        self._instance_id = instance_id
        self._wake = wake
        self._capacity = capacity
        self._lock = threading.Lock()
        self._readings: deque[Reading] = deque()
        self._signals_changed = False
        self._maintain_due = False
        self._alive: set[str] = set()
        self._lost: DeviceError | None = None
        self._closed = False
        self._dropped = 0
        self._next_drop_log = 0.0

    # -- the driver's side (any thread) ----------------------------------------------------

    def deliver(self, readings: Sequence[Reading]) -> None:
        """Queues readings; beyond the capacity the rest are dropped and counted."""
        dropped = 0
        with self._lock:
            if self._closed:
                return
            room = self._capacity - len(self._readings)
            if room >= len(readings):
                self._readings.extend(readings)
            else:
                self._readings.extend(readings[: max(room, 0)])
                dropped = len(readings) - max(room, 0)
                self._dropped += dropped
        if dropped:
            self._log_drop(dropped)
        self._wake()

    def signals_changed(self) -> None:
        with self._lock:
            self._signals_changed = not self._closed
        self._wake()

    def lost(self, error: DeviceError) -> None:
        with self._lock:
            if self._closed or self._lost is not None:
                return
            self._lost = error
        self._wake()

    def wake(self) -> None:
        with self._lock:
            self._maintain_due = not self._closed
        self._wake()

    def alive(self, signal_ids: Sequence[str]) -> None:
        with self._lock:
            if not self._closed:
                self._alive.update(signal_ids)

    # -- the instance thread's side --------------------------------------------------------

    def take(self) -> list[Reading]:
        """Everything queued, oldest first."""
        with self._lock:
            readings = list(self._readings)
            self._readings.clear()
        return readings

    def take_flags(self) -> tuple[DeviceError | None, bool, bool]:
        """(the loss the driver reported, whether the signals changed, whether maintain is
        asked for), each reset by reading it."""
        with self._lock:
            flags = (self._lost, self._signals_changed, self._maintain_due)
            self._lost, self._signals_changed, self._maintain_due = None, False, False
        return flags

    def take_alive(self) -> set[str]:
        """Signals reported read good without a change since the last call."""
        with self._lock:
            alive, self._alive = self._alive, set()
        return alive

    def take_dropped(self) -> int:
        """Readings dropped since the last call."""
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        return dropped

    def close(self) -> None:
        """Detaches the inbox: whatever the driver delivers later is ignored."""
        with self._lock:
            self._closed = True
            self._readings.clear()

    def _log_drop(self, dropped: int) -> None:
        now = time.monotonic()
        if now >= self._next_drop_log:
            self._next_drop_log = now + _DROP_LOG_INTERVAL_S
            _log.warning(
                "instance %s: %d readings dropped, the inbox holds %d already (publication is "
                "behind the device)",
                self._instance_id,
                dropped,
                self._capacity,
            )
