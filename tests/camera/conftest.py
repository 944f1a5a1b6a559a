"""The camera adapter run in-process on a real Mosquitto, with a command client and a
recorder of everything published under the test's topic root."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.adapter import Inbox, connected_client, framework_sections, inbox_answers
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.camera.component import CameraAdapter
from unskit.commands import CommandClient
from unskit.config import ConfigLoader
from unskit.envelope import Message
from unskit.errors import CommandError
from unskit.messaging import MessagingClient
from unskit.runtime.component import Runtime


def sim(instance: str, **connection: Any) -> dict[str, Any]:
    """A sim camera entry (small frames unless the test says otherwise)."""
    extra = {k: v for k, v in connection.items() if k in ("enabled", "schedules", "ptz")}
    conn = {"width": 320, "height": 240, **{k: v for k, v in connection.items() if k not in extra}}
    return {"instance": instance, "backend": "sim", "connection": conn, **extra}


@dataclass
class Rig:
    """A running camera adapter and a client of it."""

    runtime: Runtime
    app: CameraAdapter
    client: CommandClient
    seen: Inbox
    document: dict[str, Any]
    output: Path
    config_path: Path

    def call(
        self, verb: str, body: Mapping[str, Any] | None = None, instance: str | None = None
    ) -> dict[str, Any]:
        return self.client.call(verb, body or {}, instance=instance, timeout=30)

    def error(
        self, verb: str, body: Mapping[str, Any] | None = None, instance: str | None = None
    ) -> str:
        try:
            reply = self.call(verb, body, instance)
        except CommandError as error:
            return error.code
        raise AssertionError(f"sb/{verb} succeeded: {reply}")

    def reload(self, document: Mapping[str, Any], request_id: str | None = None) -> dict[str, Any]:
        """Writes `document` where the adapter reads its configuration and reloads it."""
        self.config_path.write_text(json.dumps(document))
        body = {"requestId": request_id or uuid.uuid4().hex}
        return self.client.call("reload-config", body, timeout=30)

    def announcements(self, capture_id: str) -> list[tuple[str, Message]]:
        with self.seen.lock:
            return [
                (topic, message)
                for topic, message in self.seen.messages
                if "/app/image/" in topic
                and isinstance(message.body, dict)
                and message.body.get("captureId") == capture_id
            ]

    def announced(self, capture_id: str, timeout: float = 20) -> tuple[str, Message]:
        wait_until(lambda: self.announcements(capture_id), timeout, f"announcement {capture_id}")
        return self.announcements(capture_id)[0]

    def status(self, capture_id: str) -> dict[str, Any]:
        return self.call("capture-status", {"captureId": capture_id})

    def terminal(self, capture_id: str, timeout: float = 20) -> dict[str, Any]:
        wait_until(
            lambda: self.status(capture_id)["terminalAtMs"] is not None,
            timeout,
            f"capture {capture_id} terminal",
            interval=0.05,
        )
        return self.status(capture_id)


class CameraHarness:
    def __init__(self, broker: Mosquitto, tmp_path: Path) -> None:
        self.broker = broker
        self.tmp_path = tmp_path
        self.runtimes: list[Runtime] = []
        self.clients: list[MessagingClient] = []

    def document(self, component: Mapping[str, Any], **sections: Any) -> dict[str, Any]:
        component = dict(component)
        component.setdefault("storage", {})
        component["storage"] = {
            "outputRoot": str(self.tmp_path / "images"),
            "outputMinFreeBytes": 0,
            "stateMinFreeBytes": 0,
            "fsync": False,
            **component["storage"],
        }
        doc = {"component": component, **framework_sections(self.broker.plain_port, self.tmp_path)}
        doc.update(sections)
        return doc

    def start(self, component: Mapping[str, Any], document: dict[str, Any] | None = None) -> Rig:
        document = document or self.document(component)
        path = self.tmp_path / f"camera-{len(self.runtimes)}.json"
        path.write_text(json.dumps(document))
        loader = ConfigLoader(
            path,
            thing="gw",
            component_schema=CameraAdapter.schema,
            default_component=CameraAdapter.token,
        )
        messaging = connected_client(self.broker.plain_port, request_timeout_s=30)
        self.clients.append(messaging)
        seen = Inbox()
        messaging.subscribe(f"{document['topic']['root']}/#", seen.add, max_concurrency=1)
        runtime = Runtime(loader.load())
        app = CameraAdapter()
        self.runtimes.append(runtime)
        runtime.start(app, loader)
        client = CommandClient.for_scope(messaging, runtime.topics)
        wait_until(lambda: inbox_answers(client), 10, "the inbox")
        output = Path(document["component"]["storage"]["outputRoot"])
        return Rig(runtime, app, client, seen, document, output, path)

    def stop(self, rig: Rig) -> None:
        rig.runtime.shutdown()

    def close(self) -> None:
        for messaging in self.clients:
            messaging.close(1)
        for runtime in self.runtimes:
            runtime.shutdown()


@server_fixture
def harness(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[CameraHarness]:
    running = CameraHarness(broker, tmp_path)
    yield running
    running.close()
