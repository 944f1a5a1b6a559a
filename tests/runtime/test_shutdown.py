"""Shutdown order, idempotency, failing drains, signal handlers, and a real SIGTERM."""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.tiers import server_fixture

from unskit.runtime.health import HealthConfig, HealthServer, ReadinessState
from unskit.runtime.shutdown import ShutdownCoordinator

HOST = "127.0.0.1"
CHILD = Path(__file__).with_name("shutdown_child.py")


def readyz(port: int) -> int:
    conn = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    finally:
        conn.close()


@server_fixture
def server() -> Iterator[HealthServer]:
    readiness = ReadinessState(lambda: True)
    health = HealthServer(HealthConfig(port=0), readiness, bind_host=HOST)
    health.start()
    yield health
    health.stop()


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    """Whatever a test does to SIGTERM/SIGINT, the process gets its handlers back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_order_readiness_then_drains_then_health_server(server):
    readiness = server._readiness
    port = server.port
    events: list[tuple[str, object]] = []
    coordinator = ShutdownCoordinator(readiness, server)
    for name in ("messaging", "commands", "egress"):
        coordinator.add_drain_step(
            name,
            lambda name=name: events.append(
                (name, (readiness.is_shutting_down(), server.running, readyz(port)))
            ),
        )
    coordinator.shutdown()
    # Every drain saw readiness already off and the server still answering 503.
    assert events == [
        ("messaging", (True, True, 503)),
        ("commands", (True, True, 503)),
        ("egress", (True, True, 503)),
    ]
    assert not server.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=5)
    assert coordinator.done


def test_steps_are_logged_in_order(server, caplog):
    coordinator = ShutdownCoordinator(server._readiness, server)
    coordinator.add_drain_step("messaging", lambda: None)
    coordinator.add_drain_step("commands", lambda: None)
    with caplog.at_level(logging.INFO, logger="unskit.runtime.shutdown"):
        coordinator.shutdown()
    messages = [r.getMessage() for r in caplog.records if r.name == "unskit.runtime.shutdown"]
    assert messages == [
        "shutdown: readiness off",
        "shutdown: draining messaging",
        "shutdown: draining commands",
        "shutdown: health server stopped",
        "shutdown: complete",
    ]


def test_failing_drain_step_does_not_stop_the_others(server, caplog):
    ran: list[str] = []

    def broken() -> None:
        ran.append("commands")
        raise RuntimeError("inbox stuck")

    coordinator = ShutdownCoordinator(server._readiness, server)
    coordinator.add_drain_step("messaging", lambda: ran.append("messaging"))
    coordinator.add_drain_step("commands", broken)
    coordinator.add_drain_step("egress", lambda: ran.append("egress"))
    with caplog.at_level(logging.INFO, logger="unskit.runtime.shutdown"):
        coordinator.shutdown()
    assert ran == ["messaging", "commands", "egress"]
    assert not server.running
    failed = [r for r in caplog.records if r.getMessage() == "shutdown: draining commands failed"]
    assert len(failed) == 1
    assert failed[0].levelno == logging.ERROR
    assert failed[0].exc_info is not None
    assert "inbox stuck" in str(failed[0].exc_info[1])


def test_shutdown_runs_once_from_two_threads_and_both_wait_for_it(server):
    entered = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def drain() -> None:
        calls.append(threading.get_ident())
        entered.set()
        release.wait(timeout=10)

    coordinator = ShutdownCoordinator(server._readiness, server)
    coordinator.add_drain_step("messaging", drain)
    returned: list[str] = []
    first = threading.Thread(target=lambda: (coordinator.shutdown(), returned.append("first")))
    second = threading.Thread(target=lambda: (coordinator.shutdown(), returned.append("second")))
    first.start()
    assert entered.wait(timeout=5)
    second.start()
    second.join(timeout=0.3)
    assert second.is_alive(), "a second shutdown() returned before the first finished"
    assert returned == []
    release.set()
    first.join(timeout=5)
    second.join(timeout=5)
    assert sorted(returned) == ["first", "second"]
    assert len(calls) == 1
    assert coordinator.done
    coordinator.shutdown()  # and a third, later, is a no-op
    assert len(calls) == 1


def test_shutdown_from_inside_a_drain_step_returns(server):
    coordinator = ShutdownCoordinator(server._readiness, server)
    ran: list[str] = []
    coordinator.add_drain_step("messaging", coordinator.shutdown)
    coordinator.add_drain_step("commands", lambda: ran.append("commands"))
    coordinator.shutdown()
    assert ran == ["commands"]
    assert coordinator.done


def test_drain_steps_cannot_be_added_once_shutdown_began():
    coordinator = ShutdownCoordinator()
    coordinator.shutdown()
    with pytest.raises(RuntimeError, match="late"):
        coordinator.add_drain_step("late", lambda: None)


def test_without_health_readiness_is_a_no_op_and_drains_still_run(caplog):
    ran: list[str] = []
    coordinator = ShutdownCoordinator()
    coordinator.add_drain_step("messaging", lambda: ran.append("messaging"))
    with caplog.at_level(logging.INFO, logger="unskit.runtime.shutdown"):
        coordinator.shutdown()
    assert ran == ["messaging"]
    assert "shutdown: health server stopped" not in caplog.messages


# --- signal handlers -----------------------------------------------------------------------


def _previous(signum: int, frame: object) -> None:
    raise AssertionError("the previous handler must not run while ours is installed")


def test_handlers_install_only_on_the_main_thread(saved_handlers, caplog):
    signal.signal(signal.SIGTERM, _previous)
    coordinator = ShutdownCoordinator()
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(coordinator.install_signal_handlers()))
    with caplog.at_level(logging.WARNING, logger="unskit.runtime.shutdown"):
        worker.start()
        worker.join(timeout=5)
    assert result == [False]
    assert signal.getsignal(signal.SIGTERM) is _previous
    assert any("main thread" in m for m in caplog.messages)

    assert coordinator.install_signal_handlers() is True
    assert signal.getsignal(signal.SIGTERM) == coordinator._on_signal
    assert signal.getsignal(signal.SIGINT) == coordinator._on_signal


def test_previous_handlers_are_restored_on_shutdown(saved_handlers):
    def previous_int(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, _previous)
    signal.signal(signal.SIGINT, previous_int)
    coordinator = ShutdownCoordinator()
    assert coordinator.install_signal_handlers()
    assert signal.getsignal(signal.SIGTERM) != _previous
    coordinator.shutdown()
    assert signal.getsignal(signal.SIGTERM) is _previous
    assert signal.getsignal(signal.SIGINT) is previous_int


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_flips_readiness_shuts_down_and_exits_zero(saved_handlers, server, signum):
    signal.signal(signum, _previous)
    exits: list[int] = []
    drained: list[tuple[bool, int]] = []
    readiness = server._readiness
    port = server.port
    coordinator = ShutdownCoordinator(readiness, server, exit_process=exits.append)
    coordinator.add_drain_step(
        "messaging", lambda: drained.append((readiness.is_shutting_down(), readyz(port)))
    )
    assert coordinator.install_signal_handlers()

    signal.raise_signal(signum)  # the handler runs on this (main) thread before this returns

    assert drained == [(True, 503)]
    assert exits == [0]
    assert coordinator.done
    assert not server.running
    assert signal.getsignal(signum) is _previous


def test_second_signal_during_the_drain_is_ignored(saved_handlers):
    exits: list[int] = []
    ran: list[str] = []
    coordinator = ShutdownCoordinator(exit_process=exits.append)

    def drain() -> None:
        signal.raise_signal(signal.SIGINT)
        ran.append("messaging")

    coordinator.add_drain_step("messaging", drain)
    coordinator.add_drain_step("commands", lambda: ran.append("commands"))
    assert coordinator.install_signal_handlers()
    signal.raise_signal(signal.SIGTERM)
    assert ran == ["messaging", "commands"]
    assert exits == [0]


# --- a real process and a real SIGTERM -----------------------------------------------------


def _read_lines(stream, sink: queue.Queue[str | None]) -> None:
    for line in stream:
        sink.put(line.rstrip("\n"))
    sink.put(None)


def _next_line(lines: queue.Queue[str | None], deadline: float) -> str:
    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
    if line is None:
        raise AssertionError("child closed stdout early")
    return line


def _poll(condition: Callable[[], bool], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if condition():
            return True
        threading.Event().wait(0.02)
    return False


@pytest.mark.integration
def test_sigterm_drains_with_readiness_off_and_exits_zero():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [sys.executable, str(CHILD)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 15
        first = _next_line(lines, deadline)
        assert first.startswith("PORT "), first
        port = int(first.split()[1])

        def ready() -> bool:
            try:
                return readyz(port) == 200
            except OSError:
                return False

        assert _poll(ready, deadline), "child never became ready"

        child.send_signal(signal.SIGTERM)
        assert _next_line(lines, deadline) == "DRAINING"
        during = readyz(port)  # the drain takes ~1 s; the server must still be up, saying 503

        # Keep probing until the process is gone: only 503s, then refusals.
        outcomes: list[object] = []
        while child.poll() is None and time.monotonic() < deadline:
            try:
                outcomes.append(readyz(port))
            except OSError as exc:
                outcomes.append(type(exc).__name__)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.02)
        assert _next_line(lines, deadline) == "DRAINED"
        code = child.wait(timeout=max(0.0, deadline - time.monotonic()))
        log = child.stderr.read() if child.stderr else ""
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()

    assert during == 503
    assert 200 not in outcomes
    assert all(
        o == 503 or o in ("ConnectionRefusedError", "ConnectionResetError") for o in outcomes
    )
    # Once refused, never served again.
    refused_at = [i for i, o in enumerate(outcomes) if o != 503]
    if refused_at:
        assert all(o != 503 for o in outcomes[refused_at[0] :])
    assert code == 0, log
    order = [
        "shutdown: SIGTERM received",
        "shutdown: readiness off",
        "shutdown: draining messaging",
        "shutdown: draining commands",
        "shutdown: health server stopped",
        "shutdown: complete",
    ]
    positions = [log.find(step) for step in order]
    assert -1 not in positions, log
    assert positions == sorted(positions), log
