"""Hostile requests against real components on a real Mosquitto: echo, the camera-adapter,
the file-egress and the ethernet-ip adapter (sim backend) run in-process, a raw MQTT client
records every message on the broker, and a log recorder catches warnings and tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, sim
from tests.support.adapter import AdapterHarness, connected_client, framework_sections
from tests.support.logs import LogRecorder, recording_logs
from tests.support.mosquitto import Mosquitto
from tests.support.raw_mqtt import RawRecorder
from tests.support.servers import root_logging_restored, wait_until
from unskit import MessageBuilder
from unskit.cip.component import EthernetIpAdapter
from unskit.commands.inbox import CommandInbox
from unskit.commands.verbs import Scope
from unskit.config import ConfigLoader
from unskit.egress.component import FileEgress
from unskit.messaging import MessagingClient
from unskit.runtime.component import Runtime
from unskit.runtime.echo import EchoComponent


@dataclass
class Target:
    """A running component and, for each verb it serves, the topics its requests go to."""

    name: str
    runtime: Runtime
    #: (verb, topic) for every verb of the component; per instance for instance scope.
    verbs: list[tuple[str, str]]
    #: Sends a valid request and returns its reply body (raises if none comes).
    valid: Callable[[], Any]
    stop: Callable[[], None] = field(default=lambda: None)
    #: The command inbox (None for echo, which keeps its own subscription).
    inbox: CommandInbox | None = None


def inbox_verbs(runtime: Runtime, instance: str) -> list[tuple[str, str]]:
    """Every verb of the component's inbox, iterated from its verb table: component scope
    at the component topic, instance scope at the instance's, both-scope at both."""
    topics = runtime.topics
    pairs = []
    for verb in runtime.command_inbox().verbs():
        if verb.scope is not Scope.INSTANCE:
            pairs.append((verb.name, topics.topic("cmd", "sb", verb.name)))
        if verb.scope is not Scope.COMPONENT:
            pairs.append((verb.name, topics.topic("cmd", "sb", verb.name, instance=instance)))
    return pairs


def start_echo(broker: Mosquitto, folder: Path) -> Target:
    document = {"component": {}, **framework_sections(broker.plain_port, folder)}
    path = folder / "echo.json"
    path.write_text(json.dumps(document))
    loader = ConfigLoader(
        path, thing="gw", component_schema=EchoComponent.schema, default_component="echo"
    )
    runtime = Runtime(loader.load())
    runtime.start(EchoComponent(), loader)  # stops what it started if it fails
    topic = runtime.topics.topic("cmd", "sb", "echo")
    try:
        client = connected_client(broker.plain_port, request_timeout_s=5)
    except BaseException:
        runtime.shutdown()
        raise

    def valid() -> Any:
        request = MessageBuilder("Echo", "1").body({"ok": True}).build()
        return client.request(topic, request, timeout_secs=5).get(5).body

    def stop() -> None:
        client.close(1)
        runtime.shutdown()

    try:
        wait_until(lambda: _answers(valid), 10, "echo to answer")
    except BaseException:
        stop()
        raise

    return Target("echo", runtime, [("echo", topic)], valid, stop)


def _answers(valid: Callable[[], Any]) -> bool:
    try:
        valid()
    except Exception:
        return False
    return True


def start_camera(broker: Mosquitto, folder: Path) -> Target:
    harness = CameraHarness(broker, folder)
    rig = harness.start({"cameras": [sim("cam-1"), sim("cam-2")]})
    return Target(
        "camera-adapter",
        rig.runtime,
        inbox_verbs(rig.runtime, "cam-1"),
        lambda: rig.client.call("describe", timeout=5),
        harness.close,
        rig.runtime.command_inbox(),
    )


def start_egress(broker: Mosquitto, folder: Path) -> Target:
    harness = AdapterHarness(broker, folder)
    component = {
        "global": {"stateDir": str(folder / "egress-state")},
        "instances": [
            {
                "id": "line-1",
                "source": {"path": str(folder / "src"), "settleSeconds": 0},
                "egress": [{"id": "out", "type": "local", "path": str(folder / "out")}],
            }
        ],
    }
    adapter = harness.start(FileEgress, harness.document(component))
    return Target(
        "file-egress",
        adapter.runtime,
        inbox_verbs(adapter.runtime, "line-1"),
        lambda: adapter.client.call("describe", timeout=5),
        harness.close,
        adapter.runtime.command_inbox(),
    )


def start_cip(broker: Mosquitto, folder: Path) -> Target:
    harness = AdapterHarness(broker, folder)
    instance = {
        "id": "sim-1",
        "adapter": "sim",
        "connection": {"endpoint": "sim.local"},
        "pollGroups": [
            {
                "id": "slow",
                "pollIntervalMs": 1000,
                "signals": [{"name": "wave", "tagPath": "Wave", "type": "REAL"}],
            }
        ],
    }
    adapter = harness.start(EthernetIpAdapter, harness.document({"instances": [instance]}))
    return Target(
        "ethernet-ip-adapter",
        adapter.runtime,
        inbox_verbs(adapter.runtime, "sim-1"),
        lambda: adapter.client.call("describe", timeout=5),
        harness.close,
        adapter.runtime.command_inbox(),
    )


STARTERS: dict[str, Callable[[Mosquitto, Path], Target]] = {
    "echo": start_echo,
    "camera-adapter": start_camera,
    "file-egress": start_egress,
    "ethernet-ip-adapter": start_cip,
}


@pytest.fixture(scope="module", params=sorted(STARTERS))
def target(
    request: pytest.FixtureRequest,
    broker: Mosquitto,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Target]:
    """One component per module run (the hostile cases share it, as a real one would)."""
    name = request.param
    # A Runtime run in-process configures the root logger; it is put back afterwards.
    with root_logging_restored():
        started = STARTERS[name](broker, tmp_path_factory.mktemp(name))
        try:
            yield started
        finally:
            started.stop()


@pytest.fixture(scope="module")
def raw(broker: Mosquitto) -> Iterator[RawRecorder]:
    recorder = RawRecorder(broker.plain_port)
    yield recorder
    recorder.close()


@pytest.fixture(scope="module")
def requester(broker: Mosquitto) -> Iterator[MessagingClient]:
    client = connected_client(broker.plain_port, request_timeout_s=5)
    yield client
    client.close(1)


@pytest.fixture
def logs() -> Iterator[LogRecorder]:
    """The root logger's records during the test, and exceptions that escaped a thread."""
    with recording_logs() as recorder:
        yield recorder
