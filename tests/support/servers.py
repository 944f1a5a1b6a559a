"""Starting real servers for tests: free loopback ports, readiness by polling with a deadline."""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _port_range() -> range:
    """This process's share of the ports below the kernel's ephemeral range.

    Ports from bind(0) come from the ephemeral range, where two calls (or two xdist workers)
    can be handed the same port before either server binds it, and where a restarted server
    can find its port taken by some outgoing connection. Below that range the kernel never
    hands a port out by itself; each worker takes a slice of its own."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = max(1024, low - 16_000)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    share = (low - first) // max(workers, 1)
    return range(first + index * share, first + (index + 1) * share)


_PORTS = _port_range()
_next_port = random.randrange(len(_PORTS))


def free_port() -> int:
    """A TCP port on 127.0.0.1, free now, handed out by no other call lately, and safe for a
    server restarted on it (no outgoing connection takes it meanwhile)."""
    global _next_port
    for _ in range(len(_PORTS)):
        port = _PORTS[_next_port % len(_PORTS)]
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {_PORTS}")


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.01
) -> None:
    """Polls `condition` until it holds; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """A TCP connect that sends nothing (binary servers log junk on a stray newline)."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def readyz(port: int) -> int | None:
    """The status of GET /readyz on 127.0.0.1, or None while nothing listens."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def require_binary(name: str) -> str:
    """The path of an installed server binary; in CI its absence fails the test run."""
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise RuntimeError(
            f"{name} is not installed: run `make test` (scripts/install-system-deps)"
        )
    return path


@contextlib.contextmanager
def component_process(name: str, log_path: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`unskit run NAME ARGS` with its output in `log_path`; killed if still alive after."""
    command = [sys.executable, "-m", "unskit.cli", "run", name, *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


@contextlib.contextmanager
def root_logging_restored() -> Iterator[None]:
    """Puts the root logger's handlers and level back as they were (a Runtime run in-process
    configures logging)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


def terminate(process: subprocess.Popen[Any] | None, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL when `process` has not exited after `grace_s`; reaps it."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace_s)
