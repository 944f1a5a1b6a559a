"""The inbox in a real component process: outcomes survive SIGKILL, an operation in flight
at the kill answers PREVIOUS_OUTCOME_UNKNOWN on retry; `unskit call` and its exit codes."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.commands.conftest import sample_document
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from unskit.commands import CommandClient
from unskit.commands.idempotency import journaled_states
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.errors import CommandError
from unskit.messaging import MessagingClient

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def sample_process(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "tests.commands.sample_component", "-c", str(config)]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*command, "-t", "gw"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


@pytest.fixture
def setup(broker: Mosquitto, tmp_path: Path) -> Iterator[tuple[Path, CommandClient]]:
    document = sample_document(broker.plain_port, tmp_path / "state", ["cam-1", "cam-2"])
    config = tmp_path / "sample.json"
    config.write_text(json.dumps(document))
    messaging = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(host="127.0.0.1", port=broker.plain_port, client_id="cli-test"),
            request_timeout_seconds=10,
        ),
        persistent_session=False,
    ).start()
    wait_until(messaging.connected, 10, "the test client")
    client = CommandClient(messaging, "sample", "gw", root=document["topic"]["root"])
    yield config, client
    messaging.close(1)


def answering(client: CommandClient) -> bool:
    try:
        client.call("ping", timeout=1)
    except Exception:
        return False
    return True


def pending_request_ids(state_dir: Path) -> set[str]:
    path = state_dir / "gw" / "sample" / "commands.journal"
    if not path.exists():
        return set()
    states = journaled_states(path)
    return {key.request_id for key, state in states.items() if state == "pending"}


def test_outcomes_survive_sigkill_and_lost_ones_are_unknown(setup, tmp_path) -> None:
    config, client = setup
    log = tmp_path / "sample.log"
    done_body = {"requestId": "done-1", "value": 3.5}
    lost_body = {"requestId": "lost-1", "durationMs": 600_000}
    with sample_process(config, log) as process:
        wait_until(lambda: answering(client), 30, "the component to answer")
        done = client.call("set-point", done_body, instance="cam-1", timeout=10)
        held = client.send("job", lost_body, instance="cam-2", timeout=30)
        # Committed as pending before the handler ran: the kill cannot lose the claim.
        wait_until(lambda: "lost-1" in pending_request_ids(tmp_path / "state"), 10, "the claim")
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    client.messaging.cancel_request(held)
    with sample_process(config, log) as process:
        wait_until(lambda: answering(client), 30, "the restarted component to answer")
        assert client.call("set-point", done_body, instance="cam-1", timeout=10) == done
        with pytest.raises(CommandError) as raised:
            client.call("job", lost_body, instance="cam-2", timeout=10)
        assert raised.value.code == "PREVIOUS_OUTCOME_UNKNOWN"
        # A new requestId runs as usual.
        fresh = client.call("job", {"requestId": "new-1"}, instance="cam-2", timeout=10)
        assert fresh["state"] == "SUCCEEDED"
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0


def unskit_call(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unskit.cli", "call", *args, "-c", str(config), "-t", "gw"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_unskit_call_exit_codes(setup, tmp_path) -> None:
    config, client = setup
    with sample_process(config, tmp_path / "sample.log") as process:
        wait_until(lambda: answering(client), 30, "the component to answer")
        ok = unskit_call(config, "ping", "--component", "sample")
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout) == {"pong": True}

        narrowed = unskit_call(config, "sb/status", "--component", "sample", "--instance", "cam-2")
        assert json.loads(narrowed.stdout) == {"instance": "cam-2", "paused": False}

        body = json.dumps({"requestId": "cli-1", "value": 5})
        mutated = unskit_call(
            config, "set-point", body, "--component", "sample", "--instance", "cam-1"
        )
        assert mutated.returncode == 0
        assert json.loads(mutated.stdout)["value"] == 5

        failed = unskit_call(
            config, "set-point", "{}", "--component", "sample", "--instance", "cam-1"
        )
        assert failed.returncode == 1
        assert failed.stderr.startswith("BAD_ARGS: ")
        assert "requestId" in failed.stderr
        assert failed.stdout == ""

        usage = unskit_call(config, "ping", "{not json", "--component", "sample")
        assert usage.returncode == 2
        assert "not JSON" in usage.stderr
        not_object = unskit_call(config, "ping", "[1]", "--component", "sample")
        assert not_object.returncode == 2

        timeout = unskit_call(config, "ping", "--component", "nobody", "--timeout", "0.5")
        assert timeout.returncode == 3, timeout.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0


def test_unskit_call_without_a_component_token_is_a_usage_error(setup) -> None:
    config, _ = setup
    result = unskit_call(config, "ping")
    assert result.returncode == 2
    assert "component" in result.stderr
