"""The edge-runtime IPC transport against the real nucleus: envelopes over PublishToTopic,
wildcard streams, receiveOwnMessages, QoS 2 and wildcard topics refused, request/reply with
a deadline, a subscription the recipe does not allow."""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.edge.conftest import HARNESS
from tests.support.greengrass import Harness, Nucleus
from tests.support.servers import wait_until
from unskit import MessageBuilder
from unskit.config.messaging import IpcConfig
from unskit.config.model import MessagingConfig
from unskit.edge import IpcConnection, IpcEndpoint, edge_error
from unskit.edge.pubsub import publish_binary
from unskit.envelope import Message
from unskit.errors import PublishError, RequestTimeoutError, UnsupportedQosError
from unskit.messaging import MessagingClient
from unskit.messaging.ipc import IpcTransport
from unskit.messaging.transport import QoS

pytestmark = pytest.mark.integration

#: A second component, for what "others" means to the nucleus.
OTHER = "OtherHarness"
#: A component whose recipe allows publishing only.
PUBLISH_ONLY = "PublishOnlyHarness"
PUBLISH_ONLY_POLICY = {
    "aws.greengrass.ipc.pubsub": {
        "publish-only:pubsub:1": {
            "operations": ["aws.greengrass#PublishToTopic"],
            "resources": ["*"],
        }
    }
}


@pytest.fixture(scope="module")
def bus() -> Iterator[Nucleus]:
    """One nucleus with three harnesses: allowed all, another allowed all, publish only."""
    runtime = Nucleus(
        [
            Harness(HARNESS),
            Harness(OTHER),
            Harness(PUBLISH_ONLY, access_control=PUBLISH_ONLY_POLICY),
        ]
    ).start()
    yield runtime
    runtime.remove()


def ipc_client(
    nucleus: Nucleus, component: str = HARNESS, *, receive_own: bool = True
) -> MessagingClient:
    """A started client acting as `component`, the nucleus's variables passed explicitly."""
    config = MessagingConfig(
        local=None,
        local_ipc=IpcConfig(
            client_id=f"test-{uuid.uuid4().hex[:8]}", receive_own_messages=receive_own
        ),
        request_timeout_seconds=5,
    )
    client = MessagingClient(config, environ=nucleus.component_env(component)).start()
    assert client.wait_connected(15), "the IPC link did not come up"
    return client


def envelope(body: object) -> Message:
    return MessageBuilder("Test", "1.0").body(body).build()


