"""UNS topics: matching, the reserved classes, and topics stamped from configuration."""

from __future__ import annotations

from dataclasses import dataclass

from unskit.errors import ReservedTopicError

__all__ = [
    "MAX_TOPIC_BYTES",
    "REPLY_TOPIC_PREFIX",
    "RESERVED_CLASSES",
    "TOPIC_CLASSES",
    "TopicScope",
    "check_not_reserved",
    "topic_class",
    "topic_matches_filter",
    "uns_topic",
    "validate_token",
]

# Reply topics are deliberately outside the UNS: a hyphen, not a slash, ends the prefix.
REPLY_TOPIC_PREFIX = "lib/reply-"
# Only the library's own state, metric, config and log publishers write these classes.
RESERVED_CLASSES = frozenset({"state", "metric", "cfg", "log"})
TOPIC_CLASSES = frozenset({"data", "evt", "cmd", *RESERVED_CLASSES})


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


def topic_class(topic: str) -> str | None:
    """The class token of a UNS topic ``{root}/{device}/{component}[/{instance}]/{class}/...``.

    The class is the first known class word after the root, device and component levels;
    the root may span levels, and a site level (`topic.includeRoot`) and an instance level
    may come between, so every later level is looked at.
    """
    levels = topic.split("/")
    for level in levels[3:]:
        if level in TOPIC_CLASSES:
            return level
    return None


def check_not_reserved(topic: str) -> None:
    """Raises ReservedTopicError for a topic of class state, metric, cfg or log."""
    cls = topic_class(topic)
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
    if len(topic.encode("utf-8")) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic is longer than {MAX_TOPIC_BYTES} bytes")
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

    @property
    def base(self) -> str:
        """``{root}[/{root_level}]/{device}/{component}``: the head every topic here shares."""
        head = [self.root, self.root_level, self.device, self.component]
        return "/".join(part for part in head if part is not None)

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
