"""`MetricsReporter`: the thread that collects the registry and emits it every interval."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from unskit.config.model import DEFAULT_METRIC_INTERVAL_SECONDS
from unskit.runtime.metrics.emitters import MetricEmitter
from unskit.runtime.metrics.registry import MetricSample, MetricsRegistry, is_number

__all__ = ["MetricsReporter"]

_STOP_JOIN_SECS = 5.0

# One logger for the package, `unskit.runtime.metrics` as before it was split in modules.
_log = logging.getLogger(__package__)


class MetricsReporter:
    """Emits the registry through one emitter every interval, on a daemon thread."""

    def __init__(
        self,
        registry: MetricsRegistry,
        emitter: MetricEmitter,
        interval_secs: float = DEFAULT_METRIC_INTERVAL_SECONDS,
        *,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        if not is_number(interval_secs) or not interval_secs > 0:
            raise ValueError(f"the metrics interval must be positive; got {interval_secs!r}")
        self._registry = registry
        self._emitter = emitter
        self._interval = float(interval_secs)
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._stop = threading.Event()
        # Wakes the loop for stop() and for set_interval(), which applies at once.
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Emits come from the loop and from emit_now(); one at a time keeps intervals whole.
        self._emit_lock = threading.Lock()

    def start(self) -> None:
        """Starts the emit loop; a second start, or a start after stop, is a no-op."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="unskit-metrics", daemon=True)
            self._thread.start()

    def emit_now(self) -> list[MetricSample]:
        """Collects (resetting interval values) and emits once; returns what was emitted."""
        with self._emit_lock:
            samples = self._registry.collect(reset_interval=True)
            self._emitter.emit(samples, self._clock_ms())
            return samples

    def stop(self, *, flush: bool = True, timeout: float = _STOP_JOIN_SECS) -> None:
        """Stops the loop, emits the partial interval when ``flush``, closes the emitter."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            thread = self._thread
        with self._wake:
            self._wake.notify_all()
        if thread is not None:
            thread.join(timeout)
        if flush:
            self._safe_emit()
        self._emitter.close()

    def set_interval(self, interval_secs: float) -> None:
        """A new cadence, counted from the last emit: one already due is emitted at once."""
        if not is_number(interval_secs) or not interval_secs > 0:
            raise ValueError(f"the metrics interval must be positive; got {interval_secs!r}")
        with self._wake:
            self._interval = float(interval_secs)
            self._wake.notify_all()

    @property
    def interval(self) -> float:
        """Seconds between emits."""
        return self._interval

    @property
    def running(self) -> bool:
        """Whether the emit loop thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            with self._wake:
                # Re-reckoned on every wake, so a shorter interval set meanwhile counts.
                while (
                    not self._stop.is_set()
                    and (left := last + self._interval - time.monotonic()) > 0
                ):
                    self._wake.wait(left)
                if self._stop.is_set():
                    return
            last = time.monotonic()
            self._safe_emit()

    def _safe_emit(self) -> None:
        try:
            self.emit_now()
        except Exception:
            # A failed emit loses that interval's values, never the totals or the loop.
            _log.exception("metric emission failed")
