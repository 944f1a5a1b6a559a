"""The shipped examples run: `unskit run ethernet-ip-adapter -c
examples/ethernet-ip-adapter.json -t demo --broker HOST:PORT` publishes its sim signals and
exits 0 on SIGTERM; the push example does the same against the class-1 target simulator."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

from tests.messaging.test_client import Inbox
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until
from unskit.cip.target_sim import CipTargetSim
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

EXAMPLE = Path(__file__).parents[2] / "examples" / "ethernet-ip-adapter.json"


def _client(broker: Mosquitto) -> MessagingClient:
    client = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=broker.plain_port, client_id=f"x-{uuid.uuid4().hex}"
            )
        ),
        persistent_session=False,
    ).start()
    wait_until(client.connected, 10, "the test client")
    return client


def test_the_example_runs_as_is(broker: Mosquitto, tmp_path: Path) -> None:
    document = json.loads(EXAMPLE.read_text())
    instances = [entry["id"] for entry in document["component"]["instances"]]
    client = _client(broker)
    try:
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


PUSH_EXAMPLE = EXAMPLE.with_name("ethernet-ip-adapter-push.json")


def test_the_push_example_runs_against_the_target_simulator(
    broker: Mosquitto, tmp_path: Path
) -> None:
    document = json.loads(PUSH_EXAMPLE.read_text())
    (instance,) = document["component"]["instances"]
    with CipTargetSim() as sim:
        sim.animate(instance["io"]["assemblies"]["input"], period_ms=50)
        # The one change: the simulator listens on a free port, not 44818.
        instance["connection"]["endpoint"] = f"127.0.0.1:{sim.tcp_port}"
        config = tmp_path / "push.json"
        config.write_text(json.dumps(document))
        client = _client(broker)
        try:
            inbox = Inbox()
            client.subscribe("uns/demo/ethernet-ip-adapter/press-io/data/#", inbox)
            args = ["-c", str(config), "-t", "demo", "--broker", f"127.0.0.1:{broker.plain_port}"]
            log = tmp_path / "adapter.log"
            with component_process("ethernet-ip-adapter", log, *args) as process:
                wait_until(
                    lambda: (
                        {topic.rsplit("/", 1)[1] for topic, _ in inbox.items}
                        >= {"stroke-count", "ram-force", "guard-closed", "lube-ok"}
                    ),
                    30,
                    "every input field of the example",
                )
                wait_until(lambda: b"ethernet-ip-adapter running" in log.read_bytes(), 30, "up")
                process.send_signal(signal.SIGTERM)
                assert process.wait(30) == 0, log.read_text()
        finally:
            client.close(1)
        assert [c.state for c in sim.connections()] == ["closed"], "Forward Close on stop"
