"""UNS topics: matching, the reserved classes, and topics stamped from configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unskit.errors import ReservedTopicError

__all__ = [
    "MAX_TOPIC_BYTES",
    "REPLY_TOPIC_PREFIX",
    "RESERVED_CLASSES",
    "TOPIC_CLASSES",
    "TopicScope",
    "UnsTopic",
    "check_not_reserved",
    "topic_class",
    "topic_matches_filter",
    "uns_topic",
    "unshared_filter",
    "validate_token",
]

# Reply topics are deliberately outside the UNS: a hyphen, not a slash, ends the prefix.
REPLY_TOPIC_PREFIX = "lib/reply-"
# Only the library's own state, metric, config and log publishers write these classes.
RESERVED_CLASSES = frozenset({"state", "metric", "cfg", "log"})
# app is the camera's application namespace (spec 2).
TOPIC_CLASSES = frozenset({"data", "evt", "cmd", "app", *RESERVED_CLASSES})
#: Levels before the optional instance in the spec's layout ``{root}/{device}/{component}``
#: (a one-level root without a site level); a topic built by a `TopicScope` knows its own.
DEFAULT_HEAD_LEVELS = 3


class UnsTopic(str):
    """A topic string that remembers its class, as `uns_topic` built it: the class is then
    known exactly, whatever the root's depth, a site level or an instance named like a class."""

    topic_class: str

    def __new__(cls, value: str, topic_class: str) -> UnsTopic:
        topic = super().__new__(cls, value)
        topic.topic_class = topic_class
        return topic

    def __reduce__(self) -> tuple[Any, ...]:
        return (UnsTopic, (str(self), self.topic_class))


def topic_matches_filter(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching with `+` (one level) and `#` (the rest, including the parent)."""
    if topic_filter == topic:
        return True
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    # Wildcards never match topics that start with '$' (broker system topics).
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False
    for i, level in enumerate(filter_levels):
        if level == "#":
            return i == len(filter_levels) - 1
        if i >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[i]:
            return False
    return len(filter_levels) == len(topic_levels)


def unshared_filter(topic_filter: str) -> str:
    """The filter a shared subscription (``$share/<group>/<filter>``, MQTT 5 and Mosquitto
    on 3.1.1) matches topics against; any other filter as it is."""
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        if len(parts) == 3 and parts[1] and parts[2]:
            return parts[2]
    return topic_filter


def topic_class(topic: str, head_levels: int | None = None) -> str | None:
    """The class of ``{root}/{device}/{component}[/{instance}]/{class}/...``, read only where
    the layout puts it.

    `head_levels` counts the levels before the optional instance (root levels, a site level,
    device, component); default `DEFAULT_HEAD_LEVELS`. The level after the head is the class,
    unless the level after that is a class word too: then it is the instance (the optional
    instance level is taken whenever it can be), so an instance named ``state`` publishes
    ``.../state/data/x`` as data. A topic built by a `TopicScope` carries its class.
    """
    if isinstance(topic, UnsTopic):
        return topic.topic_class
    head = DEFAULT_HEAD_LEVELS if head_levels is None else head_levels
    levels = topic.split("/")
    if len(levels) <= head:
        return None
    first = levels[head]
    second = levels[head + 1] if len(levels) > head + 1 else None
    if second in TOPIC_CLASSES:
        return second
    return first if first in TOPIC_CLASSES else None


def check_not_reserved(topic: str, head_levels: int | None = None) -> None:
    """Raises ReservedTopicError for a topic of class state, metric, cfg or log."""
    cls = topic_class(topic, head_levels)
    if cls in RESERVED_CLASSES:
        raise ReservedTopicError(
            f"topic {topic!r} has the reserved class {cls!r}; only the library publishes there"
        )


# MQTT caps a topic name at 65,535 bytes of UTF-8.
MAX_TOPIC_BYTES = 65_535


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
) -> UnsTopic:
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
    if len(topic.encode("utf-8")) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic is longer than {MAX_TOPIC_BYTES} bytes")
    return UnsTopic(topic, topic_class)


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

    @property
    def head_levels(self) -> int:
        """Levels before the optional instance: the root's, the site level, device, component."""
        return self.base.count("/") + 1

    @property
    def base(self) -> str:
        """``{root}[/{root_level}]/{device}/{component}``: the head every topic here shares."""
        head = [self.root, self.root_level, self.device, self.component]
        return "/".join(part for part in head if part is not None)

    def topic(self, topic_class: str, *channel: str, instance: str | None = None) -> UnsTopic:
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
