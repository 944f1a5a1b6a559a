"""Fixtures for the inbox tests: the sample component on a real Mosquitto, and a client."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.commands.sample_component import SampleComponent
from tests.support.adapter import connected_client, inbox_answers
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.commands import CommandClient
from unskit.config import ConfigLoader
from unskit.messaging import MessagingClient
from unskit.runtime.component import Runtime


def sample_document(broker_port: int, state_dir: Path, instances: list[str]) -> dict[str, Any]:
    return {
        "component": {"instances": [{"id": name} for name in instances]},
        "hierarchy": {"levels": ["site", "device"]},
        "identity": {"site": "plant-1"},
        "topic": {"root": f"t{uuid.uuid4().hex[:8]}"},
        "messaging": {"local": {"host": "127.0.0.1", "port": broker_port}},
        "commands": {"stateDir": str(state_dir)},
        "heartbeat": {"enabled": False},
        "metricEmission": {"enabled": False},
        "health": {"enabled": False},
    }


@dataclass
class Sample:
    runtime: Runtime
    app: SampleComponent
    client: CommandClient
    config_path: Path


@server_fixture
def start_sample(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[Callable[..., Sample]]:
    """Starts the sample component in-process with a loader (so reload-config works) and a
    CommandClient addressing it; everything is stopped after the test."""
    runtimes: list[Runtime] = []
    clients: list[MessagingClient] = []

    def start(instances: list[str] | None = None, document: dict[str, Any] | None = None) -> Sample:
        if document is None:
            names = ["cam-1", "cam-2"] if instances is None else instances
            document = sample_document(broker.plain_port, tmp_path / "state", names)
        path = tmp_path / f"sample-{len(runtimes)}.json"
        path.write_text(json.dumps(document))
        loader = ConfigLoader(
            path, thing="gw", component_schema=SampleComponent.schema, default_component="sample"
        )
        runtime = Runtime(loader.load())
        app = SampleComponent()
        runtimes.append(runtime)
        runtime.start(app, loader)
        wait_until(runtime.get_messaging().connected, 10, "the component to connect")
        messaging = connected_client(broker.plain_port, request_timeout_s=10)
        clients.append(messaging)
        client = CommandClient.for_scope(messaging, runtime.topics)
        # The inbox's subscriptions are live once describe answers.
        wait_until(lambda: inbox_answers(client), 10, "the inbox to answer")
        return Sample(runtime, app, client, path)

    yield start
    for messaging in clients:
        messaging.close(1)
    for runtime in runtimes:
        runtime.shutdown()


@server_fixture
def start_sample_once(start_sample: Callable[..., Sample]) -> Sample:
    """One sample component for a whole hypothesis run."""
    return start_sample()
