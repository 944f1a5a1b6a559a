"""Shutdown order: readiness answers 503 first, then subsystems drain, the health server last.

:class:`ShutdownCoordinator` owns that order for app-driven shutdown and for SIGTERM/SIGINT
(Python variant: handlers are installed on the main thread only, the handler flips readiness,
shuts down and exits 0, and the previous handlers are restored on shutdown). A coordinator
given `on_signal` leaves the drain to its owner: the handler runs in whatever frame the
signal interrupted, which may hold a lock a drain step waits for (see `_on_signal`).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from unskit.runtime.health import HealthServer, ReadinessState

__all__ = ["ShutdownCoordinator"]

_log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_Handler = Callable[[int, FrameType | None], Any] | int | None


class ShutdownCoordinator:
    """Runs the shutdown order once: readiness off, drain steps in order, health server last."""

    def __init__(
        self,
        readiness: ReadinessState | None = None,
        health_server: HealthServer | None = None,
        *,
        exit_process: Callable[[int], object] = sys.exit,
        on_signal: Callable[[str], object] | None = None,
    ) -> None:
        self._readiness = readiness
        self._health_server = health_server
        self._exit_process = exit_process
        self._on_signal_hook = on_signal
        self._lock = threading.Lock()
        self._steps: list[tuple[str, Callable[[], object]]] = []
        # Thread id of the shutdown in progress; set once, never cleared.
        self._owner: int | None = None
        self._done = threading.Event()
        self._previous_handlers: dict[signal.Signals, _Handler] = {}

    def add_drain_step(self, name: str, step: Callable[[], object], *, first: bool = False) -> None:
        """Registers a subsystem's drain; steps run in registration order (`first` puts
        this one ahead of those already registered)."""
        with self._lock:
            if self._owner is not None:
                raise RuntimeError(f"cannot add drain step {name!r}: shutdown has begun")
            if first:
                self._steps.insert(0, (name, step))
            else:
                self._steps.append((name, step))

    @property
    def shutting_down(self) -> bool:
        """True once shutdown has begun."""
        return self._owner is not None

    @property
    def done(self) -> bool:
        """True once every step has run and the health server has stopped."""
        return self._done.is_set()

    def shutdown(self) -> None:
        """Runs the shutdown order once; other callers wait for it to finish, re-entry returns."""
        with self._lock:
            owner = self._owner
            if owner is None:
                self._owner = threading.get_ident()
        if owner is not None:
            # Readiness is already off; saying so again costs nothing and keeps the promise.
            if self._readiness is not None:
                self._readiness.set_shutting_down()
            # A drain step calling shutdown() would wait for itself.
            if owner != threading.get_ident():
                self._done.wait()
            return
        try:
            self._run()
        finally:
            self._done.set()

    def _run(self) -> None:
        if self._readiness is not None:
            self._readiness.set_shutting_down()
        _log.info("shutdown: readiness off")
        with self._lock:
            steps = list(self._steps)
        for name, step in steps:
            _log.info("shutdown: draining %s", name)
            try:
                step()
            except Exception:
                # One subsystem failing to drain must not keep the others from draining.
                _log.exception("shutdown: draining %s failed", name)
        if self._health_server is not None:
            self._health_server.stop()
            _log.info("shutdown: health server stopped")
        self.restore_signal_handlers()
        _log.info("shutdown: complete")

    def install_signal_handlers(self) -> bool:
        """Installs SIGTERM/SIGINT handlers; only on the main thread (elsewhere a logged no-op)."""
        if threading.current_thread() is not threading.main_thread():
            _log.warning("signal handlers not installed: not on the main thread")
            return False
        with self._lock:
            if self._previous_handlers:
                return True
            if self._owner is not None:
                _log.warning("signal handlers not installed: shutdown has begun")
                return False
            for signum in _SIGNALS:
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        _log.debug("signal handlers installed for SIGTERM and SIGINT")
        return True

    def restore_signal_handlers(self) -> None:
        """Puts back the handlers saved by install_signal_handlers (main thread only)."""
        with self._lock:
            previous = dict(self._previous_handlers)
            if not previous:
                return
            if threading.current_thread() is not threading.main_thread():
                # signal.signal() works on the main thread only; ours stays and, with
                # shutdown done, a later signal just exits 0.
                _log.debug("signal handlers left installed: shutdown ran off the main thread")
                return
            self._previous_handlers.clear()
        for signum, handler in previous.items():
            # None: the previous handler was not installed from Python; the default stands in.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        _log.debug("previous signal handlers restored")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._owner == threading.get_ident() and not self._done.is_set():
            # Raised inside our own drain on this thread: let the drain finish.
            _log.info("shutdown: %s received again during shutdown; ignored", name)
            return
        _log.info("shutdown: %s received", name)
        if self._readiness is not None:
            self._readiness.set_shutting_down()
        if self._on_signal_hook is not None:
            # Draining here could deadlock: the interrupted frame may hold a logging handler's
            # lock while a drain step joins a thread that is waiting to log.
            self._on_signal_hook(name)
            return
        self.shutdown()
        self._exit_process(0)
