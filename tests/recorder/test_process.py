"""`unskit run signal-recorder` as a process: SIGKILL while recording leaves every closed
file readable and unchanged, a restart sets the dead run's open file aside and corrupts
nothing, SIGTERM closes the open files; and the shipped example runs as is."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.recorder.conftest import data_topic, read_with_duckdb, read_with_pyarrow, update
from tests.support.adapter import connected_client, framework_sections
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until
from unskit.commands import CommandClient
from unskit.errors import UnskitError
from unskit.messaging import MessagingClient
from unskit.topics import TopicScope

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "examples" / "signal-recorder.json"
T0 = 1_795_000_000_000


def _status(client: CommandClient) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = client.call("status", timeout=2)
    except UnskitError:
        return None
    return status


def _publish(messaging: MessagingClient, root: str, start: int, count: int, device: str = "gw"):
    for seq in range(start, start + count):
        sample = {"value": seq, "source_timestamp_ms": T0 + seq, "server_timestamp_ms": T0 + seq}
        messaging.publish(data_topic(root, "seq", device=device), update("seq", [sample], device))


def _digests(output: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in output.rglob("*.parquet")}


@pytest.mark.slow
def test_sigkill_keeps_closed_files_and_a_restart_corrupts_nothing(
    broker: Mosquitto, tmp_path: Path
):
    output = tmp_path / "out"
    document = framework_sections(broker.plain_port, tmp_path)
    root = document["topic"]["root"]
    document["component"] = {
        "output": {"path": str(output)},
        "roll": {"maxRows": 50},
        "rowGroupRows": 10,
    }
    config = tmp_path / "recorder.json"
    config.write_text(json.dumps(document))
    messaging = connected_client(broker.plain_port)
    client = CommandClient.for_scope(messaging, TopicScope(root, "rec", "signal-recorder"))
    args = ("-c", str(config), "-t", "rec")
    try:
        with component_process("signal-recorder", tmp_path / "first.log", *args) as process:
            wait_until(lambda: _status(client) is not None, 30, "the recorder to answer")
            _publish(messaging, root, 0, 175)  # 3 files of 50 closed, 25 rows open
            wait_until(lambda: _status(client)["samplesAccepted"] == 175, 30, "175 samples")
            status = _status(client)
            assert status["filesClosed"] == 3
            assert status["openFiles"] == 1
            before = _digests(output)
            assert len(before) == 3
            process.send_signal(signal.SIGKILL)
            assert process.wait(10) == -signal.SIGKILL
        # Every closed file is as it was and reads back whole; the open one is only a .tmp.
        assert _digests(output) == before
        assert sorted(r[4] for r in read_with_pyarrow(output)) == list(range(150))
        assert sorted(r[4] for r in read_with_duckdb(output)) == list(range(150))
        (tmp,) = output.rglob(".*.parquet.tmp")

        with component_process("signal-recorder", tmp_path / "second.log", *args) as process:
            wait_until(lambda: _status(client) is not None, 30, "the restarted recorder")
            # The dead run's open file is set aside: no reader and no egress takes it.
            assert not tmp.exists()
            assert tmp.with_name(tmp.name.replace(".tmp", ".abandoned")).exists()
            assert _digests(output) == before
            _publish(messaging, root, 1000, 30)
            wait_until(lambda: _status(client)["samplesAccepted"] >= 30, 30, "30 more samples")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, (tmp_path / "second.log").read_text()
        assert list(output.rglob(".*.parquet.tmp")) == []  # flushOnStop closed the open file
        after = _digests(output)
        assert {p: after[p] for p in before} == before
        values = sorted(r[4] for r in read_with_duckdb(output))
        assert values == list(range(150)) + list(range(1000, 1030))
        for path in after:
            pq.ParquetFile(path).read()
    finally:
        messaging.close(1)


def test_the_example_runs_as_is(broker: Mosquitto, tmp_path: Path):
    document = json.loads(EXAMPLE.read_text())
    output = Path(document["component"]["output"]["path"])
    device = f"t{uuid.uuid4().hex[:8]}"  # this run's partition in a shared /tmp folder
    log = tmp_path / "example.log"
    messaging = connected_client(broker.plain_port)
    client = CommandClient.for_scope(messaging, TopicScope("uns", "demo", "signal-recorder"))
    args = ("-c", str(EXAMPLE), "-t", "demo", "--broker", f"127.0.0.1:{broker.plain_port}")
    try:
        with component_process("signal-recorder", log, *args) as process:
            wait_until(lambda: _status(client) is not None, 30, "the example to answer")
            _publish(messaging, "uns", 0, 20, device=device)
            wait_until(lambda: _status(client)["samplesAccepted"] >= 20, 30, "20 samples")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
    finally:
        messaging.close(1)
    files = [p for p in output.rglob("*.parquet") if f"device={device}" in str(p)]
    assert len(files) == 1
    assert sorted(pq.read_table(files[0]).column("value_int64").to_pylist()) == list(range(20))


#: `unskit` with pyarrow unimportable (None in sys.modules: `import pyarrow` raises
#: ImportError and find_spec reports it missing), as in an environment without the extra.
WITHOUT_PYARROW = (
    "import sys; sys.modules['pyarrow'] = None; from unskit.cli import main; sys.exit(main())"
)


@pytest.mark.parametrize("command", ["validate", "run"])
def test_without_pyarrow_run_refuses_like_validate_with_the_pip_line(
    broker: Mosquitto, tmp_path: Path, command: str
):
    document = framework_sections(broker.plain_port, tmp_path)
    document["component"] = {"output": {"path": str(tmp_path / "out")}}
    config = tmp_path / "recorder.json"
    config.write_text(json.dumps(document))
    args = ["-c", str(config), "-t", "rec"]
    argv = ["validate", *args, "--component", "signal-recorder"]
    if command == "run":
        argv = ["run", "signal-recorder", *args]
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYARROW, *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    [line] = [x for x in output.splitlines() if "pip install" in x]
    assert "$.component: the signal-recorder (Parquet) needs the 'pyarrow' package" in line, line
    assert line.endswith("pip install 'unskit[recorder]'"), line
    assert not list((tmp_path / "out").rglob("*")), "nothing recorded"
