"""The sim southbound component in-process on a real Mosquitto, with a client."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.southbound.sim_component import SimComponent, Switch, SwitchedDriver
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from unskit.commands import CommandClient
from unskit.config import ConfigLoader
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.envelope import Message
from unskit.messaging import MessagingClient
from unskit.runtime.component import Runtime


def real_signal(name: str, **settings: Any) -> dict[str, Any]:
    return {"id": f"Program:Main.{name}", "name": name, "type": "REAL", **settings}


def instance(instance_id: str, *signals: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {
        "id": instance_id,
        "groups": [{"id": "fast", "intervalMs": 20, "signals": list(signals)}],
        **settings,
    }


def document(broker_port: int, tmp_path: Path, instances: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "component": {
            "instances": instances,
            "timing": {
                "reconnect_backoff_min_ms": 20,
                "reconnect_backoff_max_ms": 100,
                "keepalive_probe_interval_ms": 30,
            },
        },
        "hierarchy": {"levels": ["site", "device"]},
        "identity": {"site": "plant-1"},
        "topic": {"root": f"t{uuid.uuid4().hex[:8]}"},
        "messaging": {"local": {"host": "127.0.0.1", "port": broker_port}},
        "commands": {"stateDir": str(tmp_path / "state")},
        "heartbeat": {"enabled": False},
        "metricEmission": {"enabled": False},
        "health": {"enabled": False},
    }


@dataclass
class Inbox:
    """Messages received under a filter, by topic."""

    messages: list[tuple[str, Message]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, topic: str, message: Message) -> None:
        with self.lock:
            self.messages.append((topic, message))

    def on(self, topic: str) -> list[Message]:
        with self.lock:
            return [m for t, m in self.messages if t == topic]

    def topics(self) -> set[str]:
        with self.lock:
            return {t for t, _ in self.messages}


@dataclass
class Adapter:
    runtime: Runtime
    app: SimComponent
    client: CommandClient
    config_path: Path
    document: dict[str, Any]
    seen: Inbox

    def data_topic(self, instance_id: str, channel: str) -> str:
        return self.runtime.topics.topic("data", channel, instance=instance_id)

    def reload(self, document: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
        self.config_path.write_text(json.dumps(document, indent=4))
        body = {"requestId": request_id or uuid.uuid4().hex}
        return self.client.call("reload-config", body, timeout=20)


@pytest.fixture
def start_adapter(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[Callable[..., Adapter]]:
    SwitchedDriver.switch = Switch()
    SimComponent.unstartable = set()
    runtimes: list[Runtime] = []
    clients: list[MessagingClient] = []

    def start(
        instances: list[dict[str, Any]],
        timing: dict[str, Any] | None = None,
        **sections: Any,
    ) -> Adapter:
        doc = document(broker.plain_port, tmp_path, instances)
        doc["component"]["timing"].update(timing or {})
        doc.update(sections)
        path = tmp_path / f"adapter-{len(runtimes)}.json"
        path.write_text(json.dumps(doc))
        loader = ConfigLoader(
            path, thing="gw", component_schema=SimComponent.schema, default_component="sim-adapter"
        )
        messaging = MessagingClient(
            MessagingConfig(
                local=BrokerConfig(
                    host="127.0.0.1", port=broker.plain_port, client_id=f"c-{uuid.uuid4().hex}"
                ),
                request_timeout_seconds=20,
            ),
            persistent_session=False,
        ).start()
        clients.append(messaging)
        wait_until(messaging.connected, 10, "the test client")
        seen = Inbox()
        # Subscribed before the component starts, so the first updates are seen too.
        messaging.subscribe(f"{doc['topic']['root']}/#", seen.add, max_concurrency=1)
        runtime = Runtime(loader.load())
        app = SimComponent()
        runtimes.append(runtime)
        runtime.start(app, loader)
        client = CommandClient.for_scope(messaging, runtime.topics)
        wait_until(lambda: _answers(client), 10, "the inbox")
        return Adapter(runtime, app, client, path, doc, seen)

    yield start
    for messaging in clients:
        messaging.close(1)
    for runtime in runtimes:
        runtime.shutdown()


def _answers(client: CommandClient) -> bool:
    try:
        client.call("describe", timeout=0.5)
    except Exception:
        return False
    return True
