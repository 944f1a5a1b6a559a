"""Reply topics: one subscription per connection (`lib/reply-{token}/#`), a fresh topic
under it per request, replies routed by topic and correlation id (issue 28)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.messaging.conftest import broker_config
from tests.messaging.test_client import broker_has_subscriber, echo_pair, reading, reply_filters
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit import Message, MessageBuilder
from unskit.errors import RequestTimeoutError
from unskit.messaging import REPLY_TOPIC_PREFIX, QoS
from unskit.messaging.requests import DeadlineTimer, ReplyTopics, reply_token


class RecordingLink:
    """The transport seam's subscribe/unsubscribe, recorded packet by packet."""

    def __init__(self) -> None:
        self.packets: list[tuple[str, list[str]]] = []

    def subscribe(self, topic_filters: Sequence[str], qos: QoS) -> None:
        self.packets.append(("SUBSCRIBE", list(topic_filters)))

    def unsubscribe(self, topic_filters: Sequence[str]) -> None:
        self.packets.append(("UNSUBSCRIBE", list(topic_filters)))


def replies(
    linger_secs: float = 60.0, client_id: str | None = "gw-1"
) -> tuple[ReplyTopics, RecordingLink, DeadlineTimer]:
    link, timer = RecordingLink(), DeadlineTimer()
    topics = ReplyTopics(
        link,  # type: ignore[arg-type]
        QoS.AT_LEAST_ONCE,
        timer,
        client_id=client_id,
        batch=4,
        linger_secs=linger_secs,
    )
    return topics, link, timer


def test_one_subscribe_serves_every_request_and_every_topic_is_fresh():
    topics, link, timer = replies()
    topics.open()
    topics.open()  # once per link
    taken = [topics.take() for _ in range(100)]
    for topic in taken:
        topics.release(topic)
    topics.flush()
    timer.stop()
    assert topics.filter == f"{REPLY_TOPIC_PREFIX}gw-1/#"
    assert link.packets == [("SUBSCRIBE", [topics.filter])]
    assert len(set(taken)) == 100
    assert all(t.startswith(f"{REPLY_TOPIC_PREFIX}gw-1/") and t.count("/") == 2 for t in taken)
    assert all(topics.owns(t) for t in taken)


def test_two_links_with_one_client_id_never_share_a_reply_topic():
    # A restarted process keeps its client id (and filter); its topics must differ from
    # the last run's, so a late reply to the old run can never land on a new request.
    first, _, timer1 = replies()
    second, _, timer2 = replies()
    timer1.stop(), timer2.stop()
    assert first.filter == second.filter
    assert {first.take() for _ in range(50)}.isdisjoint({second.take() for _ in range(50)})


@pytest.mark.parametrize(
    "client_id", ["a/b", "plus+", "hash#", "sp ace", "x" * 65, "", "ü", "lib/reply-x/#"]
)
def test_a_client_id_unsafe_in_a_topic_level_is_hashed(client_id):
    token = reply_token(client_id)
    assert token.startswith("h")
    assert len(token) == 25
    assert not set(token) & set("/+#")
    assert token == reply_token(client_id)  # stable across runs
    assert token != reply_token(client_id + "1")


def test_a_safe_client_id_is_its_own_token_and_none_gets_a_random_one():
    assert reply_token("gw-1_a.b") == "gw-1_a.b"
    assert reply_token(None) != reply_token(None)
    assert reply_token(None).startswith("r")


def test_a_chosen_topic_under_the_filter_costs_no_packet():
    topics, link, timer = replies()
    topics.open()
    mine = f"{REPLY_TOPIC_PREFIX}gw-1/mine"
    topics.adopt(mine)
    topics.release(mine)
    topics.flush()
    timer.stop()
    assert link.packets == [("SUBSCRIBE", [topics.filter])]


def test_a_chosen_topic_elsewhere_is_subscribed_and_unsubscribed_after_the_linger():
    topics, link, timer = replies(linger_secs=0.05)
    topics.adopt("lib/reply-mine")
    assert link.packets == [("SUBSCRIBE", ["lib/reply-mine"])]
    topics.release("lib/reply-mine")
    wait_until(lambda: link.packets[-1] == ("UNSUBSCRIBE", ["lib/reply-mine"]), 5, "the flush")
    timer.stop()


def test_a_chosen_topic_reused_before_its_unsubscribe_keeps_its_subscription():
    topics, link, timer = replies()
    topics.adopt("lib/reply-mine")
    topics.release("lib/reply-mine")
    topics.adopt("lib/reply-mine")  # still subscribed: no second SUBSCRIBE
    topics.flush()
    timer.stop()
    assert link.packets == [("SUBSCRIBE", ["lib/reply-mine"])]


