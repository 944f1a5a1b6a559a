"""Events and alarms a component publishes on the UNS ``evt`` class, and the topic helper.

Topic shape: ``{root}[/{rootLevel}]/{device}/{component}[/{instance}]/{class}[/{channel}...]``.
Events go to ``.../evt/{severity}/{type}``. An alarm is an event with raise/clear semantics:
its raise and its clear are published on the same topic (the alarm's severity), so a
subscriber sees them in order, and ``body.state`` says which one it is.

Event body (message name ``Event``, version ``1.0``)::

    {"type": "config-applied", "severity": "info", "instance": "plc-1", "context": {...}}

Alarm body (message name ``Alarm``, version ``1.0``)::

    {"type": "device-unreachable", "severity": "error", "state": "raised" | "cleared",
     "raisedAt": "<RFC 3339>", "clearedAt": "<RFC 3339, clear only>",
     "instance": "plc-1", "context": {...}}

``instance`` is present only for instance-scope events and alarms.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from unskit.envelope import EnvelopeStamp, Message, MessageBuilder

__all__ = [
    "ALARM_MESSAGE_NAME",
    "EVENT_MESSAGE_NAME",
    "EVENT_MESSAGE_VERSION",
    "AlarmState",
    "Events",
    "Publisher",
    "Severity",
    "TopicScope",
    "uns_topic",
    "validate_token",
]

EVENT_MESSAGE_NAME = "Event"
ALARM_MESSAGE_NAME = "Alarm"
EVENT_MESSAGE_VERSION = "1.0"

# MQTT caps a topic name at 65,535 bytes of UTF-8.
_MAX_TOPIC_BYTES = 65_535
# Event and alarm types in the spec are lower-kebab (config-applied, device-unreachable);
# holding every type to it keeps topic filters predictable across components.
_TYPE_PATTERN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


class Severity(str, enum.Enum):
    """Severity token of an event topic (``evt/{severity}/{type}``)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class AlarmState(str, enum.Enum):
    """The ``state`` field of an alarm body."""

    RAISED = "raised"
    CLEARED = "cleared"


class Publisher(Protocol):
    """Where the library hands a built message for one topic (local or cloud broker)."""

    def publish(self, topic: str, message: Message) -> None:
        """Publishes one message on one topic."""


