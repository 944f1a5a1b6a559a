"""The transport's buffered reads against a broker: bursts and large messages (the paho hooks
they rely on are tested in test_paho_adapter.py)."""

from __future__ import annotations

import pytest

from tests.messaging.conftest import broker_config
from tests.messaging.test_client import Inbox
from unskit import MessageBuilder
from unskit.messaging import QoS
from unskit.messaging.paho_adapter import READ_BURST_PACKETS, READ_CHUNK_BYTES


@pytest.mark.parametrize("qos", [QoS.AT_MOST_ONCE, QoS.AT_LEAST_ONCE])
def test_a_burst_longer_than_a_read_burst_arrives_whole_and_in_order(
    broker, make_client, topic_root, qos
):
    count = 3 * READ_BURST_PACKETS
    publisher = make_client(broker_config(broker.plain_port))
    subscriber = make_client(broker_config(broker.plain_port))
    inbox = Inbox()
    subscriber.subscribe(f"{topic_root}/#", inbox, max_concurrency=1, max_messages=count)
    inbox.prime(publisher, f"{topic_root}/probe")
    for seq in range(count):
        publisher.publish(
            f"{topic_root}/gw/c/data/seq",
            MessageBuilder("seq", "1").body({"seq": seq}).build(),
            qos,
        )
    got = inbox.wait_for(count, timeout=20)
    assert [m.body["seq"] for _, m in got] == list(range(count))
    assert subscriber.stats().rejected == 0


def test_a_message_larger_than_the_read_buffer_arrives_intact(broker, make_client, topic_root):
    client = make_client(broker_config(broker.plain_port))
    inbox = Inbox()
    client.subscribe(f"{topic_root}/#", inbox)
    inbox.prime(client, f"{topic_root}/probe")
    text = "".join(chr(0x41 + i % 26) for i in range(5 * READ_CHUNK_BYTES))
    big = MessageBuilder("big", "1").body({"text": text}).build()
    small = MessageBuilder("small", "1").body({"n": 1}).build()
    client.publish(f"{topic_root}/gw/c/data/big", big)
    client.publish(f"{topic_root}/gw/c/data/small", small)
    got = inbox.wait_for(2)
    assert [m for _, m in got] == [big, small]
