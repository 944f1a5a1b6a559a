"""The supervised threads: a failure is logged with its traceback, counted and restarted
after a doubling backoff; a part that cannot restart is dead for readiness."""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time

import pytest
from tests.runtime.test_events import SCOPE, RecordingPublisher

from unskit.runtime.events import Events
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.supervision import RUNTIME_FAMILY, THREAD_FAILED, THREAD_FAILURES, Supervisor

pytestmark = pytest.mark.unit


class _Top(random.Random):
    """Jitter pinned to the top of each window, so the schedule is exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _failing(times: int, calls: list[float], done: threading.Event):
    def body() -> None:
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise RuntimeError(f"bug number {len(calls)}")
        done.set()

    return body


def test_a_failed_body_is_logged_counted_and_run_again_after_a_doubling_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = MetricsRegistry()
    supervisor = Supervisor(metrics, restart_min_s=0.02, restart_max_s=0.08, rng=_Top())
    calls: list[float] = []
    done, stop = threading.Event(), threading.Event()
    with caplog.at_level(logging.WARNING, "unskit.runtime.supervision"):
        thread = supervisor.thread("worker-1", _failing(4, calls, done), stop)
        thread.start()
        assert done.wait(10), "the fifth run (after four failures) never came"
        thread.join(5)
    assert not thread.is_alive(), "a body that returns ends the thread"
    counter = metrics.counter(RUNTIME_FAMILY, THREAD_FAILURES, {"thread": "worker-1"})
    assert counter.total == 4
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    for gap, window in zip(gaps, [0.02, 0.04, 0.08, 0.08], strict=True):
        assert gap >= window - 0.002, (gaps, "doubling, capped at the ceiling")
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 4
    assert "thread worker-1 failed: RuntimeError: bug number 1" in failures[0].getMessage()
    assert failures[0].exc_info is not None, "the traceback is logged"
    assert supervisor.problems() == [], "a restarted part is not dead"


def test_a_body_that_keeps_failing_ends_when_stopped() -> None:
    supervisor = Supervisor(restart_min_s=0.01, restart_max_s=0.02)
    calls: list[float] = []
    stop = threading.Event()
    thread = supervisor.thread("spinner", _failing(10**9, calls, threading.Event()), stop)
    thread.start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        stop.wait(0.01)
    assert len(calls) >= 3
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def test_a_part_that_may_not_restart_is_dead_until_marked_alive() -> None:
    metrics = MetricsRegistry()
    supervisor = Supervisor(metrics)
    calls: list[float] = []
    thread = supervisor.thread(
        "once", _failing(1, calls, threading.Event()), threading.Event(), restart=False
    )
    thread.start()
    thread.join(5)
    assert len(calls) == 1
    assert supervisor.problems() == ["once: RuntimeError: bug number 1"]
    assert metrics.counter(RUNTIME_FAMILY, THREAD_FAILURES, {"thread": "once"}).total == 1
    supervisor.mark_alive("once")
    assert supervisor.problems() == []


@pytest.mark.parametrize(
    ("check", "problem"),
    [
        (lambda: None, None),
        (lambda: "every instance failed", "instances: every instance failed"),
        (lambda: 1 / 0, "instances: its readiness check failed: division by zero"),
    ],
    ids=["alive", "dead", "broken-check"],
)
def test_readiness_checks_report_their_parts(check, problem) -> None:
    supervisor = Supervisor()
    supervisor.add_check("instances", check)
    assert supervisor.problems() == ([] if problem is None else [problem])
    supervisor.remove_check("instances")
    assert supervisor.problems() == []


def _alarm_states(publisher: RecordingPublisher) -> list[tuple[str, str, object]]:
    return [
        (topic.rsplit("/", 1)[-1], message.body["state"], message.body.get("context"))
        for topic, message in publisher.decoded()
    ]


def test_a_failure_raises_thread_failed_until_the_restarted_thread_has_run_a_window() -> None:
    publisher = RecordingPublisher()
    supervisor = Supervisor(restart_min_s=0.01, restart_max_s=0.3)
    supervisor.attach_alarms(Events(publisher, SCOPE))
    calls: list[float] = []
    done, stop = threading.Event(), threading.Event()
    release = threading.Event()

    def body() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("bug number 1")
        done.set()
        release.wait(30)  # the restarted body runs on, as a healthy loop does

    thread = supervisor.thread("worker-2", body, stop)
    thread.start()
    assert done.wait(10), "the body was not run again"
    states = _alarm_states(publisher)
    assert states[0] == (
        THREAD_FAILED,
        "raised",
        {"threads": {"worker-2": "RuntimeError: bug number 1"}},
    )
    deadline = time.monotonic() + 10
    while len(_alarm_states(publisher)) < 2 and time.monotonic() < deadline:
        stop.wait(0.01)
    assert [s[:2] for s in _alarm_states(publisher)] == [
        (THREAD_FAILED, "raised"),
        (THREAD_FAILED, "cleared"),
    ], "cleared once the restarted body had run a whole window"
    assert time.monotonic() - calls[1] >= 0.3 - 0.01
    release.set()
    thread.join(5)
    assert not thread.is_alive()


def test_a_part_that_may_not_restart_keeps_its_alarm() -> None:
    publisher = RecordingPublisher()
    supervisor = Supervisor(restart_min_s=0.01, restart_max_s=0.05)
    supervisor.attach_alarms(Events(publisher, SCOPE))
    stop = threading.Event()

    def body() -> None:
        raise OSError("inotify went away")

    thread = supervisor.thread("watcher", body, stop, restart=False)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
    assert [s[:2] for s in _alarm_states(publisher)] == [(THREAD_FAILED, "raised")]
    assert supervisor.problems() == ["watcher: OSError: inotify went away"]
