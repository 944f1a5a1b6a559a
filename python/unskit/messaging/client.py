"""`MessagingClient`: publish/subscribe and request/reply on the local and northbound brokers."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.config.secrets import SecretResolver
from unskit.envelope import Message
from unskit.errors import EnvelopeError, MessagingError, RequestTimeoutError
from unskit.messaging.mqtt import MqttTransport
from unskit.messaging.reply_to import RefusalLog, ReplyRefusal, reply_refusal
from unskit.messaging.requests import DeadlineTimer, ReplyTopics, RequestFuture
from unskit.messaging.subscriptions import Handler, Subscription
from unskit.messaging.transport import QoS, Transport
from unskit.topics import REPLY_TOPIC_PREFIX, check_not_reserved, topic_matches_filter

__all__ = ["HOLD_MAX_MESSAGES", "LinkStats", "MessagingClient", "PublishStatus"]

_log = logging.getLogger(__name__)

# Distinct topics whose matching subscriptions are remembered before the memo starts over.
MATCH_CACHE_SIZE = 10_000
# Malformed frames are counted always, logged first and then every this many.
REJECT_LOG_EVERY = 1_000
#: Messages a held link keeps for `release` (start-up: a resumed session's backlog);
#: beyond it new ones are dropped, counted and logged.
HOLD_MAX_MESSAGES = 10_000


@dataclass
class LinkStats:
    """Counters of one broker link."""

    received: int = 0
    rejected: int = 0
    stragglers: int = 0
    published: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    #: Replies not published, by `ReplyRefusal` value: no reply_to, or one that is not a
    #: reply topic.
    refused_replies: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PublishStatus:
    """How one link's publishing fares: its state, unacknowledged backlog and losses."""

    connected: bool
    #: QoS 1/2 publishes not yet acknowledged by the broker (queued ones included).
    backlog: int
    #: Publishes lost since start (QoS 0 dropped while down, refused when the queue is full).
    failures: int


