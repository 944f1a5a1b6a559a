"""MessagingClient against a real Mosquitto: publish/subscribe, request/reply, limits."""

from __future__ import annotations

import threading
import time

import pytest

from tests.messaging.conftest import broker_config
from tests.support.servers import wait_until
from unskit import Message, MessageBuilder
from unskit.errors import MessagingError, RequestTimeoutError, ReservedTopicError
from unskit.messaging import REPLY_TOPIC_PREFIX, QoS


def broker_has_subscriber(client, topic: str) -> bool:
    """Probes with a request of its own: answered means the responder listens."""
    try:
        client.request(topic, reading("probe"), timeout_secs=0.5).get(1)
    except RequestTimeoutError:
        return False
    return True


def echo_pair(make_client, port: int, topic: str, max_concurrency: int | None = None):
    """A requester and a responder that echoes request bodies on `topic`, once it listens."""
    responder = make_client(broker_config(port))
    requester = make_client(broker_config(port))

    def echo(_topic: str, request: Message) -> None:
        responder.reply(request, MessageBuilder("echo", "1").body(request.body).build())

    responder.subscribe(topic, echo, max_concurrency=max_concurrency)
    wait_until(lambda: broker_has_subscriber(requester, topic), 10, "the responder")
    return requester, responder


def reply_filters(client) -> set[str]:
    """The reply subscriptions the client's local link keeps."""
    return {f for f in client._local.transport.filters if f.startswith(REPLY_TOPIC_PREFIX)}


def reading(value: object = 1) -> Message:
    return MessageBuilder("reading", "1").body({"value": value}).build()