def validate_token(value: object, what: str) -> str:
    """Returns a topic token, refusing empty ones and ones holding ``/``, ``+``, ``#`` or NUL."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    for bad in ("/", "+", "#", "\x00"):
        if bad in value:
            raise ValueError(f"{what} {value!r} must not contain {bad!r}")
    return value


def _validate_root(root: object) -> str:
    if not isinstance(root, str):
        raise TypeError(f"topic root must be a str, not {type(root).__name__}")
    # The root may span levels (e.g. "acme/uns"); each level is still a plain token.
    for level in root.split("/"):
        validate_token(level, "topic root level")
    # Brokers reserve $-topics ($SYS) and a wildcard subscription never matches them.
    if root.startswith("$"):
        raise ValueError(f"topic root {root!r} must not start with '$'")
    return root


def uns_topic(
    root: str,
    device: str,
    component: str,
    topic_class: str,
    *channel: str,
    instance: str | None = None,
    root_level: str | None = None,
) -> str:
    """Builds ``{root}[/{root_level}]/{device}/{component}[/{instance}]/{class}[/{channel}...]``."""
    parts = [_validate_root(root)]
    if root_level is not None:
        parts.append(validate_token(root_level, "root level"))
    parts.append(validate_token(device, "device"))
    parts.append(validate_token(component, "component"))
    if instance is not None:
        parts.append(validate_token(instance, "instance"))
    parts.append(validate_token(topic_class, "topic class"))
    parts.extend(validate_token(token, "channel token") for token in channel)
    topic = "/".join(parts)
    if len(topic.encode("utf-8")) > _MAX_TOPIC_BYTES:
        raise ValueError(f"topic is longer than {_MAX_TOPIC_BYTES} bytes")
    return topic


@dataclass(frozen=True)
class TopicScope:
    """The fixed head of a component's topics; ``root_level`` is the first hierarchy value,
    given only when ``topic.includeRoot`` is true."""

    root: str
    device: str
    component: str
    root_level: str | None = None

    def __post_init__(self) -> None:
        _validate_root(self.root)
        validate_token(self.device, "device")
        validate_token(self.component, "component")
        if self.root_level is not None:
            validate_token(self.root_level, "root level")

    def topic(self, topic_class: str, *channel: str, instance: str | None = None) -> str:
        """Builds a topic of this component (instance scope when ``instance`` is given)."""
        return uns_topic(
            self.root,
            self.device,
            self.component,
            topic_class,
            *channel,
            instance=instance,
            root_level=self.root_level,
        )

    def event_topic(
        self, severity: Severity | str, event_type: str, *, instance: str | None = None
    ) -> str:
        """Builds ``.../evt/{severity}/{type}``."""
        return self.topic(
            "evt", _severity(severity).value, _event_type(event_type), instance=instance
        )


def _severity(value: Severity | str) -> Severity:
    if isinstance(value, Severity):
        return value
    try:
        return Severity(value)
    except ValueError:
        names = ", ".join(s.value for s in Severity)
        raise ValueError(f"unknown severity {value!r}; expected one of {names}") from None


def _event_type(value: object) -> str:
    validate_token(value, "event type")
    assert isinstance(value, str)
    if not _TYPE_PATTERN.fullmatch(value):
        raise ValueError(f"event type {value!r} must be lower-kebab (e.g. device-unreachable)")
    return value


def _rfc3339_now() -> str:
    now = datetime.now(timezone.utc)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _ActiveAlarm:
    severity: Severity
    raised_at: str
    context: dict[str, Any] = field(default_factory=dict)


class Events:
    """Publishes a component's events and keeps its alarms' raised/cleared state."""

    def __init__(
        self, publisher: Publisher, scope: TopicScope, *, stamp: EnvelopeStamp | None = None
    ) -> None:
        self._publisher = publisher
        self._scope = scope
        self._stamp = stamp
        # One lock over state and publication, so a raise and a racing clear are
        # published in the order their state changes happened.
        self._lock = threading.Lock()
        self._alarms: dict[tuple[str, str | None], _ActiveAlarm] = {}

    def emit(
        self,
        severity: Severity | str,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Message:
        """Publishes one event on ``.../evt/{severity}/{type}`` and returns the message."""
        level = _severity(severity)
        topic = self._scope.event_topic(level, event_type, instance=instance)
        body: dict[str, Any] = {"type": event_type, "severity": level.value}
        if instance is not None:
            body["instance"] = instance
        body["context"] = dict(context or {})
        message = self._build(EVENT_MESSAGE_NAME, body, instance)
        self._publisher.publish(topic, message)
        return message

    def debug(
        self,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Message:
        """Publishes a debug event."""
        return self.emit(Severity.DEBUG, event_type, context, instance=instance)

    def info(
        self,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Message:
        """Publishes an info event."""
        return self.emit(Severity.INFO, event_type, context, instance=instance)

    def warning(
        self,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Message:
        """Publishes a warning event."""
        return self.emit(Severity.WARNING, event_type, context, instance=instance)

    def error(
        self,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Message:
        """Publishes an error event."""
        return self.emit(Severity.ERROR, event_type, context, instance=instance)

    def critical(
        self,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Message:
        """Publishes a critical event."""
        return self.emit(Severity.CRITICAL, event_type, context, instance=instance)

    def raise_alarm(
        self,
        alarm_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
        severity: Severity | str = Severity.ERROR,
    ) -> bool:
        """Raises an alarm; publishes only when it was not already raised (returns whether)."""
        level = _severity(severity)
        topic = self._scope.event_topic(level, alarm_type, instance=instance)
        key = (alarm_type, instance)
        with self._lock:
            if key in self._alarms:
                return False
            active = _ActiveAlarm(level, _rfc3339_now(), dict(context or {}))
            self._alarms[key] = active
            body = self._alarm_body(alarm_type, instance, active, AlarmState.RAISED, None)
            try:
                self._publisher.publish(topic, self._build(ALARM_MESSAGE_NAME, body, instance))
            except BaseException:
                # Unannounced means not raised: the caller's next raise must publish.
                del self._alarms[key]
                raise
            return True

    def clear_alarm(
        self,
        alarm_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> bool:
        """Clears a raised alarm and publishes the clear; an alarm not raised is left alone."""
        _event_type(alarm_type)
        with self._lock:
            return self._clear_locked((alarm_type, instance), context)

    def clear_alarms(self, *, instance: str | None = None) -> list[str]:
        """Clears every raised alarm of one instance (None: component scope); returns types."""
        cleared = []
        with self._lock:
            for key in [k for k in self._alarms if k[1] == instance]:
                if self._clear_locked(key, None):
                    cleared.append(key[0])
        return cleared

    def is_raised(self, alarm_type: str, *, instance: str | None = None) -> bool:
        """Whether the alarm is currently raised."""
        with self._lock:
            return (alarm_type, instance) in self._alarms

    def active_alarms(self) -> list[tuple[str, str | None]]:
        """The raised alarms as (type, instance) pairs, in the order they were raised."""
        with self._lock:
            return list(self._alarms)

    def _clear_locked(self, key: tuple[str, str | None], context: Mapping[str, Any] | None) -> bool:
        active = self._alarms.get(key)
        if active is None:
            return False
        alarm_type, instance = key
        topic = self._scope.event_topic(active.severity, alarm_type, instance=instance)
        if context is not None:
            active = _ActiveAlarm(active.severity, active.raised_at, dict(context))
        body = self._alarm_body(alarm_type, instance, active, AlarmState.CLEARED, _rfc3339_now())
        # Published before the state is dropped: a failed clear leaves the alarm raised,
        # so a retry publishes the clear again.
        self._publisher.publish(topic, self._build(ALARM_MESSAGE_NAME, body, instance))
        del self._alarms[key]
        return True

    @staticmethod
    def _alarm_body(
        alarm_type: str,
        instance: str | None,
        active: _ActiveAlarm,
        state: AlarmState,
        cleared_at: str | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": alarm_type,
            "severity": active.severity.value,
            "state": state.value,
            "raisedAt": active.raised_at,
        }
        if cleared_at is not None:
            body["clearedAt"] = cleared_at
        if instance is not None:
            body["instance"] = instance
        body["context"] = dict(active.context)
        return body

    def _build(self, name: str, body: dict[str, Any], instance: str | None) -> Message:
        builder = MessageBuilder(name, EVENT_MESSAGE_VERSION, self._stamp).body(body)
        # The envelope can carry the instance only on top of an identity; without one the
        # topic and the body still name it.
        if instance is not None and self._stamp is not None and self._stamp.identity is not None:
            builder.instance(instance)
        return builder.build()
