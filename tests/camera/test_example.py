"""The shipped example runs as is: `unskit run camera-adapter -c examples/camera-adapter.json
-t demo --broker HOST:PORT` captures on its schedule and on command, and exits 0 on SIGTERM."""

from __future__ import annotations

import hashlib
import json
import signal
import uuid
from pathlib import Path

import pytest

from tests.support.adapter import Inbox, inbox_answers
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until
from unskit.commands import CommandClient
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

EXAMPLE = Path(__file__).parents[2] / "examples" / "camera-adapter.json"


@pytest.mark.slow
def test_the_example_runs_as_is(
    broker: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = json.loads(EXAMPLE.read_text())
    cameras = [entry["instance"] for entry in document["component"]["cameras"]]
    # The example keeps its catalog and images under the state directory.
    monkeypatch.setenv("UNSKIT_STATE_DIR", str(tmp_path / "state"))
    client = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=broker.plain_port, client_id=f"x-{uuid.uuid4().hex}"
            ),
            request_timeout_seconds=30,
        ),
        persistent_session=False,
    ).start()
    try:
        wait_until(client.connected, 10, "the test client")
        seen = Inbox()
        client.subscribe("uns/demo/camera-adapter/#", seen.add)
        args = ["-c", str(EXAMPLE), "-t", "demo", "--broker", f"127.0.0.1:{broker.plain_port}"]
        log = tmp_path / "camera.log"
        with component_process("camera-adapter", log, *args) as process:
            wait_until(lambda: b"camera-adapter running" in log.read_bytes(), 30, "start-up")
            commands = CommandClient(client, "camera-adapter", "demo")
            # "running" can come before the broker's SUBACK of the inbox, and a request sent
            # before that is dropped by the broker: wait until the inbox answers.
            wait_until(lambda: inbox_answers(commands), 30, "the inbox")
            group = commands.call(
                "capture-group", {"requestId": "demo-1", "instances": cameras}, timeout=30
            )
            assert group["state"] == "COMPLETED"
            for member in group["members"]:
                image = Path(member["image"]["absolutePath"])
                assert image.is_relative_to(tmp_path / "state")
                assert hashlib.sha256(image.read_bytes()).hexdigest() == member["image"]["sha256"]
            # The PTZ camera moves, and lists its configured presets.
            ptz = {"requestId": "demo-2", "operation": "absolute", "position": {"pan": 0.5}}
            assert commands.call("ptz", ptz, instance="yard-ptz", timeout=30)["state"] == (
                "COMMANDED"
            )
            presets = commands.call(
                "ptz-presets", {"operation": "list"}, instance="yard-ptz", timeout=30
            )["presets"]
            assert [p["name"] for p in presets] == ["gate", "dock"]
            wait_until(
                lambda: any(
                    t.endswith("/line-1-top/app/image/captured")
                    and m.body["trigger"]["type"] == "schedule"
                    for t, m in seen.messages
                ),
                20,
                "a scheduled capture",
            )
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
    finally:
        client.close(1)
