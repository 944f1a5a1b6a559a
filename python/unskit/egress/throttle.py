"""Token-bucket bandwidth limits, per instance and per destination, in bytes per second."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

__all__ = ["Throttle", "TokenBucket"]


class TokenBucket:
    """`rate` bytes per second with a burst of `burst` bytes; rate 0 means unlimited."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = float(rate)
        # A quarter second of burst keeps the long-run rate exact while letting one
        # chunk through without a wait at low rates.
        self.burst = float(burst if burst is not None else max(self.rate / 4, 64 * 1024))
        # Starts empty: a full bucket would let the first burst out above the rate, which
        # shows as several percent on a transfer of a few seconds.
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    @property
    def unlimited(self) -> bool:
        """True when no limit applies."""
        return self.rate <= 0

    def reserve(self, amount: int) -> float:
        """Takes `amount` tokens (possibly into debt); returns how long to wait before sending."""
        if self.unlimited:
            return 0.0
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= amount
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self.rate


class Throttle:
    """The buckets one transfer draws from (its instance's and its destination's)."""

    def __init__(self, buckets: Sequence[TokenBucket], cancel: threading.Event) -> None:
        self._buckets = [bucket for bucket in buckets if not bucket.unlimited]
        self._cancel = cancel

    def acquire(self, amount: int) -> bool:
        """Waits until `amount` bytes may be sent; False when the transfer was cancelled."""
        wait = 0.0
        for bucket in self._buckets:
            wait = max(wait, bucket.reserve(amount))
        if wait > 0:
            # Waiting on the cancel event rather than sleeping: pause and shutdown cut it short.
            return not self._cancel.wait(wait)
        return not self._cancel.is_set()
