"""The IPC transport's base layer: one link to the edge runtime's nucleus, its state (the
current connection and its generation, the filters, the held publishes), and what the link
reports about itself. `IpcTransport` (`ipc.py`) joins it with the publish and subscription
layers; the SDK is reached only through `unskit.edge`."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from unskit.config.messaging import IpcConfig
from unskit.edge import IpcConnection, IpcEndpoint
from unskit.edge.pubsub import Bus
from unskit.errors import MessagingError
from unskit.messaging.requests import DeadlineTimer
from unskit.messaging.transport import LinkCallback, MessageCallback, QoS

# One logger for the layers, as the MQTT transport's layers share theirs.
_log = logging.getLogger("unskit.messaging.ipc")


class _IpcState:
    """The base layer of `IpcTransport`: the link's state and its self-report."""

    #: The edge runtime's IPC bus carries only small payloads (spec 2: a thumbnail request
    #: is reduced to the small size on it).
    small_messages_only = True

    def __init__(
        self,
        endpoint: IpcEndpoint,
        config: IpcConfig,
        *,
        name: str = "local",
        clock: Callable[[], float] = time.monotonic,
        timer: DeadlineTimer | None = None,
        bus: Bus = Bus.LOCAL,
    ) -> None:
        """`bus`: the local pub/sub (the local link) or the nucleus's cloud MQTT proxy (a
        northbound link, ``messaging.northbound.type: runtime``)."""
        self._endpoint = endpoint
        self._bus = bus
        self._config = config
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        # Notified (under the lock) when a subscription is answered or a publish settles.
        self._changed = threading.Condition(self._lock)
        self._connection: IpcConnection | None = None
        self._client: Any = None
        # Bumped per connection: a callback of an earlier connection changes nothing.
        self._generation = 0
        self._connected = False
        self._started = False
        self._closed = False
        self._on_message: MessageCallback | None = None
        self._on_link: LinkCallback | None = None
        # Subscriptions: the filters kept, the stream of each on the current connection,
        # the ones the nucleus accepted on it, the refused ones with their streaks.
        self._filters: dict[str, QoS] = {}
        self._streams: dict[str, Any] = {}
        self._acknowledged: set[str] = set()
        self._retrying: dict[str, int] = {}
        self._refusal_reasons: dict[str, str] = {}
        self._retry: int | None = None
        self._timer = timer
        self._own_timer: DeadlineTimer | None = None
        self._subscribe_refusals = 0
        self._subscribes_sent = 0
        # Publishes: QoS 1 ones made while down (when made, topic, payload), and those sent
        # but not yet answered by the nucleus (id -> when made, in order).
        # Each publish has an id, kept while it is held again after a loss.
        self._held: collections.deque[tuple[float, str, bytes, int]] = collections.deque()
        self._in_flight: dict[int, float] = {}
        self._next_id = 0
        # Ids of `publish_tracked` not yet answered, and answers the outbox is to hear of.
        self._tracked: set[int] = set()
        self._answers: list[int] = []
        self._on_acknowledged: Callable[[int], None] | None = None
        # The retry of tracked publishes the nucleus refused for now (its spooler full), how
        # many it refused so, and when that was last logged.
        self._publish_retry: int | None = None
        self._spool_refusals = 0
        self._retry_streak = 0
        self._spool_warned_at: float | None = None
        self._dropped_qos0 = 0
        self._refused = 0
        # The link's thread (ipc.py) and what wakes it: the loss, or close.
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        """`local`, for logs and errors."""
        return self._name

    @property
    def endpoint(self) -> str:
        """The nucleus's IPC socket (``ipc+iotcore:`` for its cloud MQTT proxy)."""
        scheme = "ipc" if self._bus is Bus.LOCAL else "ipc+iotcore"
        return f"{scheme}:{self._endpoint.socket_path}"

    @property
    def bus(self) -> Bus:
        """The local pub/sub or the cloud MQTT proxy."""
        return self._bus

    @property
    def _bus_name(self) -> str:
        return "IPC bus" if self._bus is Bus.LOCAL else "cloud MQTT proxy"

    @property
    def failovers(self) -> int:
        """The IPC bus has one nucleus: never a failover."""
        return 0

    def within_failover_grace(self) -> bool:
        """No failover list, so no grace: a lost nucleus is an outage."""
        return False

    @property
    def receive_own_messages(self) -> bool:
        """Whether subscriptions also receive the component's own publishes."""
        return self._config.receive_own_messages

    def is_connected(self) -> bool:
        """Whether the nucleus accepted the connection and it has not dropped since (and the
        subscriptions were restored on it)."""
        return self._connected

    def _require_started(self) -> None:
        if not self._started:
            raise MessagingError(f"messaging {self._name}: not started")
        if self._closed:
            raise MessagingError(f"messaging {self._name}: closed")
