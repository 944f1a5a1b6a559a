"""The demo never leaves a component behind: whichever way the supervisor ends (its output
pipe closed, SIGINT, SIGTERM, or SIGKILL, where the parent-death signal is the backstop),
no process of that demo is left running, as the process list shows."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

# Every test here runs real processes.
pytestmark = pytest.mark.integration

#: The component processes and the device (the OPC UA server) the demo runs beside them.
COMPONENTS = (
    "ethernet-ip-adapter",
    "opcua-adapter",
    "camera-adapter",
    "file-egress",
    "signal-recorder",
    "opcua-sim",
    "cip-target-sim",
)
#: Long enough that the demo never stops for its duration during a test.
DURATION = "120"
#: A component stopping with nobody to talk to still has a bounded drain.
SURVIVOR_DEADLINE_S = 30.0


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone between the listing and the read
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def survivors(output: Path) -> dict[int, str]:
    """Every running process (zombies excluded) whose command line names the demo's folder."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        command = _cmdline(pid)
        if str(output) in command and _state(pid) not in ("Z", "X", "gone"):
            found[pid] = command
    return found


def wait_for_no_survivors(output: Path) -> dict[int, str]:
    """Polls the process list until nothing of the demo runs, or the deadline; what is left."""
    deadline = time.monotonic() + SURVIVOR_DEADLINE_S
    left = survivors(output)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the process list; a foreign process has no event to wait on
        left = survivors(output)
    return left


@pytest.fixture
def output(tmp_path: Path) -> Iterator[Path]:
    """The demo's folder; whatever of that demo still runs afterwards is killed."""
    folder = tmp_path / "demo-output"
    yield folder
    for pid in survivors(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def demo_command(output: Path) -> list[str]:
    return [sys.executable, "-m", "unskit.cli", "demo", "--output", str(output)]


def read_until_live_view(stream: IO[str]) -> tuple[list[str], dict[str, int]]:
    """The lines up to the live view's header, and each component's pid from them."""
    lines: list[str] = []
    pids: dict[str, int] = {}
    for line in stream:
        lines.append(line)
        if match := re.match(r"^  (\S+)\s+pid (\d+)", line):
            pids[match.group(1)] = int(match.group(2))
        if line.startswith("time "):
            return lines, pids
    raise AssertionError("the demo ended before its live view:\n" + "".join(lines))


def test_a_reader_that_stops_reading_stops_the_demo(output: Path) -> None:
    # As a new user would: `unskit demo | head -3`.
    command = f"{shlex.join(demo_command(output))} --duration {DURATION} | head -3"
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=180, check=False
    )
    assert len(result.stdout.splitlines()) == 3, result.stdout + result.stderr
    # The supervisor stopped for the closed pipe, not for its duration, took every
    # component with it, and said nothing about the pipe.
    assert time.monotonic() - started < float(DURATION), result.stderr
    assert wait_for_no_survivors(output) == {}
    assert "Traceback" not in result.stderr, result.stderr
    assert "BrokenPipeError" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("sig", "close_output"),
    [
        pytest.param(signal.SIGINT, False, id="ctrl-c"),
        pytest.param(signal.SIGTERM, False, id="sigterm"),
        # Ctrl-C of `make demo | tee log`: tee dies with the same Ctrl-C.
        pytest.param(signal.SIGINT, True, id="ctrl-c-with-tee-gone"),
    ],
)
def test_a_stop_signal_stops_every_component(
    output: Path, tmp_path: Path, sig: signal.Signals, close_output: bool
) -> None:
    stderr = tmp_path / "stderr"
    with stderr.open("w") as errors:
        process = subprocess.Popen(
            [*demo_command(output), "--duration", DURATION],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    assert process.stdout is not None
    try:
        lines, pids = read_until_live_view(process.stdout)
        assert set(pids) == set(COMPONENTS)
        assert set(survivors(output)) >= set(pids.values())
        if close_output:
            process.stdout.close()
        process.send_signal(sig)
        if not close_output:
            lines.extend(process.stdout)
        code = process.wait(120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        process.stdout.close()
    assert wait_for_no_survivors(output) == {}
    assert "Traceback" not in stderr.read_text(), stderr.read_text()
    if not close_output:
        text = "".join(lines)
        assert code == 0, text + stderr.read_text()
        for name in COMPONENTS:
            assert re.search(rf"^  exit\s+{name}: 0$", text, re.MULTILINE), text


def test_the_components_die_with_a_killed_supervisor(output: Path) -> None:
    process = subprocess.Popen(
        [*demo_command(output), "--duration", DURATION],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    try:
        _, pids = read_until_live_view(process.stdout)
        running = survivors(output)
        assert set(running) >= set(pids.values()), running
        # SIGKILL leaves the supervisor no way to stop anything itself.
        process.kill()
        assert process.wait(10) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        process.stdout.close()
    assert wait_for_no_survivors(output) == {}
