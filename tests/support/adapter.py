"""A southbound adapter component run in-process on a real Mosquitto, with a command client
and a recorder of everything published under the test's topic root."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.mosquitto import Mosquitto
from tests.support.servers import root_logging_restored, wait_until
from unskit.commands import CommandClient
from unskit.config import ConfigLoader
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.envelope import Message
from unskit.messaging import MessagingClient
from unskit.runtime.component import Runtime
from unskit.southbound.component import SouthboundComponent


def framework_sections(broker_port: int, tmp_path: Path) -> dict[str, Any]:
    """The shared sections of a test document: a fresh topic root, no probes or metrics."""
    return {
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
    app: SouthboundComponent
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


class AdapterHarness:
    """Starts adapters of one component class; `close` stops every one of them."""

    def __init__(self, broker: Mosquitto, tmp_path: Path) -> None:
        self.broker = broker
        self.tmp_path = tmp_path
        self.runtimes: list[Runtime] = []
        self.clients: list[MessagingClient] = []
        # A Runtime run in-process configures root logging; close() puts it back.
        self._logging = root_logging_restored()
        self._logging.__enter__()

    def document(self, component: Mapping[str, Any], **sections: Any) -> dict[str, Any]:
        doc = {
            "component": dict(component),
            **framework_sections(self.broker.plain_port, self.tmp_path),
        }
        doc.update(sections)
        return doc

    def start(
        self, app_class: type[SouthboundComponent], document: dict[str, Any], thing: str = "gw"
    ) -> Adapter:
        path = self.tmp_path / f"adapter-{len(self.runtimes)}.json"
        path.write_text(json.dumps(document))
        loader = ConfigLoader(
            path, thing=thing, component_schema=app_class.schema, default_component=app_class.token
        )
        messaging = connected_client(self.broker.plain_port)
        self.clients.append(messaging)
        seen = Inbox()
        # Subscribed before the component starts, so the first updates are seen too.
        messaging.subscribe(f"{document['topic']['root']}/#", seen.add, max_concurrency=1)
        runtime = Runtime(loader.load())
        app = app_class()
        self.runtimes.append(runtime)
        runtime.start(app, loader)
        client = CommandClient.for_scope(messaging, runtime.topics)
        wait_until(lambda: inbox_answers(client), 10, "the inbox")
        return Adapter(runtime, app, client, path, document, seen)

    def close(self) -> None:
        for messaging in self.clients:
            messaging.close(1)
        for runtime in self.runtimes:
            runtime.shutdown()
        self._logging.__exit__(None, None, None)


def connected_client(broker_port: int, request_timeout_s: float = 20) -> MessagingClient:
    """A connected messaging client for a test (no persistent session)."""
    messaging = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=broker_port, client_id=f"c-{uuid.uuid4().hex}"
            ),
            request_timeout_seconds=request_timeout_s,
        ),
        persistent_session=False,
    ).start()
    try:
        wait_until(messaging.connected, 10, "the test client")
    except BaseException:
        # Left running, it would keep dialling this port, which a later module's broker gets.
        messaging.close(1)
        raise
    return messaging


def inbox_answers(client: CommandClient) -> bool:
    """Whether a component's inbox answers describe: its subscriptions are live."""
    try:
        client.call("describe", timeout=0.5)
    except Exception:
        return False
    return True