class _Link:
    """One broker: its transport, subscriptions and pending requests."""

    def __init__(
        self, transport: Transport, config: BrokerConfig | None, timer: DeadlineTimer
    ) -> None:
        self.transport = transport
        self.publish_qos = QoS(config.qos.publish) if config else QoS.AT_LEAST_ONCE
        self.subscribe_qos = QoS(config.qos.subscribe) if config else QoS.AT_LEAST_ONCE
        self._timer = timer
        self._lock = threading.Lock()
        self.subscriptions: dict[str, Subscription] = {}
        # Unsubscribed but maybe still handling: closing the link waits for them too.
        self._retired: list[Subscription] = []
        # topic -> the subscriptions it matches; cleared whenever subscriptions change.
        self._matching: dict[str, list[Subscription]] = {}
        self.pending: dict[str, RequestFuture] = {}
        self._deadlines: dict[str, int] = {}
        self.replies = ReplyTopics(transport, self.subscribe_qos, timer)
        self._link_changed = threading.Condition()
        self.stats = LinkStats()
        # While not None, non-reply messages wait here in arrival order for `release`.
        self._held: list[tuple[str, bytes | bytearray]] | None = None
        self._hold_lock = threading.Lock()
        self.held_dropped = 0

    @property
    def name(self) -> str:
        return self.transport.name

    def start(self, hold: bool) -> None:
        if hold:
            self._held = []
        self.transport.start(self.on_message, self._on_link)

    def release(self) -> int:
        """Delivers the held messages in order and stops holding; returns how many."""
        # Under the hold lock: a message arriving meanwhile queues behind the held ones.
        with self._hold_lock:
            held = self._held or []
            for topic, payload in held:
                self._deliver(topic, payload)
            self._held = None
        count = len(held)
        if count or self.held_dropped:
            _log.info(
                "messaging %s: %d messages received during start-up delivered, %d dropped",
                self.name,
                count,
                self.held_dropped,
            )
        return count

    def subscriptions_acknowledged(self) -> bool:
        with self._lock:
            filters = list(self.subscriptions)
        return self.transport.acknowledged(filters)

    def _hold(self, topic: str, payload: bytes | bytearray) -> bool:
        with self._hold_lock:
            held = self._held
            if held is None:
                return False
            if len(held) < HOLD_MAX_MESSAGES:
                held.append((topic, payload))
                return True
            self.held_dropped += 1
            dropped = self.held_dropped
        if dropped == 1 or dropped % REJECT_LOG_EVERY == 0:
            _log.warning(
                "messaging %s: %d messages already wait for start-up to end; dropped %d so far",
                self.name,
                HOLD_MAX_MESSAGES,
                dropped,
            )
        return True

    def _on_link(self, up: bool) -> None:
        _log.info("messaging %s: link %s", self.name, "up" if up else "down")
        with self._link_changed:
            self._link_changed.notify_all()

    def wait_connected(self, timeout: float | None) -> bool:
        with self._link_changed:
            return self._link_changed.wait_for(self.transport.is_connected, timeout)

    # -- inbound (transport thread): decode, then hand over without blocking ------------

    def on_message(self, topic: str, payload: bytes | bytearray) -> None:
        self.stats.received += 1
        if topic.startswith(REPLY_TOPIC_PREFIX):
            self._on_reply(topic, payload)
            return
        if self._held is not None and self._hold(topic, payload):
            return
        self._deliver(topic, payload)

    def _deliver(self, topic: str, payload: bytes | bytearray) -> None:
        matching = self._matching.get(topic)
        if matching is None:
            matching = self._match(topic)
        if not matching:
            return
        message = self._decode(topic, payload)
        if message is None:
            return
        matching[0].offer(topic, message)
        for subscription in matching[1:]:
            # Each subscriber gets its own copy: handlers may change a message in place.
            subscription.offer(topic, Message.from_bytes(payload))

    def _match(self, topic: str) -> list[Subscription]:
        with self._lock:
            matching = [s for s in self.subscriptions.values() if s.matches(topic)]
            # Topics repeat: matching them once saves the filter walk per message.
            if len(self._matching) >= MATCH_CACHE_SIZE:
                self._matching.clear()
            self._matching[topic] = matching
        return matching

    def _decode(self, topic: str, payload: bytes | bytearray) -> Message | None:
        try:
            return Message.from_bytes(payload)
        except EnvelopeError as error:
            self.stats.rejected += 1
            rejected = self.stats.rejected
            if rejected == 1 or rejected % REJECT_LOG_EVERY == 0:
                _log.warning(
                    "messaging %s: rejected %d bytes on %r (%s); %d rejected so far",
                    self.name,
                    len(payload),
                    topic,
                    error,
                    rejected,
                )
            return None

    def _on_reply(self, topic: str, payload: bytes | bytearray) -> None:
        with self._lock:
            future = self.pending.get(topic)
        if future is None:
            self.stats.stragglers += 1
            _log.debug("messaging %s: straggler reply on %r dropped", self.name, topic)
            return
        reply = self._decode(topic, payload)
        if reply is None:
            return
        if reply.correlation_id != future.correlation_id:
            self.stats.stragglers += 1
            _log.debug(
                "messaging %s: reply on %r carries correlation id %r, not %r; dropped",
                self.name,
                topic,
                reply.correlation_id,
                future.correlation_id,
            )
            return
        self.settle(future, reply=reply)

    # -- the one settle path: reply, deadline and cancel all end here -------------------

    def settle(
        self,
        future: RequestFuture,
        *,
        reply: Message | None = None,
        error: BaseException | None = None,
    ) -> bool:
        with self._lock:
            if self.pending.get(future.reply_topic) is not future:
                return False
            del self.pending[future.reply_topic]
            handle = self._deadlines.pop(future.reply_topic, None)
        # The waiter is woken first; the clean-up below does not delay the reply.
        if reply is not None:
            settled = future._resolve(reply)
        elif error is not None:
            settled = future._fail(error)
        else:
            settled = future._cancel()
        if handle is not None:
            self._timer.cancel(handle)
        self.replies.release(future.reply_topic)
        return settled

    # -- outbound -------------------------------------------------------------------------

    def count_refused(self, refusal: ReplyRefusal) -> None:
        with self._lock:  # responders reply from many worker threads
            refused = self.stats.refused_replies
            refused[refusal.value] = refused.get(refusal.value, 0) + 1

    def publish(self, topic: str, payload: bytes, qos: QoS | None) -> None:
        self.transport.publish(topic, payload, self.publish_qos if qos is None else QoS(qos))
        self.stats.published += 1

    def subscribe(
        self,
        topic_filter: str,
        handler: Handler,
        qos: QoS | None,
        max_concurrency: int | None,
        max_messages: int | None,
    ) -> None:
        _check_filter(topic_filter)
        subscription = Subscription(
            topic_filter, handler, max_concurrency=max_concurrency, max_messages=max_messages
        )
        with self._lock:
            if topic_filter in self.subscriptions:
                raise ValueError(
                    f"already subscribed to {topic_filter!r} on {self.name}; unsubscribe first"
                )
            self.subscriptions[topic_filter] = subscription
            self._matching.clear()
        try:
            self.transport.subscribe(
                [topic_filter], self.subscribe_qos if qos is None else QoS(qos)
            )
        except BaseException:
            with self._lock:
                self.subscriptions.pop(topic_filter, None)
                self._matching.clear()
            raise

    def unsubscribe(self, topic_filter: str) -> None:
        with self._lock:
            subscription = self.subscriptions.pop(topic_filter, None)
            self._matching.clear()
        if subscription is None:
            return
        self.transport.unsubscribe([topic_filter])
        subscription.close(timeout=0)
        with self._lock:
            self._retired = [s for s in self._retired if s.closing_workers] + [subscription]

    def request(
        self, topic: str, message: Message, timeout_secs: float | None, default_timeout: float
    ) -> RequestFuture:
        deadline = default_timeout if timeout_secs is None else timeout_secs
        if deadline < 0:
            raise ValueError(f"timeout_secs must be 0 (no deadline) or more, not {deadline}")
        chosen = message.reply_to
        reply_topic = self.replies.take() if chosen is None else chosen
        request = message.make_request(reply_topic)
        future = RequestFuture(topic, reply_topic, request.correlation_id, deadline or None)
        with self._lock:
            if reply_topic in self.pending:
                raise MessagingError(f"a request already waits for replies on {reply_topic!r}")
            self.pending[reply_topic] = future
        try:
            if chosen is not None:
                self.replies.adopt(chosen)
            if deadline:
                expired = RequestTimeoutError(
                    f"no reply on {reply_topic!r} to the request on {topic!r} within {deadline} s"
                )

                def expire() -> None:
                    self.settle(future, error=expired)

                handle = self._timer.call_later(deadline, expire)
                with self._lock:
                    if reply_topic in self.pending:
                        self._deadlines[reply_topic] = handle
                    else:  # settled already
                        self._timer.cancel(handle)
            self.publish(topic, request.to_bytes(), None)
        except BaseException as error:
            self.settle(future, error=error)
            raise
        self.replies.maintain()
        return future

    def close(self, timeout: float) -> None:
        with self._lock:
            pending = list(self.pending.values())
            subscriptions = [*self.subscriptions.values(), *self._retired]
            self.subscriptions.clear()
            self._retired.clear()
            self._matching.clear()
        for future in pending:
            self.settle(future, error=MessagingError(f"messaging {self.name} closed"))
        self.replies.close()
        # One deadline for the whole link: n subscriptions must not add up to n timeouts.
        deadline = time.monotonic() + timeout
        for subscription in subscriptions:
            subscription.close(max(0.0, deadline - time.monotonic()))
        self.transport.close(max(0.0, deadline - time.monotonic()))