class Inbox:
    """What one subscription received, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, Message]] = []

    def __call__(self, topic: str, message: Message) -> None:
        with self.lock:
            self.items.append((topic, message))

    def bodies(self) -> list[object]:
        with self.lock:
            return [m.body for _, m in self.items]

    def topics(self) -> list[str]:
        with self.lock:
            return [t for t, _ in self.items]


def test_an_envelope_makes_the_round_trip(bus: Nucleus) -> None:
    client = ipc_client(bus)
    try:
        inbox = Inbox()
        client.subscribe("t/round/trip", inbox)
        assert client.wait_subscribed(10)
        assert client.subscriptions_acknowledged()
        sent = envelope({"value": 42, "unit": "bar"})
        client.publish("t/round/trip", sent)
        wait_until(lambda: inbox.bodies(), 10, "the envelope back")
        topic, received = inbox.items[0]
        assert topic == "t/round/trip"
        assert received.header.uuid == sent.header.uuid
        assert received.body == {"value": 42, "unit": "bar"}
        assert received.to_bytes() == sent.to_bytes()
        assert client.stats().received == 1
        assert client.stats().rejected == 0
    finally:
        client.close()


def test_wildcard_filters_match_as_over_mqtt(bus: Nucleus) -> None:
    client = ipc_client(bus)
    try:
        rest, level = Inbox(), Inbox()
        client.subscribe("t/wild/#", rest)
        client.subscribe("t/plus/+/x", level)
        assert client.wait_subscribed(10)
        client.publish("t/wild/a/b/c", envelope(1))
        client.publish("t/plus/1/y", envelope("not for +/x"))
        client.publish("t/plus/2/x", envelope(2))
        wait_until(lambda: rest.bodies() == [1], 10, "the message under #")
        # One stream delivers in order: once the later match is in, the earlier
        # non-matching message would have been too.
        wait_until(lambda: level.bodies() == [2], 10, "the message matching +")
        assert level.topics() == ["t/plus/2/x"]
    finally:
        client.close()


def test_receive_own_messages_false_hears_only_others(bus: Nucleus) -> None:
    others_only = ipc_client(bus, receive_own=False)
    everything = ipc_client(bus, receive_own=True)  # the same component, all messages
    other = ipc_client(bus, OTHER)
    try:
        heard, all_heard = Inbox(), Inbox()
        others_only.subscribe("t/own/+", heard)
        everything.subscribe("t/own/+", all_heard)
        assert others_only.wait_subscribed(10)
        assert everything.wait_subscribed(10)
        others_only.publish("t/own/a", envelope("mine"))
        # The nucleus dispatched it: the receive-all subscription of this component has it.
        wait_until(lambda: "mine" in all_heard.bodies(), 10, "our own message, receive-all")
        other.publish("t/own/b", envelope("theirs"))
        wait_until(lambda: "theirs" in heard.bodies(), 10, "the other component's message")
        wait_until(lambda: "theirs" in all_heard.bodies(), 10, "theirs, receive-all")
        assert heard.bodies() == ["theirs"]
        assert all_heard.bodies() == ["mine", "theirs"]
    finally:
        for client in (others_only, everything, other):
            client.close()


def test_qos_2_is_refused_before_anything_is_sent(bus: Nucleus) -> None:
    client = ipc_client(bus)
    try:
        inbox = Inbox()
        client.subscribe("t/qos/+", inbox)
        assert client.wait_subscribed(10)
        with pytest.raises(UnsupportedQosError, match=r"QoS 2 .*'t/qos/two'.* QoS 0 and 1"):
            client.publish("t/qos/two", envelope("two"), qos=QoS.EXACTLY_ONCE)
        client.publish("t/qos/zero", envelope("zero"), qos=QoS.AT_MOST_ONCE)
        client.publish("t/qos/one", envelope("one"), qos=QoS.AT_LEAST_ONCE)
        wait_until(lambda: len(inbox.bodies()) == 2, 10, "QoS 0 and 1")
        assert inbox.topics() == ["t/qos/zero", "t/qos/one"]
        assert client.publish_status().failures == 0
    finally:
        client.close()


def test_a_wildcard_publish_topic_is_refused_naming_it(bus: Nucleus) -> None:
    client = ipc_client(bus)
    try:
        for topic in ("t/+/x", "t/#", "t/*"):
            with pytest.raises(PublishError, match=re.escape(f"publish topic {topic!r} contains")):
                client.publish(topic, envelope("x"))
    finally:
        client.close()


def test_the_nucleus_itself_refuses_a_wildcard_publish_topic(bus: Nucleus) -> None:
    """Why the transport checks first: the nucleus answers InvalidArguments."""
    connection = IpcConnection(IpcEndpoint.from_environment(bus.component_env(HARNESS)))
    connection.connect()
    try:
        future = publish_binary(connection.client, "t/+/x", b"payload")
        error = edge_error(future.exception(10), "PublishToTopic", "t/+/x")
        assert "InvalidArguments" in str(error)
        assert "t/+/x" in str(error)
    finally:
        connection.close()


def test_request_and_reply_between_two_clients(bus: Nucleus) -> None:
    requester, responder = ipc_client(bus), ipc_client(bus, OTHER)
    try:

        def answer(_topic: str, request: Message) -> None:
            responder.reply(request, envelope({"echo": request.body}))

        responder.subscribe("t/cmd/sb/echo", answer)
        assert responder.wait_subscribed(10)
        assert requester.wait_subscribed(10)
        future = requester.request("t/cmd/sb/echo", envelope({"n": 1}), timeout_secs=5)
        reply = future.get(10)
        assert reply.body == {"echo": {"n": 1}}
        assert future.reply_topic.startswith("lib/reply-")
        # Nobody answers here: the deadline fails the request.
        unanswered = requester.request("t/cmd/sb/nobody", envelope({}), timeout_secs=0.3)
        with pytest.raises(RequestTimeoutError, match="t/cmd/sb/nobody"):
            unanswered.get(10)
        assert requester.pending_requests() == 0
    finally:
        requester.close()
        responder.close()


def test_a_component_answers_its_own_request(bus: Nucleus) -> None:
    """The reply filter receives all, even when the component hears only others."""
    client = ipc_client(bus, receive_own=False)
    try:
        client.subscribe("t/self/cmd", lambda _t, r: client.reply(r, envelope("pong")))
        assert client.wait_subscribed(10)
        # Our own request on an others-only subscription is not heard: the deadline ends it.
        with pytest.raises(RequestTimeoutError):
            client.request("t/self/cmd", envelope("ping"), timeout_secs=0.5).get(5)
    finally:
        client.close()
    # Heard with receiveOwnMessages true, and its reply comes back on the reply filter.
    client = ipc_client(bus, receive_own=True)
    try:
        client.subscribe("t/self/cmd", lambda _t, r: client.reply(r, envelope("pong")))
        assert client.wait_subscribed(10)
        assert client.request("t/self/cmd", envelope("ping"), timeout_secs=5).get(10).body == "pong"
    finally:
        client.close()


def test_a_subscription_the_recipe_denies_is_logged_and_retried(
    bus: Nucleus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="unskit.messaging.ipc")
    client = ipc_client(bus, PUBLISH_ONLY)
    try:
        client.subscribe("t/denied/+", Inbox())
        transport = client._local.transport
        assert isinstance(transport, IpcTransport)
        wait_until(lambda: "t/denied/+" in transport.refused_filters, 10, "the refusal")
        assert not client.subscriptions_acknowledged()
        assert not client.wait_subscribed(0.2)
        refusals = [r for r in caplog.records if r.levelno == logging.ERROR]
        text = "\n".join(r.getMessage() for r in refusals)
        assert "SubscribeToTopic t/denied/+: access denied" in text
        # sb/status's messaging part names the operation and the topic too.
        refused = client.link_status()["refusedSubscriptions"]
        assert "SubscribeToTopic t/denied/+: access denied" in refused["t/denied/+"]
        # Counted where MQTT's refused SUBACKs are (messaging/refusedSubscriptions), and
        # retried: the count grows.
        first = client.stats().refused_subscriptions
        assert first >= 1
        wait_until(lambda: client.stats().refused_subscriptions > first, 20, "a retry")
        # Publishing is allowed: the link itself is up.
        assert client.connected()
        client.publish("t/denied/x", envelope("allowed"))
        assert client.publish_status().failures == 0
    finally:
        client.close()
