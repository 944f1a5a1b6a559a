"""scripts/install-system-deps waits, bounded, for a package lock another install holds.

The real locks are never touched: the script is sourced (which only defines its functions)
with its lock list pointed at a file of the test's, locked the way apt and dpkg lock theirs
(fcntl), and only the wait runs; no apt-get, no change to the machine's package state.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every test here runs real processes.
pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install-system-deps"
HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def wait_for_lock(lock: Path, timeout: int) -> subprocess.Popen[str]:
    """The script's wait_for_package_locks over `lock` alone, then `done`."""
    # A guard, should sourcing ever run the install: apt-get and sudo fail loudly.
    guard = lock.parent / "guard-bin"
    guard.mkdir(exist_ok=True)
    for name in ("apt-get", "sudo"):
        (guard / name).write_text(f"#!/bin/sh\necho '{name} must not run' >&2\nexit 97\n")
        (guard / name).chmod(0o755)
    command = (
        f"source {shlex.quote(str(SCRIPT))}; APT_LOCKS=({shlex.quote(str(lock))}); "
        f"LOCK_TIMEOUT={timeout}; wait_for_package_locks; echo done"
    )
    return subprocess.Popen(
        ["bash", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PATH": f"{guard}:{os.environ['PATH']}"},
    )


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    lock = tmp_path / "lock-frontend"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    yield lock, holder
    if holder.poll() is None:
        holder.kill()
    holder.wait(10)
    for pipe in (holder.stdin, holder.stdout):
        if pipe is not None:
            pipe.close()


def test_a_held_lock_is_waited_for_and_said_so(held_lock) -> None:
    lock, holder = held_lock
    waiter = wait_for_lock(lock, 60)
    try:
        assert waiter.stdout is not None
        said = waiter.stdout.readline()
        assert said.startswith(f"waiting up to 60s for the package lock held by {holder.pid} "), (
            said
        )
        assert waiter.poll() is None  # still waiting while the lock is held
        assert holder.stdin is not None
        holder.stdin.close()  # the other install finishes
        assert waiter.stdout.readline() == "done\n"
        assert waiter.wait(10) == 0
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(10)
        for pipe in (waiter.stdout, waiter.stderr):
            if pipe is not None:
                pipe.close()


def test_the_wait_is_bounded(held_lock) -> None:
    lock, holder = held_lock
    started = time.monotonic()
    waiter = wait_for_lock(lock, 2)
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode != 0
    assert "done" not in out
    assert f"still held by {holder.pid} " in err
    assert "after 2s" in err
    assert time.monotonic() - started < 20


def test_a_free_lock_costs_no_wait(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    waiter = wait_for_lock(lock, 60)
    out, err = waiter.communicate(timeout=30)
    assert (waiter.returncode, out, err) == (0, "done\n", "")
