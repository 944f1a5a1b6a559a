"""Consumer groups that work on every broker: several processes share the messages of one set
of filters, each message handled by one of them.

Where the broker honours MQTT shared subscriptions, the group subscribes
``$share/{group}/{filter}`` and the broker splits the load. Some brokers accept such a filter
and then deliver nothing through it (a NATS cluster's MQTT listener, for one), so in ``auto``
mode the group first proves it: it subscribes a private probe group with the same filter,
publishes a probe message to a topic the filter matches, and trusts ``$share`` only if the
probe comes back within the probe timeout. Otherwise (or in ``partitioned`` mode) each member
subscribes only the devices the configuration assigns it, a static partition that covers
every device exactly once.

Either way a member drops messages whose envelope id it handled recently (a bounded window):
QoS 1 redelivers after a reconnect or a broker failover, and a group must not count a sample
twice.
"""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from unskit.envelope import Message, MessageBuilder
from unskit.errors import ConfigError, ConfigIssue, MessagingError
from unskit.messaging.client import MessagingClient
from unskit.messaging.subscriptions import Handler

__all__ = [
    "PROBE_NAME",
    "ConsumerGroup",
    "ConsumerGroupConfig",
    "GroupMode",
    "consumer_group_from_section",
    "device_filter",
]

_log = logging.getLogger(__name__)

#: The header name of the probe envelope; every member drops it.
PROBE_NAME = "unskit.consumer-group-probe"
DEFAULT_PROBE_TIMEOUT_S = 3.0
PROBE_CONNECT_TIMEOUT_S = 10.0
DEFAULT_DEDUP_WINDOW = 10_000
_PROBE_LEVEL = "consumer-group-probe"


class GroupMode(str, enum.Enum):
    """How a group splits the messages: ``auto`` probes for working shared subscriptions."""

    AUTO = "auto"
    SHARED = "shared"
    PARTITIONED = "partitioned"


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """One member's view of its group: the group's name, this member, the mode, and the
    static partition (member -> devices) used when shared subscriptions are not."""

    name: str
    member: str
    mode: GroupMode = GroupMode.AUTO
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S
    dedup_window: int = DEFAULT_DEDUP_WINDOW

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices this member handles in partitioned mode."""
        return self.partitions.get(self.member, ())


def consumer_group_from_section(section: Mapping[str, Any], path: str) -> ConsumerGroupConfig:
    """A schema-valid ``consumerGroup`` block; `ConfigError` (with JSON paths) when its
    partition leaves a device out, assigns one twice, or does not name this member."""
    mode = GroupMode(section.get("mode", GroupMode.AUTO.value))
    member = str(section["member"])
    partitions = {m: tuple(devices) for m, devices in section.get("partitions", {}).items()}
    issues: list[ConfigIssue] = []
    owner: dict[str, str] = {}
    for name, devices in partitions.items():
        for device in devices:
            if device in owner:
                issues.append(
                    ConfigIssue(
                        f"{path}.partitions.{name}",
                        f"device {device!r} is also in {owner[device]!r}'s partition: "
                        "each device belongs to exactly one member",
                    )
                )
            owner.setdefault(device, name)
    declared = section.get("devices")
    if declared is not None:
        missing = [d for d in declared if d not in owner]
        unknown = [d for d in owner if d not in declared]
        if missing:
            issues.append(
                ConfigIssue(
                    f"{path}.partitions",
                    f"no member takes {', '.join(map(repr, missing))}: the partition must "
                    "cover every device of the group",
                )
            )
        if unknown:
            issues.append(
                ConfigIssue(
                    f"{path}.partitions",
                    f"{', '.join(map(repr, unknown))} not in {path}.devices",
                )
            )
    if mode is GroupMode.PARTITIONED and not partitions:
        issues.append(ConfigIssue(f"{path}.partitions", "is required with mode 'partitioned'"))
    if partitions and mode is not GroupMode.SHARED:
        if declared is None:
            issues.append(
                ConfigIssue(
                    f"{path}.devices",
                    "is required with partitions: the devices the partition must cover",
                )
            )
        elif member not in partitions:
            issues.append(
                ConfigIssue(f"{path}.member", f"{member!r} has no partition in {path}.partitions")
            )
    if issues:
        raise ConfigError(issues)
    return ConsumerGroupConfig(
        name=str(section["name"]),
        member=member,
        mode=mode,
        partitions=partitions,
        probe_timeout_s=float(section.get("probeTimeoutSeconds", DEFAULT_PROBE_TIMEOUT_S)),
        dedup_window=int(section.get("dedupWindow", DEFAULT_DEDUP_WINDOW)),
    )


def device_filter(topic_filter: str, device_level: int, device: str) -> str | None:
    """`topic_filter` narrowed to topics whose level `device_level` (0-based) is `device`;
    None when the filter can match no topic of that device."""
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if level == "#" and index <= device_level:
            filled = levels[:index] + ["+"] * (device_level - index) + [device, "#"]
            return "/".join(filled)
        if index == device_level:
            if level == "+":
                return "/".join([*levels[:index], device, *levels[index + 1 :]])
            return topic_filter if level == device else None
    return None  # the filter ends before the device level


def _probe_topic(topic_filter: str) -> str:
    """A concrete topic the filter matches."""
    levels = [_PROBE_LEVEL if level in ("+", "#") else level for level in topic_filter.split("/")]
    return "/".join(levels)


class _RecentIds:
    """The last `size` envelope ids seen, for dropping redeliveries."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, message_id: str) -> bool:
        """True when the id is in the window; otherwise remembers it."""
        with self._lock:
            if message_id in self._ids:
                self._ids.move_to_end(message_id)
                return True
            self._ids[message_id] = None
            if len(self._ids) > self._size:
                self._ids.popitem(last=False)
            return False


