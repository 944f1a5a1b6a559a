"""The message-publish-degraded alarm against a real Mosquitto that is stopped (SIGTERM) or
frozen (SIGSTOP) while the component publishes: raised when publishes are lost or more than
BACKLOG_DEGRADED wait for the broker, seen by subscribers once the link is back, cleared
after recovery; an outage with little or nothing published raises nothing."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.adapter import Inbox, framework_sections
from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture

from unskit.config import load_config
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.envelope import Message, MessageBuilder
from unskit.messaging import MessagingClient, QoS
from unskit.runtime.component import Runtime
from unskit.runtime.echo import EchoComponent
from unskit.runtime.publish_watch import BACKLOG_DEGRADED, PUBLISH_DEGRADED

ALARM_SUFFIX = f"/evt/warning/{PUBLISH_DEGRADED}"


@server_fixture
def own_broker(tmp_path: Path, pki: Pki) -> Iterator[Mosquitto]:
    """A broker of this test alone: it is stopped and frozen."""
    mosquitto = Mosquitto(tmp_path / "mosquitto", pki).start()
    yield mosquitto
    if mosquitto.process is not None:
        os.kill(mosquitto.process.pid, signal.SIGCONT)
    mosquitto.stop()


class Outage:
    """Takes the broker away (stop: SIGTERM, the link drops; freeze: SIGSTOP, the link
    stays up but nothing is acknowledged) and brings it back."""

    def __init__(self, broker: Mosquitto, kind: str, messaging: MessagingClient) -> None:
        self.broker, self.kind, self.messaging = broker, kind, messaging

    def begin(self) -> None:
        if self.kind == "stop":
            self.broker.stop()
            wait_until(lambda: not self.messaging.connected(), 10, "the link to drop")
        else:
            assert self.broker.process is not None
            os.kill(self.broker.process.pid, signal.SIGSTOP)

    def end(self) -> None:
        if self.kind == "stop":
            self.broker.start()
        else:
            assert self.broker.process is not None
            os.kill(self.broker.process.pid, signal.SIGCONT)


def alarms(seen: Inbox) -> list[dict[str, Any]]:
    with seen.lock:
        return [m.body for t, m in seen.messages if t.endswith(ALARM_SUFFIX)]


SCENARIOS = [
    # outage, QoS of the component's publishes, how many, raised?
    pytest.param("stop", QoS.AT_LEAST_ONCE, BACKLOG_DEGRADED + 1000, True, id="stopped-backlog"),
    pytest.param("freeze", QoS.AT_LEAST_ONCE, BACKLOG_DEGRADED + 1000, True, id="frozen-backlog"),
    pytest.param("stop", QoS.AT_MOST_ONCE, 5, True, id="stopped-qos0-lost"),
    pytest.param("stop", QoS.AT_LEAST_ONCE, 100, False, id="stopped-small-backlog"),
    pytest.param("stop", QoS.AT_LEAST_ONCE, 0, False, id="stopped-idle"),
]


@pytest.mark.parametrize(("kind", "qos", "count", "raised"), SCENARIOS)
@pytest.mark.slow
def test_publish_degraded_is_raised_and_cleared(
    own_broker: Mosquitto, tmp_path: Path, restore_root_logging: None, kind, qos, count, raised
) -> None:
    document = {"component": {}, **framework_sections(own_broker.plain_port, tmp_path)}
    document["messaging"]["local"]["clientId"] = f"echo-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "echo.json"
    path.write_text(json.dumps(document))
    root = document["topic"]["root"]
    runtime = Runtime(load_config(path, thing="gw", default_component="echo"))
    # A subscriber with a persistent session: what is published while it reconnects waits.
    watcher = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=own_broker.plain_port, client_id=f"w-{uuid.uuid4().hex}"
            )
        )
    ).start()
    try:
        wait_until(watcher.connected, 10, "the watcher")
        seen = Inbox()
        watcher.subscribe(f"{root}/gw/echo/evt/#", seen.add, max_concurrency=1)
        runtime.start(EchoComponent())
        messaging = runtime.get_messaging()
        wait_until(messaging.connected, 10, "the component's link")
        events, watch = runtime.events, runtime.publish_watch
        assert events is not None
        assert watch is not None

        outage = Outage(own_broker, kind, messaging)
        outage.begin()
        data = MessageBuilder("Reading", "1.0").body({"value": 1}).build()
        for _ in range(count):
            messaging.publish(f"{root}/gw/echo/data/load", data, qos)
        checks = watch.checks
        if raised:
            wait_until(lambda: events.is_raised(PUBLISH_DEGRADED), 10, "the alarm raised")
            # However quiet, the outage keeps it raised.
            checks = watch.checks
            wait_until(lambda: watch.checks >= checks + 2, 10, "two more checks")
            assert events.is_raised(PUBLISH_DEGRADED)
        else:
            wait_until(lambda: watch.checks >= checks + 3, 10, "three checks")
            assert not events.is_raised(PUBLISH_DEGRADED)
        outage.end()

        # A marker published after recovery: whatever the alarm did reached the watcher first.
        wait_until(messaging.connected, 60, "the link back")
        wait_until(lambda: not events.is_raised(PUBLISH_DEGRADED), 60, "recovery")
        events.info("marker")
        wait_until(
            lambda: any(t.endswith("/evt/info/marker") for t, _ in seen.messages), 60, "the marker"
        )
        seen_alarms = alarms(seen)
        if not raised:
            assert seen_alarms == []
            return
        assert [a["state"] for a in seen_alarms] == ["raised", "cleared"], seen_alarms
        raise_body, clear_body = seen_alarms
        assert raise_body["type"] == PUBLISH_DEGRADED
        assert raise_body["severity"] == "warning"
        assert clear_body["raisedAt"] == raise_body["raisedAt"]
        assert "clearedAt" in clear_body
        local = raise_body["context"]["links"]["local"]
        if qos == QoS.AT_MOST_ONCE:
            assert 0 < local["lost"] <= count
        else:
            assert local["backlog"] > BACKLOG_DEGRADED
            assert local["connected"] is (kind == "freeze")
        recovered = clear_body["context"]["links"]["local"]
        assert recovered["connected"] is True
        assert recovered["lost"] == 0
    finally:
        runtime.shutdown()
        watcher.close(1)


class AlarmWatcher:
    """The alarm messages a subscriber of the local broker receives, waited for in order."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.bodies: list[tuple[float, dict[str, Any]]] = []

    def add(self, topic: str, message: Message) -> None:
        if topic.endswith(ALARM_SUFFIX):
            with self._changed:
                self.bodies.append((time.monotonic(), message.body))
                self._changed.notify_all()

    def wait_for(self, state: str, timeout: float) -> tuple[float, dict[str, Any]]:
        """The first alarm message in `state` (raised, cleared), with when it arrived."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((b for b in self.bodies if b[1]["state"] == state), None), timeout
            )
        assert found is not None, f"no {state} {PUBLISH_DEGRADED} within {timeout} s"
        return found


DEGRADED_AFTER_S = 2.0
HELD = 3


@pytest.mark.parametrize("store_and_forward", [False, True], ids=["queued", "stored"])
@pytest.mark.slow
def test_a_few_publishes_held_back_longer_than_the_age_raise_the_alarm_until_drained(
    broker: Mosquitto,
    own_broker: Mosquitto,
    tmp_path: Path,
    restore_root_logging: None,
    store_and_forward: bool,
) -> None:
    # Issue 36: the northbound broker away for long, a publish every now and then: far below
    # BACKLOG_DEGRADED, yet publishing is held back. The local link stays up, so the alarm
    # reaches a subscriber while the northbound broker is still away.
    document = {"component": {}, **framework_sections(broker.plain_port, tmp_path)}
    northbound: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": own_broker.plain_port,
        "clientId": f"nb-{uuid.uuid4().hex[:8]}",
        "publishDegradedAfterSeconds": DEGRADED_AFTER_S,
    }
    if store_and_forward:
        northbound["storeAndForward"] = {"enabled": True, "path": str(tmp_path / "outbox.db")}
    document["messaging"]["northbound"] = northbound
    path = tmp_path / "echo.json"
    path.write_text(json.dumps(document))
    root = document["topic"]["root"]
    runtime = Runtime(load_config(path, thing="gw", default_component="echo"))
    watcher = MessagingClient(
        MessagingConfig(local=BrokerConfig("127.0.0.1", broker.plain_port, f"w-{uuid.uuid4()}"))
    ).start()
    try:
        assert watcher.wait_connected(10)
        alarms_seen = AlarmWatcher()
        watcher.subscribe(f"{root}/gw/echo/evt/#", alarms_seen.add, max_concurrency=1)
        assert watcher.wait_subscribed(10)
        runtime.start(EchoComponent())
        messaging = runtime.get_messaging()
        wait_until(messaging.northbound_connected, 10, "the northbound link")

        own_broker.stop()
        wait_until(lambda: not messaging.northbound_connected(), 10, "the northbound link down")
        data = MessageBuilder("Reading", "1.0").body({"value": 1}).build()
        held_at = time.monotonic()
        for _ in range(HELD):
            messaging.publish_northbound(f"{root}/gw/echo/data/held", data, QoS.AT_LEAST_ONCE)

        raised_at, raised = alarms_seen.wait_for("raised", DEGRADED_AFTER_S + 15)
        assert raised_at - held_at >= DEGRADED_AFTER_S - 0.05  # the outbox keeps milliseconds
        link = raised["context"]["links"]["northbound"]
        assert link["connected"] is False
        assert link["backlog"] == HELD  # far below BACKLOG_DEGRADED: the age raised it
        assert link["oldestAgeSeconds"] > DEGRADED_AFTER_S
        assert link["lost"] == 0
        assert raised["context"]["links"]["local"]["connected"] is True

        own_broker.start()
        _, cleared = alarms_seen.wait_for("cleared", 60)
        drained = cleared["context"]["links"]["northbound"]
        assert drained["connected"] is True
        assert drained["backlog"] == 0
        assert drained["oldestAgeSeconds"] <= DEGRADED_AFTER_S / 2
        assert cleared["raisedAt"] == raised["raisedAt"]
        assert [body["state"] for _, body in alarms_seen.bodies] == ["raised", "cleared"]
    finally:
        runtime.shutdown()
        watcher.close(1)
