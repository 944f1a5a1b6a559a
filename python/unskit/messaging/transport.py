"""The transport seam: what the messaging client needs from a broker link.

The MQTT provider (`unskit.messaging.mqtt`) is one implementation; an edge-runtime IPC
provider is another and supports QoS 0 and 1 only, refusing QoS 2 at its boundary.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["LinkCallback", "MessageCallback", "QoS", "Transport"]


class QoS(enum.IntEnum):
    """MQTT delivery guarantees."""

    AT_MOST_ONCE = 0
    AT_LEAST_ONCE = 1
    EXACTLY_ONCE = 2


# paho hands over bytes; other transports may hand over a bytearray.
MessageCallback = Callable[[str, bytes | bytearray], None]
LinkCallback = Callable[[bool], None]


class Transport(Protocol):
    """One broker link: publish and subscribe raw payloads, report link changes."""

    @property
    def name(self) -> str:
        """A label for logs and errors, e.g. ``local`` or ``northbound``."""
        ...

    @property
    def small_messages_only(self) -> bool:
        """Whether the link carries only small payloads (the edge-runtime IPC bus): a choice
        of payload size, such as a thumbnail's, takes the small one."""
        ...

    def start(self, on_message: MessageCallback, on_link: LinkCallback) -> None:
        """Connects in the background; callbacks run on the transport's own thread."""
        ...

    def publish(self, topic: str, payload: bytes, qos: QoS) -> None:
        """Sends one payload; raises when it cannot be sent or queued."""
        ...

    def subscribe(self, topic_filters: Sequence[str], qos: QoS) -> None:
        """Adds filters (one SUBSCRIBE carries them all), kept across reconnects until
        unsubscribed."""
        ...

    def unsubscribe(self, topic_filters: Sequence[str]) -> None:
        """Removes filters."""
        ...

    def is_connected(self) -> bool:
        """Whether the link is up now."""
        ...

    def acknowledged(self, topic_filters: Sequence[str]) -> bool:
        """Whether the broker confirmed (MQTT: SUBACK) every one of the filters since the
        link last came up; a transport without acknowledgements answers for its link."""
        ...

    def wait_acknowledged(self, topic_filters: Sequence[str], timeout: float) -> bool:
        """Blocks until `acknowledged(topic_filters)` holds (True) or `timeout` s pass."""
        ...

    def publish_backlog(self) -> int:
        """Publishes (QoS 1/2) sent or queued but not yet acknowledged by the broker."""
        ...

    def publish_oldest_age(self) -> float:
        """Seconds the oldest publish of `publish_backlog` has waited (0 when none)."""
        ...

    @property
    def endpoint(self) -> str:
        """The broker connected to, or tried next, as ``host:port``."""
        ...

    @property
    def refused_subscriptions(self) -> dict[str, str]:
        """Filters the broker (or the edge runtime) refused and that wait for a retry, each
        with the reason; readiness stays off while any is here."""
        ...

    @property
    def failovers(self) -> int:
        """Moves to the next broker of a failover list so far."""
        ...

    def within_failover_grace(self) -> bool:
        """Whether the link is down for less than its failover grace period."""
        ...

    def publish_failures(self) -> int:
        """Publishes lost since start: dropped while down (QoS 0) or refused."""
        ...

    def close(self, timeout: float) -> None:
        """Waits up to `timeout` seconds for unacknowledged publishes, then disconnects."""
        ...