class ConsumerGroup:
    """One member's subscriptions of a consumer group; `open` decides shared or partitioned."""

    #: Whether this process found `$share` working, per broker link: probed once, then
    #: reused (and a failed probe is never retried: the broker is not trusted).
    _verdicts: dict[str, bool] = {}  # noqa: RUF012 - process-wide on purpose
    _verdicts_lock = threading.Lock()

    def __init__(
        self,
        messaging: MessagingClient,
        config: ConsumerGroupConfig,
        *,
        device_level: int,
    ) -> None:
        self._messaging = messaging
        self.config = config
        self._device_level = device_level
        self._recent = _RecentIds(config.dedup_window)
        self.duplicates = 0
        self.probes_dropped = 0
        self.mode: GroupMode | None = None
        self.filters: tuple[str, ...] = ()

    def broker_filters(self, include: Sequence[str], mode: GroupMode) -> tuple[str, ...]:
        """The filters this member subscribes for `include` in `mode`."""
        if mode is GroupMode.SHARED:
            return tuple(f"$share/{self.config.name}/{f}" for f in include)
        narrowed = (
            device_filter(f, self._device_level, device)
            for f in include
            for device in self.config.devices
        )
        return tuple(dict.fromkeys(f for f in narrowed if f is not None))

    def resolve_mode(self, include: Sequence[str]) -> GroupMode:
        """The configured mode, or for ``auto`` the probe's verdict (cached per process)."""
        if self.config.mode is not GroupMode.AUTO:
            return self.config.mode
        endpoint = str(self._messaging.link_status()["endpoint"])
        with self._verdicts_lock:
            verdict = self._verdicts.get(endpoint)
            if verdict is None:
                verdict = self._probe(include[0])
                self._verdicts[endpoint] = verdict
                if not verdict:
                    _log.warning(
                        "consumer group %r: the broker at %s accepted a $share subscription "
                        "and delivered nothing through it within %.1f s; using the static "
                        "partition (this member: %s) and never trusting $share on it",
                        self.config.name,
                        endpoint,
                        self.config.probe_timeout_s,
                        ", ".join(self.config.devices) or "no devices",
                    )
        if not verdict and not self.config.partitions:
            raise MessagingError(
                f"consumer group {self.config.name!r}: the broker at {endpoint} does not "
                "deliver through $share, and the group has no partition to fall back to "
                "(give consumerGroup.partitions and consumerGroup.devices)"
            )
        return GroupMode.SHARED if verdict else GroupMode.PARTITIONED

    def _probe(self, topic_filter: str) -> bool:
        """Sends a probe through a private share group of `topic_filter` on a side
        connection (the component's own client holds what it receives during start-up)."""
        token = uuid.uuid4().hex[:12]
        probe_filter = f"$share/{self.config.name}-probe-{token}/{topic_filter}"
        arrived = threading.Event()

        def on_probe(_topic: str, message: Message) -> None:
            if message.header.name == PROBE_NAME and message.body.get("token") == token:
                arrived.set()

        deadline = max(self.config.probe_timeout_s, PROBE_CONNECT_TIMEOUT_S)
        side = self._messaging.side_client("group-probe")
        try:
            if not side.wait_connected(deadline):
                raise MessagingError(
                    f"consumer group {self.config.name!r}: the probe connection did not open"
                )
            side.subscribe(probe_filter, on_probe, max_concurrency=1, max_messages=16)
            if not side.wait_subscribed(deadline):
                raise MessagingError(
                    f"consumer group {self.config.name!r}: the probe subscription was not "
                    "acknowledged"
                )
            probe = MessageBuilder(PROBE_NAME, "1").body({"token": token}).build()
            side.publish(_probe_topic(topic_filter), probe)
            return arrived.wait(self.config.probe_timeout_s)
        finally:
            side.close(1)

    def open(
        self,
        include: Sequence[str],
        handler: Handler,
        *,
        max_messages: int | None = None,
        on_overflow: Handler | None = None,
    ) -> GroupMode:
        """Subscribes this member's share of `include`; returns the mode it settled on."""
        mode = self.resolve_mode(include)
        filters = self.broker_filters(include, mode)

        def deliver(topic: str, message: Message) -> None:
            if message.header.name == PROBE_NAME:
                self.probes_dropped += 1
                return
            if self._recent.seen(message.header.uuid):
                self.duplicates += 1
                return
            handler(topic, message)

        subscribed: list[str] = []
        try:
            for topic_filter in filters:
                self._messaging.subscribe(
                    topic_filter,
                    deliver,
                    max_concurrency=1,
                    max_messages=max_messages,
                    on_overflow=on_overflow,
                )
                subscribed.append(topic_filter)
        except BaseException:
            for topic_filter in subscribed:
                self._messaging.unsubscribe(topic_filter)
            raise
        self.mode, self.filters = mode, filters
        _log.info(
            "consumer group %r, member %r: %s through %s",
            self.config.name,
            self.config.member,
            mode.value,
            ", ".join(filters),
        )
        return mode

    def close(self) -> None:
        """Unsubscribes this member's filters."""
        for topic_filter in self.filters:
            self._messaging.unsubscribe(topic_filter)
        self.filters = ()

    def status(self) -> dict[str, Any]:
        """JSON-ready facts for sb/status."""
        return {
            "group": self.config.name,
            "member": self.config.member,
            "mode": None if self.mode is None else self.mode.value,
            "filters": list(self.filters),
            "duplicatesDropped": self.duplicates,
        }
