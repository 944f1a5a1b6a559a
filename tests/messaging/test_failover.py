"""Broker endpoint lists: the next broker after a lost or refused link, readiness held
through a failover shorter than the grace period, and a flap that is no recovery."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from types import SimpleNamespace

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.messaging.conftest import broker_config
from tests.messaging.test_client import reading, start_echo_responder
from tests.support.adapter import framework_sections
from tests.support.nats import NatsNode
from tests.support.servers import component_process, free_port, readyz, wait_until
from unskit.config.model import BrokerConfig
from unskit.envelope import Message, MessageBuilder
from unskit.errors import RequestTimeoutError
from unskit.messaging.mqtt import STABLE_CONNECTION_SECS, MqttTransport


def listed(*ports: int, grace: float = 10.0, client_id: str | None = None) -> BrokerConfig:
    """A broker config whose endpoints are 127.0.0.1 on `ports`, in order."""
    first = broker_config(ports[0], client_id=client_id)
    return BrokerConfig(
        host=first.host,
        port=first.port,
        client_id=first.client_id,
        failover=tuple(("127.0.0.1", port) for port in ports[1:]),
        failover_grace_seconds=grace,
    )


# -- the grace and flap rules, on paho's callbacks with a clock we move ---------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


OK = SimpleNamespace(is_failure=False)
FLAGS = SimpleNamespace(session_present=False)


@pytest.fixture
def callbacks() -> tuple[MqttTransport, paho.Client, Clock]:
    clock = Clock()
    transport = MqttTransport(listed(1, 2, 3, grace=10), clock=clock)
    # Never connected: the callbacks only set its reconnect delay and next address.
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="unit")
    return transport, client, clock


def _up(transport: MqttTransport, client: paho.Client) -> None:
    transport._handle_connect(client, None, FLAGS, OK, None)


def _down(transport: MqttTransport, client: paho.Client) -> None:
    transport._handle_disconnect(client, None, None, "gone", None)


def test_a_loss_moves_to_the_next_endpoint_round_robin(callbacks) -> None:
    transport, client, clock = callbacks
    assert transport.endpoint == "127.0.0.1:1"
    _up(transport, client)
    clock.now += 60
    _down(transport, client)
    assert (transport.endpoint, client._host, client._port) == ("127.0.0.1:2", "127.0.0.1", 2)
    transport._handle_connect_fail(client, None)
    transport._handle_connect_fail(client, None)
    assert transport.endpoint == "127.0.0.1:1"
    assert transport.failovers == 3


def test_readiness_holds_for_the_grace_period_after_a_stable_link_drops(callbacks) -> None:
    transport, client, clock = callbacks
    assert not transport.within_failover_grace(), "never connected: no grace at start"
    _up(transport, client)
    clock.now += 60
    _down(transport, client)
    assert transport.within_failover_grace()
    clock.now += 9.9
    assert transport.within_failover_grace()
    clock.now += 0.2
    assert not transport.within_failover_grace()


def test_a_flap_is_no_recovery(callbacks) -> None:
    transport, client, clock = callbacks
    _up(transport, client)
    clock.now += 60
    _down(transport, client)  # the first loss starts the grace period
    clock.now += 4
    _up(transport, client)
    clock.now += STABLE_CONNECTION_SECS / 2
    _down(transport, client)  # dropped again within seconds: still the same outage
    assert transport.within_failover_grace()
    clock.now += 10 - 4 - STABLE_CONNECTION_SECS / 2 + 0.1
    assert not transport.within_failover_grace(), "the grace counts from the first loss"


def test_one_endpoint_has_no_grace(callbacks) -> None:
    _, client, clock = callbacks
    transport = MqttTransport(broker_config(1), clock=clock)
    _up(transport, client)
    clock.now += 60
    _down(transport, client)
    assert not transport.within_failover_grace()
    assert transport.failovers == 0


# -- real brokers ---------------------------------------------------------------------------


@pytest.mark.integration
def test_an_unreachable_first_endpoint_fails_over_to_the_next(broker, make_client) -> None:
    client = make_client(listed(free_port(), broker.plain_port))
    status = client.link_status()
    assert status["connected"]
    assert status["endpoint"] == f"127.0.0.1:{broker.plain_port}"
    assert status["failovers"] >= 1


@pytest.mark.integration
@pytest.mark.slow
def test_a_node_killed_under_a_qos1_stream_loses_nothing(nats, make_client, topic_root) -> None:
    n1, n2, n3 = nats.nodes
    ports = [n.mqtt_port for n in nats.nodes]
    # Two publishers on the node that dies, each listing the others to fail over to; the
    # subscriber and a responder elsewhere.
    publishers = [
        make_client(listed(n1.mqtt_port, n2.mqtt_port, n3.mqtt_port, grace=15)) for _ in range(2)
    ]
    subscriber = make_client(listed(n3.mqtt_port, n2.mqtt_port, n1.mqtt_port))
    responder = make_client(listed(n2.mqtt_port, n3.mqtt_port, n1.mqtt_port))
    got: dict[int, set[int]] = {0: set(), 1: set()}
    duplicates = 0
    lock = threading.Lock()

    def record(_topic: str, message: Message) -> None:
        nonlocal duplicates
        with lock:
            seen = got[message.body["publisher"]]
            duplicates += message.body["n"] in seen
            seen.add(message.body["n"])

    subscriber.subscribe(f"{topic_root}/gw/+/data/#", record)
    start_echo_responder(responder, publishers[0], f"{topic_root}/gw/c/cmd/sb/echo")
    sent = [0, 0]

    def send(rounds: int) -> None:
        for _ in range(rounds):
            for index, publisher in enumerate(publishers):
                body = {"publisher": index, "n": sent[index]}
                message = MessageBuilder("seq", "1").body(body).build()
                publisher.publish(f"{topic_root}/gw/p{index}/data/seq", message)
                sent[index] += 1

    def live() -> bool:
        send(1)
        return all(got.values())

    wait_until(live, 30, "the stream to flow", interval=0.2)
    send(200)
    nats.kill(n1)
    killed = time.monotonic()
    send(200)  # queued in the clients while they move to n2
    wait_until(lambda: all(p.connected() for p in publishers), 90, "publishers to fail over")
    failover_s = time.monotonic() - killed
    assert all(p.link_status()["endpoint"] != f"127.0.0.1:{n1.mqtt_port}" for p in publishers)
    assert all(p.link_status()["failovers"] >= 1 for p in publishers)
    send(200)
    # Answered after the failover: the reply subscription was restored on the new node
    # (a busy cluster may still be moving the session: a timed-out request is sent again).
    replies: list[Message] = []

    def answered() -> bool:
        topic = f"{topic_root}/gw/c/cmd/sb/echo"
        try:
            replies.append(publishers[0].request(topic, reading("after"), timeout_secs=5).get(6))
        except RequestTimeoutError:
            return False
        return True

    wait_until(answered, 90, "a request answered after the failover", interval=0.1)
    assert replies[-1].body == {"value": "after"}
    nats.restart(n1)
    send(100)
    wait_until(lambda: all(len(got[i]) == sent[i] for i in (0, 1)), 60, "every message of both")
    for index in (0, 1):
        assert got[index] == set(range(sent[index])), f"publisher {index} lost messages"
    print(
        f"node kill: failover {failover_s:.2f} s, {sum(sent)} sent, {duplicates} duplicates, "
        f"endpoints {ports}"
    )


@pytest.mark.integration
@pytest.mark.slow
# The grace is generous: on 2 busy cores a NATS node failover took up to 30 s.
@pytest.mark.parametrize("grace", [120, 0])
def test_readiness_holds_through_a_node_failover_within_the_grace(
    nats, tmp_path, grace: int
) -> None:
    n1, n2, n3 = nats.nodes
    health_port = free_port()
    document = {
        "component": {},
        **framework_sections(n1.mqtt_port, tmp_path),
        "health": {"enabled": True, "port": health_port},
    }
    document["messaging"]["local"] = {
        "endpoints": [f"mqtt://127.0.0.1:{n.mqtt_port}" for n in (n1, n2, n3)],
        "clientId": f"echo-{uuid.uuid4().hex[:8]}",
        "failoverGraceSeconds": grace,
    }
    config = tmp_path / "echo.json"
    config.write_text(json.dumps(document))
    log = tmp_path / "echo.log"
    samples: list[int | None] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            samples.append(readyz(health_port))

    sampler = threading.Thread(target=sample)
    client_id = document["messaging"]["local"]["clientId"]
    holder: list[NatsNode] = []

    def find_holder() -> bool:
        # The first endpoint may have refused the session (a node's JetStream settling after
        # the previous test's restart): fail over from the node that holds it, wherever.
        holder[:] = [n for n in (n1, n2, n3) if n.holds_client(client_id)]
        return len(holder) == 1

    def link_ups() -> int:
        return log.read_text().count("messaging local: link up")

    with component_process("echo", log, "-c", str(config), "-t", "gw") as process:
        wait_until(lambda: readyz(health_port) == 200, 60, "readiness")
        wait_until(find_holder, 30, "the node holding the session")
        sampler.start()
        try:
            ups = link_ups()
            nats.kill(holder[0])
            wait_until(lambda: link_ups() > ups, 100, "failover")
            wait_until(lambda: readyz(health_port) == 200, 100, "readiness after failover")
            # A few more samples on the new node.
            count = len(samples)
            wait_until(lambda: len(samples) > count + 10, 10, "samples")
        finally:
            stop.set()
            sampler.join(10)
            nats.restart(holder[0])
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()[-3000:]
    assert samples
    assert samples[-1] == 200
    if grace:
        assert set(samples) == {200}, "a failover within the grace is not an outage"
    else:
        assert 503 in samples, "without a grace the link loss shows at once"