def _check_filter(topic_filter: str) -> None:
    if not topic_filter:
        raise ValueError("a topic filter must not be empty")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"topic filter {topic_filter!r}: '#' must be the whole last level")
        if "+" in level and level != "+":
            raise ValueError(f"topic filter {topic_filter!r}: '+' must be a whole level")


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
    ) -> None:
        self._config = config
        self._reply_prefixes = tuple(config.reply_topic_prefixes)
        self._refusals = RefusalLog(_log)
        self._on_reply_refused = on_reply_refused
        self._timer = DeadlineTimer()
        if local is None:
            if config.local is None:
                raise MessagingError(
                    "messaging.local is not configured and no local transport was given"
                )
            local = _mqtt(config.local, "local", secrets, persistent_session)
        self._local = _Link(local, config.local, self._timer)
        self._northbound: _Link | None = None
        if northbound is None and config.northbound is not None:
            northbound = _mqtt(config.northbound, "northbound", secrets, persistent_session)
        if northbound is not None:
            self._northbound = _Link(northbound, config.northbound, self._timer)
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
    ) -> None:
        """Calls `callback(topic, message)` on worker threads for each envelope received."""
        self._local.subscribe(topic_filter, callback, None, max_concurrency, max_messages)

    def subscribe_northbound(
        self,
        topic_filter: str,
        callback: Handler,
        qos: QoS,
        max_concurrency: int | None = None,
        max_messages: int | None = None,
    ) -> None:
        """`subscribe` on the northbound broker, with an explicit QoS."""
        self._require_northbound().subscribe(
            topic_filter, callback, qos, max_concurrency, max_messages
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
        return self._local.request(
            topic, message, timeout_secs, self._config.request_timeout_seconds
        )

    def request_northbound(
        self, topic: str, message: Message, timeout_secs: float | None = None
    ) -> RequestFuture:
        """`request` on the northbound broker."""
        check_not_reserved(topic)
        return self._require_northbound().request(
            topic, message, timeout_secs, self._config.request_timeout_seconds
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

    def _reply(self, link: _Link, request: Message, reply: Message) -> bool:
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

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Blocks until the local link is up (True) or `timeout` seconds pass (False)."""
        return self._local.wait_connected(timeout)

    def subscriptions_acknowledged(self) -> bool:
        """Whether the local link is up and the broker acknowledged every subscription made
        with `subscribe` since it came up (reply subscriptions aside)."""
        return self._local.subscriptions_acknowledged()

    def publish_status(self, northbound: bool = False) -> PublishStatus:
        """The local (or northbound) link's publishing: connected, backlog, failures."""
        transport = (self._require_northbound() if northbound else self._local).transport
        return PublishStatus(
            transport.is_connected(), transport.publish_backlog(), transport.publish_failures()
        )

    def northbound_connected(self) -> bool:
        """The northbound link's state (False when none is configured); never readiness."""
        return self._northbound is not None and self._northbound.transport.is_connected()

    def stats(self, northbound: bool = False) -> LinkStats:
        """Counters of the local (or northbound) link, with drops per subscription."""
        link = self._require_northbound() if northbound else self._local
        link.stats.dropped = {f: s.dropped for f, s in link.subscriptions.items()}
        return link.stats

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

    def _require_northbound(self) -> _Link:
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
    config: BrokerConfig, name: str, secrets: SecretResolver | None, persistent_session: bool
) -> Transport:
    return MqttTransport(config, name=name, secrets=secrets, persistent_session=persistent_session)
