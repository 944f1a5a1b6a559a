"""A whole component on the real nucleus with no `messaging` section: its local link is the
IPC bus. The nucleus runs `unskit run echo` in its `startup` step; a test process acting as
another component asks it over the bus (its verb) and hears its state messages."""

from __future__ import annotations

import json
import shlex
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.greengrass import THING_NAME, Harness, Nucleus, service_states
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.commands.client import CommandClient
from unskit.config.messaging import IpcConfig
from unskit.config.model import MessagingConfig
from unskit.envelope import Message
from unskit.messaging import MessagingClient

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
CALLER = "Caller"
ROOT = "uns"
DOCUMENT: dict[str, Any] = {
    "component": {},
    "topic": {"root": ROOT},
    "hierarchy": {"levels": ["site", "device"]},
    "identity": {"site": "plant-1"},
    "logging": {"level": "INFO"},
    "heartbeat": {"intervalSeconds": 1},
}


@server_fixture(scope="module")
def nucleus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nucleus]:
    folder = tmp_path_factory.mktemp("echo-ipc")
    config = folder / "echo.json"
    config.write_text(json.dumps(DOCUMENT))
    path = shlex.quote(f"{PROJECT / 'python'}:{PROJECT}")
    command = f"{shlex.quote(sys.executable)} -m unskit.cli run echo -c {shlex.quote(str(config))}"
    echo = {
        "version": "1.0.0",
        "lifecycle": {"startup": f"PYTHONPATH={path} exec {command}"},
        "configuration": {
            "accessControl": {
                "aws.greengrass.ipc.pubsub": {
                    "echo:pubsub:1": {
                        "operations": [
                            "aws.greengrass#PublishToTopic",
                            "aws.greengrass#SubscribeToTopic",
                        ],
                        "resources": [f"{ROOT}/*", "lib/reply-*"],
                    }
                }
            }
        },
    }
    # The same component under a recipe that forgot SubscribeToTopic.
    denied = json.loads(json.dumps(echo))
    policy = denied["configuration"]["accessControl"]["aws.greengrass.ipc.pubsub"]
    policy["echo:pubsub:1"]["operations"] = ["aws.greengrass#PublishToTopic"]
    runtime = Nucleus([Harness(CALLER)], services={"Echo": echo, "EchoDenied": denied}).start()
    yield runtime
    runtime.remove()


def caller(nucleus: Nucleus) -> MessagingClient:
    config = MessagingConfig(
        local=None,
        local_ipc=IpcConfig(client_id=f"caller-{uuid.uuid4().hex[:8]}"),
        request_timeout_seconds=5,
    )
    client = MessagingClient(config, environ=nucleus.component_env(CALLER)).start()
    assert client.wait_connected(15), "the caller's IPC link did not come up"
    return client


def answering(client: CommandClient) -> bool:
    try:
        client.call("echo", {}, timeout=1)
    except Exception:
        return False
    return True


def test_a_component_without_messaging_serves_over_the_ipc_bus(nucleus: Nucleus) -> None:
    wait_until(lambda: "RUNNING" in service_states(nucleus, "Echo"), 60, "Echo RUNNING")
    messaging = caller(nucleus)
    try:
        heard: list[tuple[str, Message]] = []
        lock = threading.Lock()

        def on_state(topic: str, message: Message) -> None:
            with lock:
                heard.append((topic, message))

        messaging.subscribe(f"{ROOT}/{THING_NAME}/echo/state/#", on_state)
        commands = CommandClient(messaging, "echo", THING_NAME, root=ROOT)
        wait_until(lambda: answering(commands), 30, "echo answering over IPC")
        assert commands.call("echo", {"value": 42}) == {"value": 42}
        # Its heartbeat (a state message) reaches another component on the bus.
        wait_until(lambda: bool(heard), 10, "a state message from echo")
        with lock:
            assert all(topic.startswith(f"{ROOT}/{THING_NAME}/echo/state/") for topic, _ in heard)
        assert "connected to the edge runtime" in nucleus.log("Echo")
    finally:
        messaging.close()


def test_a_missing_permission_is_named_and_keeps_the_component_from_running(
    nucleus: Nucleus,
) -> None:
    topic = f"{ROOT}/{THING_NAME}/echo/cmd/sb/echo"
    wait_until(
        lambda: f"SubscribeToTopic {topic}: access denied" in nucleus.log("EchoDenied"),
        60,
        "the refusal in the component's log",
    )
    # Readiness stays off: the nucleus never hears RUNNING (the healthy twin got there).
    wait_until(lambda: "RUNNING" in service_states(nucleus, "Echo"), 60, "Echo RUNNING")
    assert "RUNNING" not in service_states(nucleus, "EchoDenied")
    assert "lifecycle state RUNNING" not in nucleus.log("EchoDenied")
