"""The shipped example runs as is: `unskit run ethernet-ip-adapter -c
examples/ethernet-ip-adapter.json -t demo --broker HOST:PORT` publishes its sim signals and
exits 0 on SIGTERM."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

from tests.messaging.test_client import Inbox
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

EXAMPLE = Path(__file__).parents[2] / "examples" / "ethernet-ip-adapter.json"


def test_the_example_runs_as_is(broker: Mosquitto, tmp_path: Path) -> None:
    document = json.loads(EXAMPLE.read_text())
    instances = [entry["id"] for entry in document["component"]["instances"]]
    client = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=broker.plain_port, client_id=f"x-{uuid.uuid4().hex}"
            )
        ),
        persistent_session=False,
    ).start()
    try:
        wait_until(client.connected, 10, "the test client")
        inbox = Inbox()
        client.subscribe("uns/demo/ethernet-ip-adapter/+/data/#", inbox)
        args = ["-c", str(EXAMPLE), "-t", "demo", "--broker", f"127.0.0.1:{broker.plain_port}"]
        log = tmp_path / "adapter.log"
        with component_process("ethernet-ip-adapter", log, *args) as process:
            wait_until(
                lambda: {topic.split("/")[3] for topic, _ in inbox.items} == set(instances),
                30,
                "updates from every example instance",
            )
            # SIGTERM is handled (drain, exit 0) once start-up has finished.
            wait_until(lambda: b"ethernet-ip-adapter running" in log.read_bytes(), 30, "start-up")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
    finally:
        client.close(1)
    names = {message.header.name for _, message in inbox.items}
    assert names == {"SouthboundSignalUpdate"}