def test_close_unsubscribes_the_filter_and_the_settled_chosen_topics():
    topics, link, timer = replies()
    topics.open()
    topics.adopt("lib/reply-mine")
    topics.release("lib/reply-mine")
    topics.close()
    timer.stop()
    assert link.packets[-1] == ("UNSUBSCRIBE", ["lib/reply-mine", topics.filter])


# -- against Mosquitto ------------------------------------------------------------------


def capturing_responder(make_client, port: int, topic: str):
    """A client that keeps the requests it receives, without answering, once it listens."""
    responder = make_client(broker_config(port))
    received: list[Message] = []
    responder.subscribe(topic, lambda _topic, request: received.append(request))
    wait_until(responder.subscriptions_acknowledged, 10, "the responder's SUBACK")
    return responder, received


def sent_and_received(requester, received, topic: str, timeout_secs: float):
    future = requester.request(topic, reading(), timeout_secs=timeout_secs)
    wait_until(
        lambda: any(r.correlation_id == future.correlation_id for r in received), 10, "request"
    )
    return future, next(r for r in received if r.correlation_id == future.correlation_id)


def test_many_requests_share_one_reply_subscription(broker, make_client, topic_root):
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    requester, _ = echo_pair(make_client, broker.plain_port, topic)
    transport = requester._local.transport
    before = transport.subscribes_sent
    futures = [requester.request(topic, reading(i), timeout_secs=10) for i in range(200)]
    assert [f.get(10).body for f in futures] == [{"value": i} for i in range(200)]
    assert len({f.reply_topic for f in futures}) == 200
    assert all(requester._local.replies.owns(f.reply_topic) for f in futures)
    assert transport.subscribes_sent == before  # no SUBSCRIBE per request
    assert reply_filters(requester) == {requester._local.replies.filter}
    assert requester.pending_requests() == 0


def test_readiness_waits_for_the_reply_filter(broker, make_client):
    client = make_client(broker_config(broker.plain_port))
    wait_until(client.subscriptions_acknowledged, 10, "the reply filter's SUBACK")
    transport = client._local.transport
    assert transport.acknowledged([client._local.replies.filter])
    # Forget that SUBACK alone: readiness must no longer hold.
    with transport._lock:
        transport._acknowledged.discard(client._local.replies.filter)
    assert not client.subscriptions_acknowledged()


def test_a_late_reply_is_dropped_and_counted(broker, make_client, topic_root):
    topic = f"{topic_root}/gw/c/cmd/sb/slow"
    responder, received = capturing_responder(make_client, broker.plain_port, topic)
    requester = make_client(broker_config(broker.plain_port))
    wait_until(requester.subscriptions_acknowledged, 10, "the reply filter")
    future, request = sent_and_received(requester, received, topic, 0.3)
    with pytest.raises(RequestTimeoutError):
        future.get(10)
    assert requester.pending_requests() == 0
    before = requester.stats().stragglers
    assert responder.reply(request, MessageBuilder("late", "1").body({}).build())
    wait_until(lambda: requester.stats().stragglers == before + 1, 10, "the straggler count")
    assert requester.pending_requests() == 0


def test_a_foreign_correlation_id_never_completes_a_pending_request(
    broker, make_client, topic_root
):
    topic = f"{topic_root}/gw/c/cmd/sb/held"
    responder, received = capturing_responder(make_client, broker.plain_port, topic)
    requester = make_client(broker_config(broker.plain_port))
    wait_until(requester.subscriptions_acknowledged, 10, "the reply filter")
    future, request = sent_and_received(requester, received, topic, 0)
    assert request.reply_to == future.reply_topic
    forged = MessageBuilder("forged", "1").body({"forged": True}).build()
    forged.set_correlation_id("someone-else")
    before = requester.stats().stragglers
    responder.publish_reserved(future.reply_topic, forged)
    wait_until(lambda: requester.stats().stragglers == before + 1, 10, "the straggler count")
    assert not future.done()
    assert requester.pending_requests() == 1
    assert responder.reply(request, MessageBuilder("real", "1").body({"real": True}).build())
    assert future.get(10).body == {"real": True}
    assert future.correlation_id == request.correlation_id


