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
import functools
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, overload

from unskit.envelope import EnvelopeStamp, Message, MessageBuilder
from unskit.topics import TopicScope, validate_token

__all__ = [
    "ALARM_MESSAGE_NAME",
    "EVENT_MESSAGE_NAME",
    "EVENT_MESSAGE_VERSION",
    "AlarmState",
    "Events",
    "Publisher",
    "Severity",
    "event_topic",
]

EVENT_MESSAGE_NAME = "Event"
ALARM_MESSAGE_NAME = "Alarm"
EVENT_MESSAGE_VERSION = "1.0"

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


def event_topic(
    scope: TopicScope, severity: Severity | str, event_type: str, *, instance: str | None = None
) -> str:
    """Builds ``.../evt/{severity}/{type}`` under `scope`."""
    return scope.topic("evt", _severity(severity).value, _event_type(event_type), instance=instance)


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


class _EmitAt(Protocol):
    def __call__(
        self,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Message: ...


class _AtSeverity:
    """`Events.debug` to `Events.critical`: `Events.emit` at one severity."""

    def __init__(self, severity: Severity) -> None:
        self._severity = severity
        article = "an" if severity.value[0] in "aeiou" else "a"
        self.__doc__ = f"Publishes {article} {severity.value} event."

    @overload
    def __get__(self, events: None, owner: type[Events]) -> _AtSeverity: ...
    @overload
    def __get__(self, events: Events, owner: type[Events]) -> _EmitAt: ...
    def __get__(self, events: Events | None, owner: type[Events]) -> _AtSeverity | _EmitAt:
        if events is None:
            return self
        return functools.partial(events.emit, self._severity)


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
        topic = event_topic(self._scope, level, event_type, instance=instance)
        body: dict[str, Any] = {"type": event_type, "severity": level.value}
        if instance is not None:
            body["instance"] = instance
        body["context"] = dict(context or {})
        message = self._build(EVENT_MESSAGE_NAME, body, instance)
        self._publisher.publish(topic, message)
        return message

    debug = _AtSeverity(Severity.DEBUG)
    info = _AtSeverity(Severity.INFO)
    warning = _AtSeverity(Severity.WARNING)
    error = _AtSeverity(Severity.ERROR)
    critical = _AtSeverity(Severity.CRITICAL)

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
        topic = event_topic(self._scope, level, alarm_type, instance=instance)
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
        topic = event_topic(self._scope, active.severity, alarm_type, instance=instance)
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
