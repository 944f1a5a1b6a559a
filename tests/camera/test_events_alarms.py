"""The camera adapter's lifecycle events (bounded, dropped and counted on saturation, never
delaying a capture) and its two alarms: storage-low against the storage floors, checked
whether or not captures run, and message-publish-degraded when terminal capture messages
cannot be published, cleared when one is published again."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, sim
from tests.support.adapter import Inbox, connected_client
from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.camera.announcements import TERMINAL_SOURCE, LifecycleQueue
from unskit.envelope import Message
from unskit.messaging import MessagingClient
from unskit.runtime.events import Events
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.publish_watch import PUBLISH_DEGRADED
from unskit.topics import TopicScope

DEGRADED = PUBLISH_DEGRADED


def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


# -- lifecycle events -----------------------------------------------------------------------


class SlowLink:
    """The broker link as a saturated one looks to its publisher: each publish waits until
    the test lets it through, then goes to the real broker."""

    def __init__(self, messaging: MessagingClient) -> None:
        self.messaging = messaging
        self.gate = threading.Event()
        self.entered = threading.Event()

    def publish(self, topic: str, message: Message) -> None:
        self.entered.set()
        assert self.gate.wait(30)
        self.messaging.publish(topic, message)


def test_lifecycle_events_are_bounded_and_dropped_without_waiting(broker: Mosquitto) -> None:
    messaging = connected_client(broker.plain_port)
    root = f"t{uuid.uuid4().hex[:8]}"
    scope = TopicScope(root, "gw", "camera-adapter")
    seen = Inbox()
    messaging.subscribe(f"{root}/#", seen.add, max_concurrency=1)
    link = SlowLink(messaging)
    metrics = MetricsRegistry()
    queue = LifecycleQueue(Events(link, scope), 3, metrics)
    try:
        assert queue.offer("debug", "capture-queued", {"n": 0}, "cam")
        # The publisher thread holds event 0 in the stalled link; the queue then takes 3.
        assert link.entered.wait(10)
        started = time.monotonic()
        accepted = [queue.offer("debug", "capture-queued", {"n": n}, "cam") for n in range(1, 7)]
        # Six offers against a stalled link returned while it is still stalled: no offer
        # waited for the broker (the gate is not open yet).
        assert not link.gate.is_set()
        assert time.monotonic() - started < 5
        assert accepted == [True, True, True, False, False, False]
        assert metrics.counter("captures", "lifecycleEventsDropped").total == 3
        link.gate.set()
        topic = scope.topic("evt", "debug", "capture-queued", instance="cam")
        wait_until(lambda: len(seen.on(topic)) == 4, 10, "the queued events")
        assert [m.body["context"]["n"] for m in seen.on(topic)] == [0, 1, 2, 3]
    finally:
        link.gate.set()
        queue.close(5)
        messaging.close(1)


def test_lifecycle_events_in_order_per_capture(harness: CameraHarness) -> None:
    rig = harness.start(
        {
            "cameras": [sim("cam", captureMode="software-trigger")],
            "global": {"operatorEvents": {"captureLifecycle": True, "maxQueuedEvents": 64}},
        }
    )
    bodies = [rig.call("capture-submit", {"requestId": rid()}, "cam") for _ in range(3)]
    for body in bodies:
        rig.terminal(body["captureId"])
    base = rig.runtime.topics.topic("evt", instance="cam")

    def events(capture_id: str) -> list[str]:
        with rig.seen.lock:
            return [
                t.rsplit("/", 2)[-2] + "/" + t.rsplit("/", 1)[-1]
                for t, m in rig.seen.messages
                if t.startswith(base) and m.body["context"].get("captureId") == capture_id
            ]

    for body in bodies:
        wait_until(lambda b=body: len(events(b["captureId"])) == 2, 10, "both events")
        assert events(body["captureId"]) == ["debug/capture-queued", "info/capture-started"]
    started = [m for t, m in rig.seen.messages if t == f"{base}/info/capture-started"]
    assert {m.body["context"]["captureMode"] for m in started} == {"software-trigger"}
    # Context excludes metadata, correlation ids, paths, images and backend details.
    assert set(started[0].body["context"]) == {
        "captureId",
        "trigger",
        "captureProfile",
        "captureMode",
    }
    dropped = rig.runtime.metrics.counter("captures", "lifecycleEventsDropped")
    assert dropped.total == 0


# -- storage-low ----------------------------------------------------------------------------

FLOORS = [
    # outputMinFreeBytes, stateMinFreeBytes, raised, reason starts with
    (0, 0, False, None),
    (2**62, 0, True, "the output root"),
    (0, 2**62, True, "the state root"),
    (2**62, 2**62, True, "the output root"),
]


@pytest.mark.parametrize(("output_floor", "state_floor", "raised", "reason"), FLOORS)
def test_storage_low_against_the_floors_without_captures(
    harness: CameraHarness, output_floor: int, state_floor: int, raised: bool, reason: str | None
) -> None:
    rig = harness.start(
        {
            "cameras": [sim("cam")],
            "storage": {
                "outputMinFreeBytes": output_floor,
                "stateMinFreeBytes": state_floor,
                "checkIntervalMs": 100,
            },
        }
    )
    events = rig.runtime.events
    assert events is not None
    watch = rig.app.service._storage_watch if rig.app.service is not None else None
    assert watch is not None
    wait_until(lambda: watch.checks >= 2, 10, "two storage checks")
    assert events.is_raised("storage-low") is raised
    alarm = rig.runtime.topics.topic("evt", "error", "storage-low")
    if raised:
        wait_until(lambda: rig.seen.on(alarm), 10, "the storage-low alarm")
        body = rig.seen.on(alarm)[0].body
        assert body["state"] == "raised"
        assert body["context"]["reason"].startswith(reason)
    else:
        assert rig.seen.on(alarm) == []


def test_storage_low_clears_when_room_returns_without_captures(
    harness: CameraHarness, tmp_path: Path
) -> None:
    rig = harness.start({"cameras": [sim("cam")], "storage": {"checkIntervalMs": 100}})
    alarm = rig.runtime.topics.topic("evt", "error", "storage-low")
    moved = tmp_path / "moved-away"
    rig.output.rename(moved)
    try:
        wait_until(lambda: rig.seen.on(alarm), 10, "the raise")
    finally:
        moved.rename(rig.output)
    wait_until(lambda: len(rig.seen.on(alarm)) == 2, 10, "the clear")
    assert [m.body["state"] for m in rig.seen.on(alarm)] == ["raised", "cleared"]
    assert "cannot be read" in rig.seen.on(alarm)[0].body["context"]["reason"]
    assert rig.call("capture-status", {"states": ["SUCCEEDED", "FAILED"]})["jobs"] == []


# -- message-publish-degraded ---------------------------------------------------------------


@server_fixture
def own_broker(tmp_path: Path, pki: Pki) -> Iterator[Mosquitto]:
    """A broker of this test alone: it is stopped and started again."""
    mosquitto = Mosquitto(tmp_path / "mosquitto", pki).start()
    yield mosquitto
    mosquitto.stop()


@pytest.mark.slow
def test_publish_degraded_while_terminal_messages_are_lost(
    own_broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> None:
    harness = CameraHarness(own_broker, tmp_path)
    try:
        schedule = {"id": "tick", "intervalMs": 300}
        component: dict[str, Any] = {"cameras": [sim("cam", schedules=[schedule])]}
        document = harness.document(component)
        # QoS 0: a message published while the broker is away is lost, not queued.
        document["messaging"]["local"]["qos"] = {"publish": 0}
        rig = harness.start(component, document)
        events, watch = rig.runtime.events, rig.runtime.publish_watch
        assert events is not None
        assert watch is not None
        service = rig.app.service
        assert service is not None
        announced = f"{rig.runtime.topics.topic('app', instance='cam')}/image/captured"
        wait_until(lambda: rig.seen.on(announced), 10, "a scheduled capture announced")
        assert not events.is_raised(DEGRADED)
        lost = rig.runtime.metrics.counter("captures", "announcementsLost")

        own_broker.stop()
        wait_until(lambda: lost.total >= 1, 20, "a terminal message lost")
        # The loss is counted before it is reported to the watch that raises the alarm.
        wait_until(lambda: events.is_raised(DEGRADED), 10, "the alarm raised")
        assert TERMINAL_SOURCE in watch._sources
        assert watch._sources[TERMINAL_SOURCE]["reason"].endswith("dropped (QoS 0)")
        # No capture runs while the broker comes back: the links recover first.
        service.sessions.set_paused("cam", True)
        own_broker.start()
        messaging = rig.runtime.get_messaging()
        wait_until(messaging.connected, 20, "the adapter's link")
        wait_until(lambda: harness.clients[0].subscriptions_acknowledged(), 20, "the watcher")
        checks = watch.checks
        wait_until(lambda: watch.checks >= checks + 2, 10, "two link checks after recovery")
        # The links are healthy, but no terminal message has gone out since: still raised.
        assert events.is_raised(DEGRADED)
        rig.call("resume", instance="cam")
        alarm = rig.runtime.topics.topic("evt", "warning", DEGRADED)
        wait_until(lambda: not events.is_raised(DEGRADED), 20, "the clear")
        wait_until(lambda: rig.seen.on(alarm), 10, "the clear published")
        assert rig.seen.on(alarm)[-1].body["state"] == "cleared"
        assert len(rig.seen.on(announced)) >= 2
    finally:
        harness.close()
