"""No thread of a running component dies silently: the one mechanism every long-running
thread goes through.

`Supervisor.thread` runs a loop body on a daemon thread. An exception that escapes the body
is logged with its traceback, counted in ``runtime/threadFailures{thread}`` and the body is
run again after a jittered backoff that doubles per failure in a row (`RESTART_MIN_S` to
`RESTART_MAX_S`), until the thread is stopped; a body that returns has ended normally. Once
the component's events are attached, a failure also raises the component alarm
``thread-failed`` (warning; context: every thread in a failure streak with its last error),
cleared when each restarted thread has run `RESTART_MAX_S` without failing again (or ended). A
body given ``restart=False`` is not run again: its part is recorded as dead and the
component's readiness reports not ready while it is. A part that restarts on its own terms
(a southbound instance, with its reconnect backoff and its alarm) reports its failures
through `failed` and its state through a readiness check (`add_check`).

`Supervisor.problems` is what readiness asks (`Runtime` wires it into /readyz): the dead
parts and what every check reports, empty while the component is whole.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from unskit.runtime.events import Events, Severity
from unskit.runtime.metrics import Counter, MetricsRegistry

__all__ = [
    "RESTART_MAX_S",
    "RESTART_MIN_S",
    "RUNTIME_FAMILY",
    "THREAD_FAILED",
    "THREAD_FAILURES",
    "Supervisor",
]

_log = logging.getLogger(__name__)

#: The metric family of the runtime's own health, and its counter of failed thread passes.
RUNTIME_FAMILY = "runtime"
THREAD_FAILURES = "threadFailures"
#: Restart backoff of a supervised thread: the first window, and the ceiling it doubles to.
RESTART_MIN_S = 1.0
RESTART_MAX_S = 60.0
#: The component alarm raised while a supervised thread is in a failure streak.
THREAD_FAILED = "thread-failed"


class Supervisor:
    """Reports, counts and restarts a component's failed threads; tells readiness what is
    dead."""

    def __init__(
        self,
        metrics: MetricsRegistry | None = None,
        *,
        restart_min_s: float = RESTART_MIN_S,
        restart_max_s: float = RESTART_MAX_S,
        rng: random.Random | None = None,
    ) -> None:
        self._metrics = metrics
        self._restart_min_s = restart_min_s
        self._restart_max_s = restart_max_s
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._dead: dict[str, str] = {}
        self._checks: dict[str, Callable[[], str | None]] = {}
        self._alarms: Events | None = None
        # Threads in a failure streak: name -> their last error, until they settle.
        self._failing: dict[str, str] = {}

    def attach_alarms(self, alarms: Events) -> None:
        """From now on a failure raises ``thread-failed`` through `alarms` (the Events)."""
        with self._lock:
            self._alarms = alarms
            failing = dict(self._failing)
        if failing:
            self._announce(failing)

    # -- failures ---------------------------------------------------------------------------

    def failed(self, thread: str, error: BaseException, counter: Counter | None = None) -> None:
        """Logs a failure of `thread` with its traceback and counts it (in `counter`, else in
        ``runtime/threadFailures{thread}``)."""
        _log.error(
            "thread %s failed: %s: %s",
            thread,
            type(error).__name__,
            error,
            exc_info=(type(error), error, error.__traceback__),
        )
        if counter is None and self._metrics is not None:
            counter = self._metrics.counter(RUNTIME_FAMILY, THREAD_FAILURES, {"thread": thread})
        if counter is not None:
            counter.inc()

    def thread(
        self,
        name: str,
        body: Callable[[], None],
        stop: threading.Event,
        *,
        restart: bool = True,
    ) -> threading.Thread:
        """A daemon thread (not started) that runs `body` under supervision until it returns
        or `stop` is set."""
        return threading.Thread(
            target=self.run,
            args=(name, body, stop),
            kwargs={"restart": restart},
            name=name,
            daemon=True,
        )

    def run(
        self, name: str, body: Callable[[], None], stop: threading.Event, *, restart: bool = True
    ) -> None:
        """Runs `body` on the calling thread: again after the backoff when it raises (or, with
        `restart` False, marks `name` dead); returns when it returns or `stop` is set."""
        failures = 0
        settle: threading.Timer | None = None
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    body()
                    return
                except Exception as error:
                    if settle is not None:
                        settle.cancel()
                    self.failed(name, error)
                    self._streak(name, f"{type(error).__name__}: {error}")
                    if not restart:
                        self.mark_dead(name, f"{type(error).__name__}: {error}")
                        return
                failures = self._backoff(name, started, failures, stop)
                # The alarm clears once the restarted body has run a whole ceiling window.
                settle = threading.Timer(self._restart_max_s, self._settled, args=(name,))
                settle.daemon = True
                settle.start()
        finally:
            if settle is not None:
                settle.cancel()
            if restart:
                self._settled(name)

    def _backoff(self, name: str, started: float, failures: int, stop: threading.Event) -> int:
        # A body that ran a whole ceiling window before failing starts the backoff afresh.
        if time.monotonic() - started >= self._restart_max_s:
            failures = 0
        ceiling = min(self._restart_max_s, self._restart_min_s * 2 ** min(failures, 30))
        delay = self._rng.uniform(self._restart_min_s, ceiling)
        _log.warning("thread %s restarts in %.2f s", name, delay)
        stop.wait(delay)
        return failures + 1

    def _streak(self, name: str, error: str) -> None:
        with self._lock:
            self._failing[name] = error
            failing = dict(self._failing)
        self._announce(failing)

    def _settled(self, name: str) -> None:
        with self._lock:
            if self._failing.pop(name, None) is None or self._failing:
                return
            alarms = self._alarms
        if alarms is not None:
            self._try(lambda: alarms.clear_alarm(THREAD_FAILED))

    def _announce(self, failing: dict[str, str]) -> None:
        alarms = self._alarms
        if alarms is not None:
            context = {"threads": failing}
            self._try(lambda: alarms.raise_alarm(THREAD_FAILED, context, severity=Severity.WARNING))

    @staticmethod
    def _try(announce: Callable[[], object]) -> None:
        # The alarm is news about a failure; failing to publish it must not add another.
        try:
            announce()
        except Exception:
            _log.warning("the %s alarm could not be published", THREAD_FAILED, exc_info=True)

    # -- readiness --------------------------------------------------------------------------

    def mark_dead(self, part: str, reason: str) -> None:
        """Records a part as dead: readiness is off until `mark_alive(part)`."""
        with self._lock:
            self._dead[part] = reason

    def mark_alive(self, part: str) -> None:
        with self._lock:
            self._dead.pop(part, None)

    def add_check(self, name: str, check: Callable[[], str | None]) -> None:
        """A readiness check of a part: None while it is alive, else why it is not."""
        with self._lock:
            self._checks[name] = check

    def remove_check(self, name: str) -> None:
        with self._lock:
            self._checks.pop(name, None)

    def problems(self) -> list[str]:
        """What keeps the component from being ready: '<part>: <reason>' for every dead part
        and failing check; empty when whole."""
        with self._lock:
            found = [f"{part}: {reason}" for part, reason in self._dead.items()]
            checks = list(self._checks.items())
        for name, check in checks:
            try:
                reason = check()
            except Exception as error:  # a check that breaks reports the part as broken
                reason = f"its readiness check failed: {error}"
            if reason is not None:
                found.append(f"{name}: {reason}")
        return found
