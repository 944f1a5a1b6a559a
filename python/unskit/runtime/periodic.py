"""`PeriodicWatch`: a check run every interval on a daemon thread, for the watches that
sample a component's state and raise or clear an alarm (publishing, the outbox)."""

from __future__ import annotations

import logging
import threading
from typing import TypeVar

__all__ = ["PeriodicWatch"]

_log = logging.getLogger(__name__)

_W = TypeVar("_W", bound="PeriodicWatch")


class PeriodicWatch:
    """Calls `check()` every `interval_s` until stopped; a failing check is logged and the
    next one still runs."""

    #: The thread's name, also the log's name for a failed check.
    thread_name = "unskit-watch"

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Checks completed so far (a test waits on it rather than on the clock).
        self.checks = 0

    def start(self: _W) -> _W:
        """Starts the checks on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stops checking; an alarm stays as it is."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def check(self) -> None:
        """One check; the subclass's work."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.check()
            except Exception:  # the watch must outlive a bug in one check
                _log.exception("%s: check failed", self.thread_name)