def test_a_reply_for_no_request_is_dropped_and_counted(broker, make_client):
    requester = make_client(broker_config(broker.plain_port))
    other = make_client(broker_config(broker.plain_port))
    wait_until(requester.subscriptions_acknowledged, 10, "the reply filter")
    stray = MessageBuilder("stray", "1").body({}).build()
    other.publish_reserved(f"{requester._local.replies.filter[:-1]}nobody-7", stray)
    wait_until(lambda: requester.stats().stragglers == 1, 10, "the straggler count")
    assert requester.pending_requests() == 0


def test_a_reply_topic_chosen_by_the_caller_can_be_used_again_at_once(
    broker, make_client, topic_root
):
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    requester, _ = echo_pair(make_client, broker.plain_port, topic)
    mine = f"{REPLY_TOPIC_PREFIX}{topic_root.replace('/', '-')}"
    for i in range(3):
        reply = requester.request(topic, reading(i).make_request(mine), timeout_secs=10).get()
        assert reply.body == {"value": i}
    wait_until(lambda: mine not in reply_filters(requester), 5, "the chosen topic's UNSUBSCRIBE")
    assert reply_filters(requester) == {requester._local.replies.filter}


def test_closing_the_client_leaves_no_reply_subscription(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    future = client.request(f"{topic_root}/gw/c/cmd/sb/nobody", reading(), timeout_secs=0)
    assert reply_filters(client) == {client._local.replies.filter}
    client.close(timeout=2)
    assert future.done()
    assert reply_filters(client) == set()


@server_fixture
def own_broker(tmp_path, pki):
    mosquitto = Mosquitto(tmp_path / "mosquitto", pki).start()
    yield mosquitto
    mosquitto.stop()


@pytest.mark.slow
def test_the_reply_filter_is_restored_after_a_broker_restart(own_broker, make_client, topic_root):
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    requester, responder = echo_pair(make_client, own_broker.plain_port, topic)
    transport = requester._local.transport
    assert requester.request(topic, reading(0), timeout_secs=10).get().body == {"value": 0}
    before = transport.subscribes_sent
    own_broker.restart()
    wait_until(requester.subscriptions_acknowledged, 30, "the requester's restored filter")
    wait_until(responder.subscriptions_acknowledged, 30, "the responder's restored filter")
    wait_until(lambda: broker_has_subscriber(requester, topic), 10, "the responder")
    restored = transport.subscribes_sent
    assert restored == before + 1  # the restore on reconnect, nothing else
    got = [requester.request(topic, reading(i), timeout_secs=10).get() for i in range(20)]
    assert [m.body for m in got] == [{"value": i} for i in range(20)]
    assert transport.subscribes_sent == restored  # no SUBSCRIBE per request after it


def test_a_client_id_unsafe_in_a_topic_gets_working_replies(broker, make_client, topic_root):
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    responder = make_client(broker_config(broker.plain_port))
    responder.subscribe(
        topic, lambda _t, m: responder.reply(m, MessageBuilder("e", "1").body(m.body).build())
    )
    odd_id = f"odd/{topic_root}+#id"
    requester = make_client(broker_config(broker.plain_port, client_id=odd_id))
    wait_until(requester.subscriptions_acknowledged, 10, "the hashed reply filter")
    wait_until(responder.subscriptions_acknowledged, 10, "the responder")
    assert requester._local.replies.filter == f"{REPLY_TOPIC_PREFIX}{reply_token(odd_id)}/#"
    assert requester.request(topic, reading(3), timeout_secs=10).get().body == {"value": 3}


def test_a_reply_on_one_requests_topic_with_anothers_correlation_id_completes_neither(
    broker, make_client, topic_root
):
    topic = f"{topic_root}/gw/c/cmd/sb/held"
    responder, received = capturing_responder(make_client, broker.plain_port, topic)
    requester = make_client(broker_config(broker.plain_port))
    wait_until(requester.subscriptions_acknowledged, 10, "the reply filter")
    first, first_request = sent_and_received(requester, received, topic, 0)
    second, second_request = sent_and_received(requester, received, topic, 0)
    crossed = MessageBuilder("crossed", "1").body({}).build()
    crossed.set_correlation_id(first.correlation_id)
    before = requester.stats().stragglers
    responder.publish_reserved(second.reply_topic, crossed)
    wait_until(lambda: requester.stats().stragglers == before + 1, 10, "the straggler count")
    assert not first.done()
    assert not second.done()
    assert responder.reply(second_request, MessageBuilder("ok", "1").body({"n": 2}).build())
    assert responder.reply(first_request, MessageBuilder("ok", "1").body({"n": 1}).build())
    assert second.get(10).body == {"n": 2}
    assert first.get(10).body == {"n": 1}
