"""Events and alarms: topics, bodies, raise/clear semantics, over a recording publisher."""

from __future__ import annotations

import threading
from datetime import datetime

import pytest

from unskit import Identity, Message
from unskit.runtime.events import AlarmState, Events, Severity, event_topic
from unskit.topics import TopicScope, uns_topic, validate_token

SCOPE = TopicScope("uns", "dev-1", "ethernet-ip-adapter")
HEAD = "uns/dev-1/ethernet-ip-adapter"


class RecordingPublisher:
    """Collects what was published, as the bytes a broker would carry."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self.fail_next = 0

    def publish(self, topic: str, message: Message) -> None:
        with self._lock:
            if self.fail_next:
                self.fail_next -= 1
                raise ConnectionError("broker away")
            self.published.append((topic, message.to_bytes()))

    def decoded(self) -> list[tuple[str, Message]]:
        with self._lock:
            return [(topic, Message.from_bytes(raw)) for topic, raw in self.published]


class Stamp:
    """What a component configuration stamps on every message."""

    def __init__(self) -> None:
        self.identity = Identity("site/device", "plant-1/dev-1", "ethernet-ip-adapter")
        self.tags = {"line": "A"}


@pytest.fixture
def publisher():
    return RecordingPublisher()


@pytest.fixture
def events(publisher):
    return Events(publisher, SCOPE)


def parse_rfc3339(text: str) -> datetime:
    assert text.endswith("Z")
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- topics ----------------------------------------------------------------------------


def test_uns_topic_shapes():
    assert uns_topic("uns", "dev-1", "cip", "evt", "info", "x") == "uns/dev-1/cip/evt/info/x"
    assert uns_topic("uns", "dev-1", "cip", "data", "t1", instance="plc-1") == (
        "uns/dev-1/cip/plc-1/data/t1"
    )
    assert uns_topic("acme/uns", "dev-1", "cip", "metric", root_level="plant-1") == (
        "acme/uns/plant-1/dev-1/cip/metric"
    )


@pytest.mark.parametrize("bad", ["", "a/b", "a+b", "a#", "a\x00b"])
@pytest.mark.parametrize("part", ["device", "component", "instance", "channel", "root_level"])
def test_uns_topic_refuses_bad_tokens(part, bad):
    kwargs = {"root": "uns", "device": "dev-1", "component": "cip", "topic_class": "evt"}
    channel = ["info"]
    if part == "channel":
        channel = [bad]
    else:
        kwargs[part] = bad
    with pytest.raises(ValueError, match=part.replace("_", " ")):
        uns_topic(
            kwargs.pop("root"),
            kwargs.pop("device"),
            kwargs.pop("component"),
            kwargs.pop("topic_class"),
            *channel,
            **kwargs,
        )


@pytest.mark.parametrize("root", ["", "/uns", "uns/", "a//b", "u+s", "#", "$SYS"])
def test_uns_topic_refuses_bad_roots(root):
    with pytest.raises(ValueError, match="root"):
        uns_topic(root, "dev-1", "cip", "evt")


def test_validate_token_refuses_non_strings():
    with pytest.raises(TypeError, match="device"):
        validate_token(3, "device")
    assert validate_token("plc-1", "instance") == "plc-1"


def test_topic_scope_validates_at_construction():
    with pytest.raises(ValueError, match="device"):
        TopicScope("uns", "dev/1", "cip")
    with pytest.raises(ValueError, match="component"):
        TopicScope("uns", "dev-1", "")


def test_topic_scope_with_root_level():
    scope = TopicScope("uns", "dev-1", "cip", root_level="plant-1")
    assert event_topic(scope, "warning", "write-rejected", instance="opc-1") == (
        "uns/plant-1/dev-1/cip/opc-1/evt/warning/write-rejected"
    )


# --- events ----------------------------------------------------------------------------


def test_event_is_published_on_the_evt_topic(events, publisher):
    returned = events.info(
        "config-applied",
        {"started": ["plc-2"], "stopped": [], "kept": ["plc-1"], "skipped": []},
    )
    [(topic, message)] = publisher.decoded()
    assert topic == f"{HEAD}/evt/info/config-applied"
    assert message == returned
    assert message.header.name == "Event"
    assert message.header.version == "1.0"
    assert message.body == {
        "type": "config-applied",
        "severity": "info",
        "context": {"started": ["plc-2"], "stopped": [], "kept": ["plc-1"], "skipped": []},
    }


def test_instance_event_names_the_instance_in_topic_and_body(events, publisher):
    events.warning("write-rejected", {"signal": "ns=2;s=Speed"}, instance="opc-1")
    [(topic, message)] = publisher.decoded()
    assert topic == f"{HEAD}/opc-1/evt/warning/write-rejected"
    assert message.body["instance"] == "opc-1"
    assert message.body["context"] == {"signal": "ns=2;s=Speed"}
    # No configuration was given, so the envelope has no identity to carry it.
    assert message.identity is None


def test_stamped_event_carries_identity_instance_and_tags(publisher):
    Events(publisher, SCOPE, stamp=Stamp()).error("cert-expired", instance="plc-1")
    [(_, message)] = publisher.decoded()
    assert message.identity.instance == "plc-1"
    assert message.identity.component == "ethernet-ip-adapter"
    assert message.tags == {"line": "A"}


def test_event_without_context_has_an_empty_context(events, publisher):
    events.critical("storage-low")
    [(_, message)] = publisher.decoded()
    assert message.body["context"] == {}


@pytest.mark.parametrize("severity", ["debug", "info", "warning", "error", "critical"])
def test_every_severity_word_is_a_topic_token(events, publisher, severity):
    events.emit(severity, "capture-queued")
    assert publisher.published[0][0] == f"{HEAD}/evt/{severity}/capture-queued"
    shortcut = getattr(events, severity)
    shortcut("capture-started")
    assert publisher.published[1][0] == f"{HEAD}/evt/{severity}/capture-started"


def test_severity_enum_values_are_the_spec_words():
    assert [s.value for s in Severity] == ["debug", "info", "warning", "error", "critical"]


@pytest.mark.parametrize("severity", ["fatal", "warn", "INFO", ""])
def test_unknown_severity_is_refused(events, publisher, severity):
    with pytest.raises(ValueError, match="severity"):
        events.emit(severity, "config-applied")
    assert publisher.published == []


@pytest.mark.parametrize("event_type", ["ConfigApplied", "config_applied", "-x", "a--b", "a/b", ""])
def test_event_type_must_be_lower_kebab(events, publisher, event_type):
    with pytest.raises(ValueError, match="event type"):
        events.info(event_type)
    assert publisher.published == []


def test_event_publish_failure_propagates(events, publisher):
    publisher.fail_next = 1
    with pytest.raises(ConnectionError):
        events.info("config-applied")


# --- alarms ----------------------------------------------------------------------------


def test_raising_twice_publishes_once(events, publisher):
    assert events.raise_alarm("device-unreachable", {"host": "10.0.0.5"}, instance="plc-1")
    assert not events.raise_alarm("device-unreachable", {"host": "10.0.0.5"}, instance="plc-1")
    [(topic, message)] = publisher.decoded()
    assert topic == f"{HEAD}/plc-1/evt/error/device-unreachable"
    assert message.header.name == "Alarm"
    body = message.body
    assert body["state"] == AlarmState.RAISED.value == "raised"
    assert body["type"] == "device-unreachable"
    assert body["severity"] == "error"
    assert body["instance"] == "plc-1"
    assert body["context"] == {"host": "10.0.0.5"}
    assert "clearedAt" not in body
    parse_rfc3339(body["raisedAt"])
    assert events.is_raised("device-unreachable", instance="plc-1")


def test_clearing_a_raised_alarm_publishes_a_clear_on_the_same_topic(events, publisher):
    events.raise_alarm("device-unreachable", {"host": "10.0.0.5"}, instance="plc-1")
    assert events.clear_alarm("device-unreachable", instance="plc-1")
    [(raise_topic, raised), (clear_topic, cleared)] = publisher.decoded()
    assert clear_topic == raise_topic
    assert cleared.body["state"] == "cleared"
    assert cleared.body["raisedAt"] == raised.body["raisedAt"]
    assert parse_rfc3339(cleared.body["clearedAt"]) >= parse_rfc3339(raised.body["raisedAt"])
    assert cleared.body["context"] == {"host": "10.0.0.5"}
    assert not events.is_raised("device-unreachable", instance="plc-1")


def test_clear_may_replace_the_context(events, publisher):
    events.raise_alarm("storage-low", {"freeBytes": 10})
    events.clear_alarm("storage-low", {"freeBytes": 9000})
    assert publisher.decoded()[1][1].body["context"] == {"freeBytes": 9000}


def test_clearing_an_unraised_alarm_does_nothing(events, publisher):
    assert not events.clear_alarm("device-unreachable", instance="plc-1")
    assert publisher.published == []


def test_clearing_twice_publishes_one_clear(events, publisher):
    events.raise_alarm("storage-low")
    assert events.clear_alarm("storage-low")
    assert not events.clear_alarm("storage-low")
    assert [m.body["state"] for _, m in publisher.decoded()] == ["raised", "cleared"]


def test_raise_after_clear_publishes_again(events, publisher):
    events.raise_alarm("storage-low")
    events.clear_alarm("storage-low")
    assert events.raise_alarm("storage-low")
    assert [m.body["state"] for _, m in publisher.decoded()] == ["raised", "cleared", "raised"]


def test_alarms_are_kept_per_instance(events, publisher):
    events.raise_alarm("device-unreachable", instance="plc-1")
    assert events.raise_alarm("device-unreachable", instance="plc-2")
    assert events.raise_alarm("device-unreachable")  # component scope is its own alarm
    events.clear_alarm("device-unreachable", instance="plc-1")
    assert events.is_raised("device-unreachable", instance="plc-2")
    assert events.is_raised("device-unreachable")
    assert events.active_alarms() == [("device-unreachable", "plc-2"), ("device-unreachable", None)]
    assert [t for t, _ in publisher.published] == [
        f"{HEAD}/plc-1/evt/error/device-unreachable",
        f"{HEAD}/plc-2/evt/error/device-unreachable",
        f"{HEAD}/evt/error/device-unreachable",
        f"{HEAD}/plc-1/evt/error/device-unreachable",
    ]


def test_alarm_severity_holds_for_its_clear(events, publisher):
    events.raise_alarm("message-publish-degraded", severity=Severity.WARNING)
    events.clear_alarm("message-publish-degraded")
    topics = [t for t, _ in publisher.published]
    assert topics == [f"{HEAD}/evt/warning/message-publish-degraded"] * 2


def test_clear_alarms_of_a_removed_instance(events, publisher):
    events.raise_alarm("device-unreachable", instance="plc-1")
    events.raise_alarm("cert-expired", instance="plc-1", severity="critical")
    events.raise_alarm("device-unreachable", instance="plc-2")
    assert events.clear_alarms(instance="plc-1") == ["device-unreachable", "cert-expired"]
    assert events.active_alarms() == [("device-unreachable", "plc-2")]
    cleared = [(t, m.body["state"]) for t, m in publisher.decoded()[3:]]
    assert cleared == [
        (f"{HEAD}/plc-1/evt/error/device-unreachable", "cleared"),
        (f"{HEAD}/plc-1/evt/critical/cert-expired", "cleared"),
    ]


def test_failed_raise_is_not_remembered(events, publisher):
    publisher.fail_next = 1
    with pytest.raises(ConnectionError):
        events.raise_alarm("device-unreachable", instance="plc-1")
    assert not events.is_raised("device-unreachable", instance="plc-1")
    assert events.raise_alarm("device-unreachable", instance="plc-1")
    assert len(publisher.published) == 1


def test_failed_clear_leaves_the_alarm_raised(events, publisher):
    events.raise_alarm("device-unreachable", instance="plc-1")
    publisher.fail_next = 1
    with pytest.raises(ConnectionError):
        events.clear_alarm("device-unreachable", instance="plc-1")
    assert events.is_raised("device-unreachable", instance="plc-1")
    assert events.clear_alarm("device-unreachable", instance="plc-1")
    assert [m.body["state"] for _, m in publisher.decoded()] == ["raised", "cleared"]


def test_invalid_alarm_type_or_severity_is_refused(events, publisher):
    with pytest.raises(ValueError, match="event type"):
        events.raise_alarm("Device Unreachable")
    with pytest.raises(ValueError, match="severity"):
        events.raise_alarm("device-unreachable", severity="major")
    with pytest.raises(ValueError, match="event type"):
        events.clear_alarm("device/unreachable")
    assert publisher.published == []
    assert events.active_alarms() == []


def test_concurrent_raises_publish_once(events, publisher):
    threads_n = 16
    start = threading.Barrier(threads_n)
    results = []

    def race():
        start.wait()
        results.append(events.raise_alarm("device-unreachable", instance="plc-1"))

    threads = [threading.Thread(target=race) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 1
    assert len(publisher.published) == 1


def test_stamped_alarm_carries_the_instance_identity(publisher):
    Events(publisher, SCOPE, stamp=Stamp()).raise_alarm("device-unreachable", instance="plc-1")
    [(_, message)] = publisher.decoded()
    assert message.identity.instance == "plc-1"
    assert message.identity.device == "dev-1"
