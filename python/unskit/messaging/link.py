"""`Link`: one broker link of the messaging client, with its transport, subscriptions, held
messages and pending requests."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from unskit.config.messaging import IpcConfig
from unskit.config.model import BrokerConfig
from unskit.envelope import Message
from unskit.errors import EnvelopeError, MessagingError, RequestTimeoutError
from unskit.messaging.outbox import Forwarder
from unskit.messaging.reply_to import ReplyRefusal
from unskit.messaging.requests import DEADLINE_TAG, DeadlineTimer, ReplyTopics, RequestFuture
from unskit.messaging.subscriptions import Handler, Subscription
from unskit.messaging.transport import QoS, Transport
from unskit.topics import REPLY_TOPIC_PREFIX

__all__ = ["HOLD_MAX_MESSAGES", "Link", "LinkStats"]

# The messaging client's logger: a link logs as the client did before the two were split.
_log = logging.getLogger("unskit.messaging.client")

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
    #: Replies dropped: late (their request settled), for no request at all, or carrying
    #: another request's correlation id.
    stragglers: int = 0
    published: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    #: Replies not published, by `ReplyRefusal` value: no reply_to, or one that is not a
    #: reply topic.
    refused_replies: dict[str, int] = field(default_factory=dict)
    #: Filters the broker refused in a SUBACK, every retry counted.
    refused_subscriptions: int = 0


class Link:
    """One broker: its transport, subscriptions and pending requests."""

    def __init__(
        self,
        transport: Transport,
        config: BrokerConfig | IpcConfig | None,
        timer: DeadlineTimer,
        forwarder: Forwarder | None = None,
    ) -> None:
        self.transport = transport
        #: The store-and-forward outbox's replay, when configured: every publish goes
        #: through it, so none is lost; live ones go out beside the stored backlog.
        self.forwarder = forwarder
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
        self.replies = ReplyTopics(
            transport, self.subscribe_qos, timer, client_id=config.client_id if config else None
        )
        self._link_changed = threading.Condition()
        self.stats = LinkStats()
        # While not None, non-reply messages wait here in arrival order for `release`.
        self._held: list[tuple[str, bytes | bytearray]] | None = None
        self._hold_lock = threading.Lock()
        self.held_dropped = 0

    @property
    def name(self) -> str:
        """The transport's name: `local` or `northbound`."""
        return self.transport.name

    def start(self, hold: bool) -> None:
        """Starts the transport; with `hold`, messages wait for `release`."""
        if hold:
            self._held = []
        self.transport.start(self.on_message, self._on_link)
        # Before readiness: the reply filter is one of the subscriptions it waits for.
        self.replies.open()
        if self.forwarder is not None:
            self.forwarder.start()

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
        """Whether the broker acknowledged every subscription on this connection, the
        reply filter included."""
        with self._lock:
            filters = [*self.subscriptions, self.replies.filter]
        return self.transport.acknowledged(filters)

    def wait_subscriptions_acknowledged(self, timeout: float) -> bool:
        """Blocks until `subscriptions_acknowledged` (True) or `timeout` seconds pass."""
        with self._lock:
            filters = [*self.subscriptions, self.replies.filter]
        return self.transport.wait_acknowledged(filters, timeout)

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
        if self.forwarder is not None:
            self.forwarder.link_changed(up)
        with self._link_changed:
            self._link_changed.notify_all()

    def wait_connected(self, timeout: float | None) -> bool:
        """Blocks until the link is up (True) or `timeout` seconds pass (False)."""
        with self._link_changed:
            return self._link_changed.wait_for(self.transport.is_connected, timeout)

    # -- inbound (transport thread): decode, then hand over without blocking ------------

    def on_message(self, topic: str, payload: bytes | bytearray) -> None:
        """Takes one message from the transport's thread: a reply, held, or delivered."""
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
        """Settles a pending request once (reply, error, or cancel when neither); False if
        it was settled already."""
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
        """Counts a reply not published, by refusal."""
        with self._lock:  # responders reply from many worker threads
            refused = self.stats.refused_replies
            refused[refusal.value] = refused.get(refusal.value, 0) + 1

    def publish(self, topic: str, payload: bytes, qos: QoS | None) -> None:
        """Publishes bytes at `qos`, or at the link's default QoS when None (through the
        outbox when there is one)."""
        chosen = self.publish_qos if qos is None else QoS(qos)
        if self.forwarder is not None:
            # A publish the link can never send (QoS 2 on the edge runtime's proxy) is
            # refused now: once stored, the outbox could only retry it forever.
            check = getattr(self.transport, "check_publish", None)
            if check is not None:
                check(topic, chosen)
            self.forwarder.publish(topic, payload, chosen)
        else:
            self.transport.publish(topic, payload, chosen)
        self.stats.published += 1

    def subscribe(
        self,
        topic_filter: str,
        handler: Handler,
        qos: QoS | None,
        max_concurrency: int | None,
        max_messages: int | None,
        on_overflow: Handler | None = None,
    ) -> None:
        """Adds a subscription and subscribes the transport; a filter may be used once."""
        _check_filter(topic_filter)
        subscription = Subscription(
            topic_filter,
            handler,
            max_concurrency=max_concurrency,
            max_messages=max_messages,
            on_overflow=on_overflow,
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
        """Stops a subscription; its queued messages are still handled."""
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
        """Publishes a request with a reply topic and a deadline; returns its future."""
        deadline = default_timeout if timeout_secs is None else timeout_secs
        if deadline < 0:
            raise ValueError(f"timeout_secs must be 0 (no deadline) or more, not {deadline}")
        chosen = message.reply_to
        reply_topic = self.replies.take() if chosen is None else chosen
        request = message.make_request(reply_topic)
        if deadline:
            request.inject_tag(DEADLINE_TAG, str(int((time.time() + deadline) * 1000)))
        future = RequestFuture(topic, reply_topic, request.correlation_id, deadline or None)
        with self._lock:
            if reply_topic in self.pending:
                raise MessagingError(f"a request already waits for replies on {reply_topic!r}")
            self.pending[reply_topic] = future
        try:
            if chosen is not None:
                self.replies.adopt(chosen)
            if deadline:

                def expire() -> None:
                    # Built only when it fires: most requests are answered.
                    expired = RequestTimeoutError(
                        f"no reply on {reply_topic!r} to the request on {topic!r} "
                        f"within {deadline} s"
                    )
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
        return future

    def close(self, timeout: float) -> None:
        """Fails pending requests, drains subscriptions, closes the transport, within `timeout`."""
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
        forwarder = self.forwarder
        if forwarder is not None:
            forwarder.close(max(0.0, deadline - time.monotonic()))
        self.transport.close(max(0.0, deadline - time.monotonic()))
        if forwarder is not None:
            # Acknowledgements that came in while the transport flushed are deleted; the
            # rest stays stored for the next start.
            forwarder.flush_acknowledged()
            forwarder.outbox.close()


def _check_filter(topic_filter: str) -> None:
    if not topic_filter:
        raise ValueError("a topic filter must not be empty")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"topic filter {topic_filter!r}: '#' must be the whole last level")
        if "+" in level and level != "+":
            raise ValueError(f"topic filter {topic_filter!r}: '+' must be a whole level")
