"""The stopping layer of `Runtime`: the shutdown it starts (readiness off, every subsystem
drained in order, the health server last), the drain steps it registers (the command inbox,
the component, held commands, heartbeat, publish watches, metrics, the stores), the stop of
a start-up that failed before the coordinator existed, and the main thread's wait for a stop
signal on the wakeup fd."""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading

from unskit.runtime.accessors import _Accessors
from unskit.runtime.app import ComponentApp

# How long messaging may take to flush QoS 1/2 publishes and drain handlers at shutdown.
DRAIN_TIMEOUT_S = 5.0


class _Stopping(_Accessors):
    """The stopping layer of `Runtime`: shutdown, the drain steps, the wait for a stop."""

    def shutdown(self) -> None:
        """Readiness off first, then every subsystem drains, the health server last."""
        if self._coordinator is not None:
            self._coordinator.shutdown()
        self._stopped.set()
        if self._wakeup is not None:
            with contextlib.suppress(OSError):
                self._wakeup.send(b"\0")

    def _stop_requested(self, signal_name: str) -> None:
        # Called by the signal handler: record only; the wakeup fd already woke the main thread.
        self._stop_signal = signal_name

    @property
    def shutting_down(self) -> bool:
        """True once shutdown has begun."""
        return self._stopped.is_set() or (
            self._coordinator is not None and self._coordinator.shutting_down
        )

    def _abandon(self) -> None:
        if self._messaging is not None:
            self._messaging.close(DRAIN_TIMEOUT_S)
        if self.health is not None:
            self.health.stop()
        if self.embedded_broker is not None:
            self.embedded_broker.stop()

    def _refuse_commands(self) -> None:
        if self._inbox is not None:
            self._inbox.stop_accepting()

    def _close_commands(self) -> None:
        if self._inbox is not None:
            self._inbox.close()

    def _close_command_store(self) -> None:
        if self._inbox is not None:
            self._inbox.close_store()

    def _drain_app(self, app: ComponentApp | None) -> None:
        if app is not None and self._app_started:
            app.drain()

    def _close_app(self, app: ComponentApp | None) -> None:
        close = getattr(app, "close", None)
        if close is not None and self._app_started:
            close()

    def _stop_publish_watch(self) -> None:
        if self.publish_watch is not None:
            self.publish_watch.stop(DRAIN_TIMEOUT_S)
        if self.outbox_watch is not None:
            self.outbox_watch.stop(DRAIN_TIMEOUT_S)

    def _stop_metrics(self) -> None:
        if self._reporter is not None:
            self._reporter.stop()

    def _stop_heartbeat(self) -> None:
        self._heartbeat_stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(DRAIN_TIMEOUT_S)

    def _wait_until_stopped(self) -> None:
        """Blocks until shutdown. The kernel may deliver SIGTERM to any thread, and then a
        plain Event.wait() in the main thread never returns to run the Python handler; the
        main thread therefore waits on the signal wakeup fd, which every signal writes to."""
        if threading.current_thread() is not threading.main_thread():
            self._stopped.wait()
            return
        receive, send = socket.socketpair()
        receive.setblocking(False)
        send.setblocking(False)
        self._wakeup = send
        previous = signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
        try:
            while not self._stopped.is_set():
                if self._stop_signal is not None:
                    self.shutdown()
                    break
                select.select([receive], [], [])
                with contextlib.suppress(BlockingIOError):
                    receive.recv(512)
        finally:
            signal.set_wakeup_fd(previous)
            self._wakeup = None
            receive.close()
            send.close()
