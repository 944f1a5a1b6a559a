"""The component's lifecycle state reported to the edge runtime (IPC UpdateState).

A recipe starts the component in its ``startup`` step: the nucleus then holds the component
in STARTING until the component itself reports RUNNING (a ``run`` step is RUNNING the moment
its process starts, and a reported RUNNING is refused as an invalid state). So RUNNING is
reported the first time the component's readiness turns on, and ERRORED when start-up fails
for good; the nucleus's dependants and deployments wait on exactly that.

Outside the edge runtime, or without the runtime's IPC variables, nothing is reported. A
report that fails is logged and never fatal: the component runs whether or not the runtime
heard, and the nucleus still sees the process exit.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping

from unskit.edge.connection import IpcConnection, IpcEndpoint, edge_error
from unskit.errors import EdgeRuntimeError

__all__ = ["LifecycleReporter", "LifecycleState", "report_failed_start"]

_log = logging.getLogger(__name__)

#: How long one UpdateState may take before it counts as failed.
REPORT_TIMEOUT_S = 5.0
#: How often the readiness watch asks the readiness predicate (it has no change event).
READINESS_POLL_S = 0.1


class LifecycleState(enum.Enum):
    """The states a component may report (awsiotsdk's model.ReportedLifecycleState)."""

    RUNNING = "RUNNING"
    ERRORED = "ERRORED"


class LifecycleReporter:
    """Reports this component's state over its own IPC connection, opened per report."""

    def __init__(
        self,
        endpoint: IpcEndpoint,
        connect: Callable[[IpcEndpoint], IpcConnection] = IpcConnection,
    ) -> None:
        self.endpoint = endpoint
        self._connect = connect
        self._lock = threading.Lock()
        self._reported: list[LifecycleState] = []

    @classmethod
    def for_component(
        cls, on_edge_runtime: bool, environ: Mapping[str, str] | None = None
    ) -> LifecycleReporter | None:
        """A reporter on the edge runtime when its IPC variables are set, else None."""
        if not on_edge_runtime:
            return None
        try:
            endpoint = IpcEndpoint.from_environment(environ)
        except EdgeRuntimeError as error:
            # UNSKIT_PLATFORM=EDGE_RUNTIME outside a nucleus: there is nobody to tell.
            _log.info("lifecycle state not reported: %s", error)
            return None
        return cls(endpoint)

    @property
    def reported(self) -> tuple[LifecycleState, ...]:
        """The states the runtime accepted, in order."""
        with self._lock:
            return tuple(self._reported)

    def report(self, state: LifecycleState) -> bool:
        """Reports `state` (UpdateState); True once the runtime accepted it. A failure is
        logged, never raised."""
        connection = self._connect(self.endpoint)
        try:
            connection.connect()
            future = connection.client.update_state_async(state=state.value)
            future.result(REPORT_TIMEOUT_S)
        except Exception as exc:
            error = edge_error(exc, "UpdateState", state.value)
            _log.warning(
                "lifecycle state %s not reported to the edge runtime: %s", state.value, error
            )
            return False
        finally:
            connection.close()
        with self._lock:
            self._reported.append(state)
        # ERRORED at WARNING: a start-up refused before logging was configured still says so.
        level = logging.INFO if state is LifecycleState.RUNNING else logging.WARNING
        _log.log(level, "lifecycle state %s reported to the edge runtime", state.value)
        return True

    def report_when_ready(
        self, is_ready: Callable[[], bool], stopping: Callable[[], bool]
    ) -> threading.Thread:
        """Reports RUNNING the first time `is_ready()` is true, from a daemon thread that ends
        then, or once `stopping()` is true (a component stopped before it was ever ready)."""

        def watch() -> None:
            wake = threading.Event()
            while not stopping():
                if is_ready():
                    self.report(LifecycleState.RUNNING)
                    return
                # Polled: readiness is a predicate over messaging, the gate and the parts.
                wake.wait(READINESS_POLL_S)

        thread = threading.Thread(target=watch, name="unskit-lifecycle", daemon=True)
        thread.start()
        return thread


def report_failed_start(on_edge_runtime: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Reports ERRORED when this process runs on the edge runtime; True when it was reported.
    For a start-up that failed before a configuration was resolved, e.g. one the loader
    refused."""
    reporter = LifecycleReporter.for_component(on_edge_runtime, environ)
    return reporter is not None and reporter.report(LifecycleState.ERRORED)
