"""`MessagingClient`: publish/subscribe and request/reply on the local and northbound brokers."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from unskit.config.messaging import DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS, IpcConfig
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.config.secrets import SecretResolver
from unskit.edge.pubsub import Bus
from unskit.envelope import Message
from unskit.errors import MessagingError
from unskit.messaging.ipc import IpcTransport
from unskit.messaging.link import HOLD_MAX_MESSAGES, Link, LinkStats
from unskit.messaging.mqtt import MqttTransport
from unskit.messaging.outbox import AckingTransport, Forwarder, Outbox, OutboxStatus
from unskit.messaging.reply_to import RefusalLog, ReplyRefusal, reply_refusal
from unskit.messaging.requests import DeadlineTimer, RequestFuture
from unskit.messaging.subscriptions import Handler
from unskit.messaging.transport import QoS, Transport
from unskit.topics import REPLY_TOPIC_PREFIX, check_not_reserved, topic_matches_filter

__all__ = ["HOLD_MAX_MESSAGES", "LinkStats", "MessagingClient", "OutboxStatus", "PublishStatus"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishStatus:
    """How one link's publishing fares: its state, unacknowledged backlog, its age, losses."""

    connected: bool
    #: QoS 1/2 publishes not yet acknowledged by the broker (queued ones included); with
    #: store-and-forward, the entries in the outbox.
    backlog: int
    #: Publishes lost since start (QoS 0 dropped while down, refused when the queue is full;
    #: with store-and-forward, also what the outbox dropped, refused or expired).
    failures: int
    #: Seconds the oldest publish of the backlog has waited (0 when there is none).
    oldest_age_s: float = 0.0
    #: The link's publishDegradedAfterSeconds: message-publish-degraded rises beyond it.
    degraded_after_s: float = DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS


class MessagingClient:
    """Publish/subscribe and request/reply over the local broker (or a local transport handed
    in) and an optional northbound broker."""

    def __init__(
        self,
        config: MessagingConfig,
        *,
        secrets: SecretResolver | None = None,
        local: Transport | None = None,
        northbound: Transport | None = None,
        persistent_session: bool = True,
        on_reply_refused: Callable[[str, ReplyRefusal], None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """`environ`: where an IPC link (`config.local_ipc`, `config.northbound_runtime`)
        finds the nucleus's socket and token, by default this process's environment."""
        self._config = config
        self._secrets = secrets
        self._reply_prefixes = tuple(config.reply_topic_prefixes)
        self._refusals = RefusalLog(_log)
        self._on_reply_refused = on_reply_refused
        self._timer = DeadlineTimer()
        try:
            if local is None and config.local_ipc is not None:
                local = IpcTransport.from_environment(config.local_ipc, environ, timer=self._timer)
            elif local is None:
                if config.local is None:
                    raise MessagingError(
                        "messaging.local is not configured and no local transport was given"
                    )
                local = _mqtt(config.local, "local", secrets, persistent_session, self._timer)
            self._local = Link(local, _local_settings(config), self._timer)
            self._northbound: Link | None = None
            if northbound is None and config.northbound_runtime is not None:
                # The nucleus's cloud MQTT proxy: the same IPC connection kind as the local
                # link's, its own connection, on the other bus.
                northbound = IpcTransport.from_environment(
                    config.northbound_runtime,
                    environ,
                    name="northbound",
                    timer=self._timer,
                    bus=Bus.IOT_CORE,
                )
            elif northbound is None and config.northbound is not None:
                northbound = _mqtt(
                    config.northbound, "northbound", secrets, persistent_session, self._timer
                )
            if northbound is not None:
                settings = config.northbound_settings
                forwarder = _forwarder(northbound, settings)
                self._northbound = Link(northbound, settings, self._timer, forwarder)
        except BaseException:
            # A client that failed to build is never closed: its timer thread must not outlive it.
            self._timer.stop()
            raise
        self._closed = False
        self._close_lock = threading.Lock()

    def start(self, *, hold: bool = False) -> MessagingClient:
        """Connects every link in the background (reconnecting on its own); returns self.
        With `hold`, messages received before `release()` (a resumed session's backlog
        among them) wait, up to HOLD_MAX_MESSAGES per link, for the subscriptions made
        meanwhile; replies to requests are never held."""
        self._local.start(hold)
        if self._northbound is not None:
            self._northbound.start(hold)
        return self

    def release(self) -> int:
        """Ends the hold of `start(hold=True)`: delivers what waits, in arrival order, to
        the subscriptions that match it now; returns how many messages were held."""
        return sum(link.release() for link in (self._local, self._northbound) if link is not None)

    def __enter__(self) -> MessagingClient:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- publish ----------------------------------------------------------------------

    def publish(self, topic: str, message: Message, qos: QoS | None = None) -> None:
        """Publishes an envelope on the local broker (default QoS from configuration)."""
        check_not_reserved(topic)
        self._local.publish(topic, message.to_bytes(), qos)

    def publish_northbound(self, topic: str, message: Message, qos: QoS) -> None:
        """Publishes an envelope on the northbound broker."""
        check_not_reserved(topic)
        self._require_northbound().publish(topic, message.to_bytes(), qos)

    def publish_raw(self, topic: str, document: Mapping[str, Any], qos: QoS | None = None) -> None:
        """Publishes a JSON object as it is (no envelope), for consumers outside unskit."""
        check_not_reserved(topic)
        self._local.publish(topic, _json_bytes(document), qos)

    def publish_northbound_raw(self, topic: str, document: Mapping[str, Any], qos: QoS) -> None:
        """Publishes a JSON object as it is (no envelope) on the northbound broker."""
        check_not_reserved(topic)
        self._require_northbound().publish(topic, _json_bytes(document), qos)

    def publish_reserved(
        self, topic: str, message: Message, *, northbound: bool = False, qos: QoS | None = None
    ) -> None:
        """For the library's own state, metric, cfg and log publishers only: no reserved-class
        check. Components publish with `publish`."""
        link = self._require_northbound() if northbound else self._local
        link.publish(topic, message.to_bytes(), qos)

    # -- subscribe ----------------------------------------------------------------------

    def subscribe(
        self,
        topic_filter: str,
        callback: Handler,
        max_concurrency: int | None = None,
        max_messages: int | None = None,
        on_overflow: Handler | None = None,
    ) -> None:
        """Calls `callback(topic, message)` on worker threads for each envelope received;
        `on_overflow(topic, message)`, on the network thread, for one the full queue drops."""
        self._local.subscribe(
            topic_filter, callback, None, max_concurrency, max_messages, on_overflow
        )

    def subscribe_northbound(
        self,
        topic_filter: str,
        callback: Handler,
        qos: QoS,
        max_concurrency: int | None = None,
        max_messages: int | None = None,
        on_overflow: Handler | None = None,
    ) -> None:
        """`subscribe` on the northbound broker, with an explicit QoS."""
        self._require_northbound().subscribe(
            topic_filter, callback, qos, max_concurrency, max_messages, on_overflow
        )

    def unsubscribe(self, topic_filter: str) -> None:
        """Stops a local subscription; queued messages are still handled."""
        self._local.unsubscribe(topic_filter)

    def unsubscribe_northbound(self, topic_filter: str) -> None:
        """Stops a northbound subscription."""
        self._require_northbound().unsubscribe(topic_filter)

    # -- request/reply ----------------------------------------------------------------

    def request(
        self, topic: str, message: Message, timeout_secs: float | None = None
    ) -> RequestFuture:
        """Sends `message` as a request; the future fails with RequestTimeoutError at the
        deadline (`timeout_secs`, else requestTimeoutSeconds; 0 means none)."""
        check_not_reserved(topic)
        self._check_reply_to(message)
        return self._local.request(
            topic, message, timeout_secs, self._config.request_timeout_seconds
        )

    def request_northbound(
        self, topic: str, message: Message, timeout_secs: float | None = None
    ) -> RequestFuture:
        """`request` on the northbound broker."""
        check_not_reserved(topic)
        self._check_reply_to(message)
        return self._require_northbound().request(
            topic, message, timeout_secs, self._config.request_timeout_seconds
        )

    def _check_reply_to(self, message: Message) -> None:
        # No responder answers outside the reply topics: such a request could only time out.
        chosen = message.reply_to
        refusal = None if chosen is None else reply_refusal(chosen, self._reply_prefixes)
        if refusal is not None:
            allowed = ", ".join(repr(p) for p in (REPLY_TOPIC_PREFIX, *self._reply_prefixes))
            raise ValueError(
                f"reply_to {chosen!r} is refused: {refusal.explanation}; responders answer "
                f"only under {allowed} (messaging.replyTopicPrefixes)"
            )

    def cancel_request(self, future: RequestFuture) -> None:
        """Cancels a pending local request; a settled one is left as it is."""
        self._local.settle(future)

    def cancel_request_northbound(self, future: RequestFuture) -> None:
        """Cancels a pending northbound request."""
        self._require_northbound().settle(future)

    def reply(self, request: Message, reply: Message) -> bool:
        """Publishes `reply` to the request's reply_to, carrying its correlation id; False,
        with nothing published, when that is no reply topic (see `reply_refusal`)."""
        return self._reply(self._local, request, reply)

    def reply_northbound(self, request: Message, reply: Message) -> bool:
        """`reply` on the northbound broker."""
        return self._reply(self._require_northbound(), request, reply)

    def reply_refusal(self, request: Message) -> ReplyRefusal | None:
        """Why `reply` would not answer this request (no reply_to, or one outside
        ``lib/reply-`` and messaging.replyTopicPrefixes), or None when it would."""
        return reply_refusal(request.reply_to, self._reply_prefixes)

    def _reply(self, link: Link, request: Message, reply: Message) -> bool:
        reply_to = request.reply_to
        refusal = reply_refusal(reply_to, self._reply_prefixes)
        if refusal is not None:
            # The sender chose the topic, so this is the sender's fault: counted and logged
            # here, once for every responder, never raised into the responder's handler.
            link.count_refused(refusal)
            self._refusals.refused(link.name, request, refusal)
            if self._on_reply_refused is not None:
                self._on_reply_refused(link.name, refusal)
            return False
        assert reply_to is not None
        reply.set_correlation_id(request.correlation_id)
        link.publish(reply_to, reply.to_bytes(), None)
        return True

    # -- state ----------------------------------------------------------------------------

    @staticmethod
    def topic_matches_filter(topic_filter: str, topic: str) -> bool:
        """MQTT topic-filter matching (`+` one level, `#` the rest)."""
        return topic_matches_filter(topic_filter, topic)

    def connected(self) -> bool:
        """The local link only: it backs readiness, and a northbound outage never changes it."""
        return self._local.transport.is_connected()

    def within_failover_grace(self) -> bool:
        """The local link is down, but for less than its failover grace period (only with a
        broker list): readiness holds through a failover."""
        return self._local.transport.within_failover_grace()

    @property
    def has_northbound(self) -> bool:
        """Whether a northbound broker is configured."""
        return self._northbound is not None

    def link_status(self, northbound: bool = False) -> dict[str, Any]:
        """JSON-ready facts of the local (or northbound) link for sb/status."""
        transport = (self._require_northbound() if northbound else self._local).transport
        return {
            "connected": transport.is_connected(),
            "endpoint": transport.endpoint,
            "failovers": transport.failovers,
            "refusedSubscriptions": transport.refused_subscriptions,
        }

    def small_messages_only(self) -> bool:
        """Whether the local link carries only small payloads (the edge runtime's IPC bus):
        a choice of payload size, such as a thumbnail's, takes the small one."""
        return self._local.transport.small_messages_only

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Blocks until the local link is up (True) or `timeout` seconds pass (False)."""
        return self._local.wait_connected(timeout)

    def subscriptions_acknowledged(self) -> bool:
        """Whether the local link is up and the broker acknowledged every subscription made
        with `subscribe` since it came up, the reply filter ``lib/reply-{token}/#`` included."""
        return self._local.subscriptions_acknowledged()

    def side_client(self, role: str) -> MessagingClient:
        """A started client of its own beside this one: the same local broker settings, on
        the endpoint this link is on now, with a clean session and client id
        ``{client id}-{role}``; for a short side task (a probe) that must not wait behind
        this client's start-up hold. The caller closes it."""
        local = self._config.local
        if local is None:
            raise MessagingError("no local broker configured to open a side client on")
        host, _, port = self._local.transport.endpoint.rpartition(":")
        side = replace(
            local,
            host=host.strip("[]"),
            port=int(port),
            failover=(),
            client_id=f"{local.client_id}-{role}",
            store_and_forward=None,
        )
        client = MessagingClient(
            MessagingConfig(local=side), secrets=self._secrets, persistent_session=False
        )
        return client.start()

    def wait_subscribed(self, timeout: float, *, northbound: bool = False) -> bool:
        """Blocks until the broker acknowledged every local (or northbound) subscription
        made so far (True), or `timeout` seconds pass (False)."""
        link = self._require_northbound() if northbound else self._local
        return link.wait_subscriptions_acknowledged(timeout)

    def publish_status(self, northbound: bool = False) -> PublishStatus:
        """The local (or northbound) link's publishing: connected, backlog, failures."""
        link = self._require_northbound() if northbound else self._local
        transport = link.transport
        config = self._config.northbound_settings if northbound else _local_settings(self._config)
        after = (
            DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS
            if config is None
            else config.publish_degraded_after_seconds
        )
        if link.forwarder is not None:
            # Stored entries are the unacknowledged backlog; what the bounds removed is lost.
            outbox = link.forwarder.outbox.status()
            return PublishStatus(
                transport.is_connected(),
                outbox.entries,
                transport.publish_failures() + outbox.lost,
                outbox.oldest_age_s,
                after,
            )
        return PublishStatus(
            transport.is_connected(),
            transport.publish_backlog(),
            transport.publish_failures(),
            transport.publish_oldest_age(),
            after,
        )

    def outbox_status(self) -> OutboxStatus | None:
        """The northbound outbox's depth and losses; None without store-and-forward."""
        link = self._northbound
        if link is None or link.forwarder is None:
            return None
        return link.forwarder.outbox.status()

    def northbound_connected(self) -> bool:
        """The northbound link's state (False when none is configured); never readiness."""
        return self._northbound is not None and self._northbound.transport.is_connected()

    def stats(self, northbound: bool = False) -> LinkStats:
        """Counters of the local (or northbound) link, with drops per subscription."""
        link = self._require_northbound() if northbound else self._local
        link.stats.dropped = {f: s.dropped for f, s in link.subscriptions.items()}
        # Only a transport with SUBACKs (MQTT) has subscriptions refused.
        link.stats.refused_subscriptions = getattr(link.transport, "subscribe_refusals", 0)
        return link.stats

    def queued(self, topic_filter: str, northbound: bool = False) -> int:
        """Messages of a subscription waiting for a worker (0 when there is none)."""
        link = self._require_northbound() if northbound else self._local
        subscription = link.subscriptions.get(topic_filter)
        return 0 if subscription is None else subscription.queued

    def pending_requests(self, northbound: bool = False) -> int:
        """Requests still waiting for a reply."""
        link = self._require_northbound() if northbound else self._local
        return len(link.pending)

    def close(self, timeout: float = 5.0) -> None:
        """Fails pending requests, drains subscriptions, flushes QoS 1/2, disconnects."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout
        for link in (self._northbound, self._local):
            if link is not None:
                link.close(max(0.0, deadline - time.monotonic()))
        self._timer.stop()

    def _require_northbound(self) -> Link:
        if self._northbound is None:
            raise MessagingError("no northbound broker is configured (messaging.northbound)")
        return self._northbound


def _json_bytes(document: Mapping[str, Any]) -> bytes:
    if not isinstance(document, Mapping):
        raise TypeError(
            f"a raw publish takes a JSON object (a mapping), not {type(document).__name__}"
        )
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def _mqtt(
    config: BrokerConfig,
    name: str,
    secrets: SecretResolver | None,
    persistent_session: bool,
    timer: DeadlineTimer,
) -> Transport:
    # The request deadlines' timer also paces the retries of refused subscriptions.
    return MqttTransport(
        config, name=name, secrets=secrets, persistent_session=persistent_session, timer=timer
    )


def _local_settings(config: MessagingConfig) -> BrokerConfig | IpcConfig | None:
    """The local link's settings: its broker's, or the IPC link's."""
    return config.local if config.local is not None else config.local_ipc


def _forwarder(transport: Transport, config: BrokerConfig | IpcConfig | None) -> Forwarder | None:
    outbox_config = None if config is None else config.store_and_forward
    if outbox_config is None:
        return None
    if not hasattr(transport, "publish_tracked") or not hasattr(transport, "on_acknowledged"):
        raise MessagingError(
            "messaging.northbound.storeAndForward needs a transport that reports "
            "acknowledgements (MQTT, or the edge runtime's cloud MQTT proxy)"
        )
    acking: AckingTransport = transport  # type: ignore[assignment]
    return Forwarder(Outbox(outbox_config), acking)
