"""Reply subscriptions: subscribed ahead and removed in batches, each topic used once."""

from __future__ import annotations

from collections.abc import Sequence

from tests.messaging.conftest import broker_config
from tests.messaging.test_client import echo_pair, reading, reply_filters
from tests.support.servers import wait_until
from unskit.messaging import REPLY_TOPIC_PREFIX, QoS
from unskit.messaging.requests import REPLY_BATCH, DeadlineTimer, ReplyTopics


class RecordingLink:
    """The transport seam's subscribe/unsubscribe, recorded packet by packet."""

    def __init__(self) -> None:
        self.packets: list[tuple[str, list[str]]] = []

    def subscribe(self, topic_filters: Sequence[str], qos: QoS) -> None:
        self.packets.append(("SUBSCRIBE", list(topic_filters)))

    def unsubscribe(self, topic_filters: Sequence[str]) -> None:
        self.packets.append(("UNSUBSCRIBE", list(topic_filters)))


def replies(linger_secs: float = 60.0) -> tuple[ReplyTopics, RecordingLink, DeadlineTimer]:
    link, timer = RecordingLink(), DeadlineTimer()
    topics = ReplyTopics(link, QoS.AT_LEAST_ONCE, timer, batch=4, linger_secs=linger_secs)  # type: ignore[arg-type]
    return topics, link, timer


def test_one_subscribe_serves_a_batch_of_requests_and_every_topic_is_fresh():
    topics, link, timer = replies()
    taken = [topics.take() for _ in range(6)]
    timer.stop()
    assert len(set(taken)) == 6
    assert all(t.startswith(REPLY_TOPIC_PREFIX) and "/" not in t[4:] for t in taken)
    assert [kind for kind, _ in link.packets] == ["SUBSCRIBE", "SUBSCRIBE"]
    assert set(taken) <= {t for _, batch in link.packets for t in batch}
    assert len(topics.ready) == 2


def test_maintain_subscribes_ahead_and_unsubscribes_a_full_batch_in_one_packet():
    topics, link, timer = replies()
    taken = [topics.take() for _ in range(3)]
    topics.maintain()
    assert [kind for kind, _ in link.packets] == ["SUBSCRIBE"]  # one topic still unused
    taken.append(topics.take())
    topics.maintain()  # the batch is used up: the next one is subscribed ahead
    assert [kind for kind, _ in link.packets] == ["SUBSCRIBE", "SUBSCRIBE"]
    for topic in taken[:3]:
        topics.release(topic)
    topics.maintain()
    assert len(link.packets) == 2  # three settled topics linger
    assert len(timer) == 1
    topics.release(taken[3])
    topics.maintain()
    assert link.packets[-1] == ("UNSUBSCRIBE", taken)
    assert len(timer) == 0
    timer.stop()


def test_a_lone_settled_topic_is_unsubscribed_after_the_linger():
    topics, link, timer = replies(linger_secs=0.05)
    topic = topics.take()
    topics.release(topic)
    wait_until(lambda: link.packets[-1] == ("UNSUBSCRIBE", [topic]), 5, "the linger flush")
    timer.stop()


def test_a_chosen_topic_reused_before_its_unsubscribe_keeps_its_subscription():
    topics, link, timer = replies()
    topics.adopt("lib/reply-mine")
    topics.release("lib/reply-mine")
    topics.adopt("lib/reply-mine")  # still subscribed: no second SUBSCRIBE
    topics.flush()
    timer.stop()
    assert link.packets == [("SUBSCRIBE", ["lib/reply-mine"])]


def test_close_unsubscribes_the_unused_and_the_settled_topics():
    topics, link, timer = replies()
    first, second = topics.take(), topics.take()
    topics.release(first)
    topics.close()
    timer.stop()
    kind, batch = link.packets[-1]
    assert kind == "UNSUBSCRIBE"
    assert set(batch) == set(link.packets[0][1]) - {second}
    assert topics.ready == []


def test_sequential_requests_over_several_batches_all_get_their_replies(
    broker, make_client, topic_root
):
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    requester, _ = echo_pair(make_client, broker.plain_port, topic)
    count = 3 * REPLY_BATCH + 1
    got = [requester.request(topic, reading(i), timeout_secs=10).get() for i in range(count)]
    assert [m.body for m in got] == [{"value": i} for i in range(count)]
    ready = set(requester._local.replies.ready)
    wait_until(lambda: reply_filters(requester) == ready, 5, "the settled topics' UNSUBSCRIBE")


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


def test_closing_the_client_leaves_no_reply_subscription(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    future = client.request(f"{topic_root}/gw/c/cmd/sb/nobody", reading(), timeout_secs=0)
    assert reply_filters(client)
    client.close(timeout=2)
    assert future.done()
    assert reply_filters(client) == set()