class Inbox:
    """Collects what a subscription delivers; waits on an event, never sleeps."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Message]] = []
        self.probes = 0
        self._cond = threading.Condition()

    def __call__(self, topic: str, message: Message) -> None:
        with self._cond:
            if message.header.name == "probe":
                self.probes += 1
                return
            self.items.append((topic, message))
            self._cond.notify_all()

    def prime(self, publisher, topic: str, timeout: float = 10) -> None:
        """Publishes probes on `topic` until one arrives: the broker has our SUBSCRIBE.
        Probes are never kept as items."""
        probe = MessageBuilder("probe", "1").build()
        wait_until(
            lambda: publisher.publish(topic, probe) or self.probes > 0,
            timeout,
            f"a subscriber on {topic!r}",
            interval=0.05,
        )

    def wait_for(self, count: int, timeout: float = 10) -> list[tuple[str, Message]]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.items) >= count, timeout):
                raise AssertionError(f"got {len(self.items)} of {count} messages")
            return list(self.items)

    def wait_for_uuids(self, uuids: set[str], timeout: float = 10) -> set[str]:
        """Waits until every uuid in `uuids` has arrived (QoS 1 may deliver one twice)."""

        def seen() -> set[str]:
            return {m.header.uuid for _, m in self.items}

        with self._cond:
            if not self._cond.wait_for(lambda: uuids <= seen(), timeout):
                raise AssertionError(f"missing {sorted(uuids - seen())}")
            return seen()


def test_publish_subscribe_round_trip(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    inbox = Inbox()
    client.subscribe(f"{topic_root}/+/c/data/#", inbox)
    sent = [reading(i) for i in range(5)]
    # The SUBSCRIBE was sent before these PUBLISHes on the same connection.
    for message in sent:
        client.publish(f"{topic_root}/gw/c/data/t", message)
    got = inbox.wait_for(5)
    assert [m for _, m in got] == sent
    assert {t for t, _ in got} == {f"{topic_root}/gw/c/data/t"}


def test_foreign_bytes_are_rejected_counted_and_never_delivered(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    inbox = Inbox()
    client.subscribe(f"{topic_root}/#", inbox)
    client.publish_raw(f"{topic_root}/gw/c/data/raw", {"not": "an envelope"})
    client.publish(f"{topic_root}/gw/c/data/ok", reading())
    got = inbox.wait_for(1)
    wait_until(lambda: client.stats().rejected == 1, 5, "the rejection to be counted")
    assert [t for t, _ in got] == [f"{topic_root}/gw/c/data/ok"]


@pytest.mark.parametrize("cls", ["state", "metric", "cfg", "log"])
def test_reserved_topics_are_refused_for_publish_request_and_reply(broker, make_client, cls):
    client = make_client(broker_config(broker.plain_port))
    topic = f"uns/gw/c/{cls}/x"
    with pytest.raises(ReservedTopicError):
        client.publish(topic, reading())
    with pytest.raises(ReservedTopicError):
        client.publish_raw(topic, {"a": 1})
    with pytest.raises(ReservedTopicError):
        client.request(topic, reading())
    # The sender chose the reply_to: refused and counted, never raised into the responder.
    assert client.reply(reading().make_request(topic), reading()) is False
    assert client.stats().refused_replies == {"reserved": 1}
    assert client.stats().published == 0
    assert client.pending_requests() == 0


def start_echo_responder(responder, requester, topic: str) -> None:
    """`responder` answers requests on `topic` with their body; returns once `requester`
    got an answer (a request to a topic nobody subscribed yet would just time out)."""

    def echo(_topic: str, request: Message) -> None:
        responder.reply(request, MessageBuilder("EchoReply", "1").body(request.body).build())

    responder.subscribe(topic, echo)
    wait_until(lambda: broker_has_subscriber(requester, topic), 10, "the responder")


def test_request_reply_copies_the_correlation_id(broker, make_client, topic_root):
    responder = make_client(broker_config(broker.plain_port))
    requester = make_client(broker_config(broker.plain_port))
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    start_echo_responder(responder, requester, topic)
    request = reading(42)
    future = requester.request(topic, request, timeout_secs=10)
    assert future.reply_topic.startswith(REPLY_TOPIC_PREFIX)
    reply = future.get(10)
    assert reply.body == {"value": 42}
    assert reply.correlation_id == future.correlation_id
    assert requester.pending_requests() == 0


def test_request_without_responder_times_out_and_cleans_up(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port), request_timeout_seconds=0.3)
    transport = client._local.transport
    future = client.request(f"{topic_root}/gw/c/cmd/sb/nobody", reading())
    # The reply topic lies under the client's one reply filter: nothing to remove after.
    assert client._local.replies.owns(future.reply_topic)
    with pytest.raises(RequestTimeoutError, match=r"within 0\.3 s"):
        future.get(10)
    assert future.done()
    assert client.pending_requests() == 0
    assert reply_filters(client) == {client._local.replies.filter}
    assert set(transport.filters) == {client._local.replies.filter}


def test_deadline_fails_the_future_even_if_nobody_waits(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    settled = threading.Event()
    future = client.request(f"{topic_root}/gw/c/cmd/sb/nobody", reading(), timeout_secs=0.2)
    future.add_done_callback(lambda _: settled.set())
    assert settled.wait(10)
    assert client.pending_requests() == 0
    with pytest.raises(RequestTimeoutError):
        future.get(0)


def test_per_call_timeout_zero_disables_the_deadline(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port), request_timeout_seconds=0.1)
    future = client.request(f"{topic_root}/gw/c/cmd/sb/nobody", reading(), timeout_secs=0)
    # The caller's own wait gives up; the request itself has no deadline and stays pending.
    with pytest.raises(RequestTimeoutError, match=r"caller's 0\.5 s wait"):
        future.get(0.5)
    assert not future.done()
    assert client.pending_requests() == 1
    client.cancel_request(future)
    assert future.cancelled()
    assert client.pending_requests() == 0


def test_a_wait_is_bounded_by_the_deadline(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    future = client.request(f"{topic_root}/gw/c/cmd/sb/nobody", reading(), timeout_secs=0.2)
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError, match=r"within 0\.2 s"):
        future.get(30)
    assert time.monotonic() - started < 5


def test_straggler_after_cancel_is_dropped(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    other = make_client(broker_config(broker.plain_port))
    request = reading().make_request()
    future = client.request(f"{topic_root}/gw/c/cmd/sb/slow", request)
    client.cancel_request(future)
    client.cancel_request(future)  # idempotent
    assert future.cancelled()
    other.reply(request, reading("late"))
    # The chosen topic's UNSUBSCRIBE may wait for its batch, so the real late reply may
    # still arrive (or not): either way it is dropped and counted, as is one injected here.
    client._local.on_message(future.reply_topic, reading("late").to_bytes())
    assert 1 <= client.stats().stragglers <= 2
    assert future.cancelled()
    assert client.pending_requests() == 0


def test_reply_to_a_message_without_reply_to_is_refused(broker, make_client):
    client = make_client(broker_config(broker.plain_port))
    assert client.reply(reading(), reading()) is False
    assert client.stats().refused_replies == {"missing": 1}
    assert client.stats().published == 0


def test_northbound_needs_configuration(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    with pytest.raises(MessagingError, match="no northbound broker"):
        client.publish_northbound(f"{topic_root}/x", reading(), QoS.AT_LEAST_ONCE)


def test_northbound_publish_and_subscribe(broker, make_client, topic_root):
    client = make_client(
        broker_config(broker.plain_port), northbound=broker_config(broker.password_port)
    )
    # The northbound link carries no username (only a plaintext local broker gets one):
    # the password listener refuses it, and connected() still reports the local link.
    assert client.connected()
    assert not client.northbound_connected()
    nb = make_client(broker_config(broker.plain_port), northbound=broker_config(broker.plain_port))
    wait_until(nb.northbound_connected, 10, "the northbound link")
    inbox = Inbox()
    nb.subscribe_northbound(f"{topic_root}/nb/#", inbox, QoS.AT_LEAST_ONCE)
    nb.publish_northbound(f"{topic_root}/nb/x", reading(7), QoS.AT_LEAST_ONCE)
    assert inbox.wait_for(1)[0][1].body == {"value": 7}
