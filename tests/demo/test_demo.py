"""`unskit demo` as a new user runs it: the whole stack for a bounded time, then the evidence
in its output and its folders."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.mosquitto import Mosquitto
from unskit.demo.plan import CAMERAS, OPCUA_INSTANCE, PLC, PUSH_INSTANCE

COMPONENTS = (
    "ethernet-ip-adapter",
    "opcua-adapter",
    "camera-adapter",
    "file-egress",
    "signal-recorder",
)
#: What the demo runs beside them: the OPC UA server the adapter subscribes to.
DEVICES = ("opcua-sim",)
CAPTURE = re.compile(
    r"^\S+\s+capture\s+(?P<camera>\S+)\s+(?P<id>cap_\w+)\s+(?P<bytes>\d+) bytes\s+"
    r"sha256 (?P<sha>[0-9a-f]+)$",
    re.MULTILINE,
)


def demo(output: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unskit.cli", "demo", "--output", str(output), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_runs_the_stack_and_delivers_every_capture(tmp_path: Path) -> None:
    output = tmp_path / "out"
    result = demo(output, "--duration", "20")
    text = result.stdout
    assert result.returncode == 0, text + result.stderr

    # Signal updates from the sim PLC.
    assert re.search(rf"^\S+\s+signal\s+{PLC}\s+spindle-speed = ", text, re.MULTILINE), text
    assert re.search(r"^  signals\s+[1-9]\d* updates", text, re.MULTILINE), text
    # From the class-1 connection to the target simulator.
    assert re.search(rf"^\S+\s+signal\s+{PUSH_INSTANCE}\s+stroke-count = ", text, re.MULTILINE), (
        text
    )
    # And from the OPC UA server the demo runs beside them.
    assert re.search(rf"^\S+\s+signal\s+{OPCUA_INSTANCE}\s+Temperature = ", text, re.MULTILINE), (
        text
    )

    # At least one capture per camera, each delivered with the announced SHA-256.
    captures = [m.groupdict() for m in CAPTURE.finditer(text)]
    assert {c["camera"] for c in captures} == set(CAMERAS), text
    delivered = output / "delivered"
    for capture in captures:
        (image,) = delivered.glob(f"{capture['camera']}/*/{capture['id']}.jpg")
        data = image.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        assert len(data) == int(capture["bytes"])
        assert digest.startswith(capture["sha"])
        # The sidecar, delivered beside it, carries the full digest the camera computed.
        sidecar = json.loads(image.with_suffix(".json").read_text())
        assert sidecar["image"]["sha256"] == digest
        # The egress archived the source rather than deleting it: the same bytes.
        relative = image.relative_to(delivered)
        assert (output / "archive" / relative).read_bytes() == data
    count = len(captures)
    assert f"delivered   {count} of {count} images verified by SHA-256" in text
    assert len(list(delivered.rglob("*.jpg"))) == count

    # The PLC's signals, recorded as Parquet and delivered beside the images.
    recorded = pq.read_table(sorted((delivered / "signals").rglob("*.parquet"))[0])
    assert recorded.num_rows > 0
    assert set(recorded.column("instance").to_pylist()) <= {PLC, PUSH_INSTANCE}
    assert set(recorded.column("component").to_pylist()) == {"ethernet-ip-adapter"}

    # Every component exited 0, after readiness went off first.
    for name in COMPONENTS:
        assert re.search(rf"^  exit\s+{name}: 0$", text, re.MULTILINE), text
        log = (output / "logs" / f"{name}.log").read_text()
        assert log.index("shutdown: readiness off") < log.index("shutdown: complete")
    # And the device, stopped after them.
    for name in DEVICES:
        assert re.search(rf"^  exit\s+{name}: 0$", text, re.MULTILINE), text

    # The generated configurations are kept, for running a component by hand.
    assert {p.stem for p in (output / "config").glob("*.json")} == set(COMPONENTS)


@pytest.mark.slow
def test_the_demo_can_use_an_existing_broker(broker: Mosquitto, tmp_path: Path) -> None:
    result = demo(tmp_path / "out", "--duration", "6", "--broker", f"127.0.0.1:{broker.plain_port}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"127.0.0.1:{broker.plain_port} (external)" in result.stdout
    assert re.search(rf"^\S+\s+signal\s+{PLC}\s+", result.stdout, re.MULTILINE)


@pytest.mark.integration
def test_a_folder_the_demo_did_not_write_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = demo(tmp_path, "--duration", "1")
    assert result.returncode == 1
    assert "not written by `unskit demo`" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["precious.txt"]


@pytest.mark.parametrize("option", ["--duration", "--output", "--port", "--broker"])
@pytest.mark.integration
def test_help_explains_the_options(option: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "unskit.cli", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert option in result.stdout


@pytest.mark.integration
def test_a_malformed_broker_address_is_a_usage_error(tmp_path: Path) -> None:
    result = demo(tmp_path / "out", "--broker", "localhost")
    assert result.returncode == 2
    assert "is not HOST:PORT" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("victim", ["camera-adapter", "file-egress"])
@pytest.mark.integration
def test_a_component_that_dies_stops_the_demo_with_exit_1(victim: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "unskit.cli", "demo", "--output", str(tmp_path / "out")]
    # --duration bounds the run should the kill not be noticed.
    process = subprocess.Popen(
        [*command, "--duration", "90"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line)
            if match := re.match(rf"^  {victim}\s+pid (\d+)", line):
                pid = int(match.group(1))
            if line.startswith("time "):
                os.kill(pid, signal.SIGKILL)
                break
        lines.extend(process.stdout)
        assert process.wait(60) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        process.stdout.close()
    text = "".join(lines)
    assert f"{victim} exited on its own (-9)" in text, text
    for name in COMPONENTS:
        code = -9 if name == victim else 0
        assert re.search(rf"^  exit\s+{name}: {code}$", text, re.MULTILINE), text


#: `unskit ARGV` with the modules in argv[1] (comma-separated) unimportable, as in an
#: environment without their extras (None in sys.modules: import raises, find_spec says None).
WITHOUT = (
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None\n"
    "from unskit.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


@pytest.mark.parametrize(
    ("blocked", "broker", "extras"),
    [
        pytest.param("asyncua", False, "opcua", id="no-asyncua"),
        pytest.param("amqtt", False, "embedded", id="no-amqtt"),
        pytest.param("amqtt,asyncua", False, "embedded,opcua", id="neither"),
        # An external broker: the embedded one's extra is not needed.
        pytest.param("amqtt,asyncua", True, "opcua", id="neither-external-broker"),
    ],
)
@pytest.mark.integration
def test_a_missing_extra_is_named_with_its_pip_command_before_anything_starts(
    tmp_path: Path, blocked: str, broker: bool, extras: str
) -> None:
    output = tmp_path / "out"
    argv = ["demo", "--output", str(output), "--duration", "30"]
    if broker:
        argv += ["--broker", "127.0.0.1:1"]
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT, blocked, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("unskit demo: needs "), line
    assert line.endswith(f"pip install 'unskit[{extras}]'"), line
    named = {module for module in ("amqtt", "asyncua") if f"'{module}'" in line}
    assert named == {NEEDS[extra] for extra in extras.split(",")}, line
    assert not output.exists(), "nothing started, nothing written"


#: The package each of the demo's extras brings that the demo needs.
NEEDS = {"embedded": "amqtt", "opcua": "asyncua"}
