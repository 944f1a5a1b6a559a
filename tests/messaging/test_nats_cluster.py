"""The messaging client on a real 3-node NATS cluster speaking MQTT 3.1.1: the same library,
unchanged, across nodes (pub/sub, request/reply, persistent sessions)."""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from tests.messaging.conftest import broker_config
from tests.messaging.test_client import reading, start_echo_responder
from tests.support.servers import wait_until
from unskit.config.model import MessagingConfig
from unskit.envelope import Message
from unskit.messaging import MessagingClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_publish_on_one_node_reaches_a_subscriber_on_another(nats, make_client, topic_root):
    n1, n2, _ = nats.nodes
    subscriber = make_client(broker_config(n1.mqtt_port))
    publisher = make_client(broker_config(n2.mqtt_port))
    got: list[tuple[str, int]] = []
    lock = threading.Lock()

    def record(topic: str, message: Message) -> None:
        with lock:
            got.append((topic, message.body["value"]))

    subscriber.subscribe(f"{topic_root}/+/c/data/#", record)

    def delivered() -> bool:
        publisher.publish(f"{topic_root}/gw/c/data/probe", reading(-1))
        return bool(got)

    # The subscription is live on the other node once a probe crosses.
    wait_until(delivered, 30, "a probe across nodes", interval=0.2)
    for value in range(20):
        publisher.publish(f"{topic_root}/gw/c/data/t", reading(value))
    wait_until(lambda: len([g for g in got if g[1] >= 0]) == 20, 30, "20 messages")
    assert [v for t, v in got if v >= 0] == list(range(20))
    assert {t for t, v in got if v >= 0} == {f"{topic_root}/gw/c/data/t"}


def test_request_reply_between_nodes(nats, make_client, topic_root):
    n1, _, n3 = nats.nodes
    responder = make_client(broker_config(n1.mqtt_port))
    requester = make_client(broker_config(n3.mqtt_port))
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    start_echo_responder(responder, requester, topic)
    latencies = []
    for value in range(50):
        start = time.perf_counter()
        reply = requester.request(topic, reading(value), timeout_secs=10).get(10)
        latencies.append(time.perf_counter() - start)
        assert reply.body == {"value": value}
    assert requester.pending_requests() == 0
    # One reply subscription per client: no request pays a SUBSCRIBE (about 60 ms on this
    # cluster), so even the slowest of 50 stays well under one.
    assert statistics.median(latencies) < 0.06, latencies


def test_queued_messages_follow_a_session_to_another_node(nats, make_client, topic_root, request):
    n1, n2, n3 = nats.nodes
    client_id = f"roamer-{topic_root}"
    got: list[int] = []
    lock = threading.Lock()

    def record(_topic: str, message: Message) -> None:
        with lock:
            got.append(message.body["value"])

    first = make_client(broker_config(n1.mqtt_port, client_id=client_id))
    first.subscribe(f"{topic_root}/gw/c/data/#", record)
    publisher = make_client(broker_config(n3.mqtt_port))

    def live() -> bool:
        publisher.publish(f"{topic_root}/gw/c/data/probe", reading(-1))
        return bool(got)

    wait_until(live, 30, "the subscription to be live", interval=0.2)
    first.close(timeout=5)
    for value in range(100):
        publisher.publish(f"{topic_root}/gw/c/data/t", reading(value))
    got.clear()
    # Same client id, persistent session, another node: the queue comes along. The broker
    # sends it right after CONNACK, so it is held until the handler is registered.
    second = MessagingClient(
        MessagingConfig(local=broker_config(n2.mqtt_port, client_id=client_id))
    ).start(hold=True)
    request.addfinalizer(lambda: second.close(timeout=2))
    second.subscribe(f"{topic_root}/gw/c/data/#", record)
    second.release()
    wait_until(lambda: len({v for v in got if v >= 0}) == 100, 60, "100 queued messages")
    assert sorted({v for v in got if v >= 0}) == list(range(100))
