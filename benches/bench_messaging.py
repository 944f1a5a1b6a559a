"""Messaging: ours (envelope encode/decode included) beside raw paho-mqtt on the same
Mosquitto, with gmqtt (asyncio) as a second anchor for what the transport leaves behind.

Throughput is messages/s received end to end (first publish to last delivery); request/reply
is the round-trip time of sequential QoS 1 requests, p50 and p99."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from tests.support.servers import wait_until

from benches.conftest import connected_client
from unskit import Message, MessageBuilder
from unskit.messaging import MessagingClient, QoS

COUNT = {0: 20_000, 1: 10_000}
ROUND_TRIPS = 2_000
BODY = {"temperature": 21.5, "pressure": 101325, "running": True, "mode": "auto", "cycle": 1}


def _ours(port: int) -> MessagingClient:
    return connected_client(port)


def _paho(port: int, on_message: Callable[..., None] | None = None) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"raw-{uuid.uuid4().hex[:8]}")
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.on_socket_open = lambda _c, _u, sock: sock.setsockopt(6, 1, 1)  # TCP_NODELAY
    connected = threading.Event()
    client.on_connect = lambda *_: connected.set()
    if on_message is not None:
        client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert connected.wait(10)
    return client


class Counter:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.done = threading.Event()

    def hit(self) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.done.set()


def ours_throughput(port: int, qos: int, topic: str) -> float:
    n = COUNT[qos]
    publisher, subscriber = _ours(port), _ours(port)
    counter = Counter(n + 1)
    subscriber.subscribe(
        f"{topic}/#", lambda _t, _m: counter.hit(), max_concurrency=1, max_messages=n + 10
    )
    # Prime: the subscription is live once a probe comes back.
    wait_until(
        lambda: publisher.publish(f"{topic}/probe", _msg()) or counter.count > 0,
        10,
        "subscription",
        interval=0.05,
    )
    counter.count, counter.expected = 0, n
    counter.done.clear()
    started = time.perf_counter()
    for _ in range(n):
        publisher.publish(f"{topic}/x", _msg(), QoS(qos))
    assert counter.done.wait(120), f"received {counter.count} of {n}"
    elapsed = time.perf_counter() - started
    publisher.close(), subscriber.close()
    return n / elapsed


def paho_throughput(port: int, qos: int, topic: str) -> float:
    n = COUNT[qos]
    payload = _msg().to_bytes()
    counter = Counter(n)
    probe = threading.Event()

    def on_message(_c: Any, _u: Any, message: paho.MQTTMessage) -> None:
        if message.topic.endswith("/probe"):
            probe.set()
        else:
            counter.hit()

    subscriber = _paho(port, on_message)
    subscriber.subscribe(f"{topic}/#", qos)
    publisher = _paho(port)
    wait_until(
        lambda: publisher.publish(f"{topic}/probe", b"p") and probe.is_set(),
        10,
        "subscription",
        interval=0.05,
    )
    started = time.perf_counter()
    for _ in range(n):
        publisher.publish(f"{topic}/x", payload, qos)
    assert counter.done.wait(120), f"received {counter.count} of {n}"
    elapsed = time.perf_counter() - started
    for c in (publisher, subscriber):
        c.disconnect(), c.loop_stop()
    return n / elapsed


def gmqtt_throughput(port: int, qos: int, topic: str) -> float:
    import gmqtt

    n = COUNT[qos]
    payload = _msg().to_bytes()

    async def run() -> float:
        done = asyncio.Event()
        got = 0
        probe = asyncio.Event()

        def on_message(_client: Any, t: str, _payload: bytes, _qos: int, _props: Any) -> int:
            nonlocal got
            if t.endswith("/probe"):
                probe.set()
            else:
                got += 1
                if got >= n:
                    done.set()
            return 0

        subscriber = gmqtt.Client(f"g-{uuid.uuid4().hex[:8]}")
        subscriber.on_message = on_message
        await subscriber.connect("127.0.0.1", port, version=gmqtt.constants.MQTTv311)
        subscriber.subscribe(f"{topic}/#", qos=qos)
        publisher = gmqtt.Client(f"g-{uuid.uuid4().hex[:8]}")
        await publisher.connect("127.0.0.1", port, version=gmqtt.constants.MQTTv311)
        while not probe.is_set():
            publisher.publish(f"{topic}/probe", b"p")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probe.wait(), 0.05)
        started = time.perf_counter()
        for i in range(n):
            publisher.publish(f"{topic}/x", payload, qos=qos)
            if i % 1000 == 0:
                await asyncio.sleep(0)  # let the transport drain
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - started
        await publisher.disconnect()
        await subscriber.disconnect()
        return n / elapsed

    return asyncio.run(run())


def _msg() -> Message:
    return MessageBuilder("reading", "1").body(BODY).build()


@pytest.mark.parametrize("qos", [0, 1])
def test_publish_throughput(benchmark, ratio, broker, qos: int) -> None:
    topic = f"bench/{uuid.uuid4().hex[:8]}"
    rates: dict[str, float] = {}

    def run() -> None:
        rates["paho"] = paho_throughput(broker.plain_port, qos, topic + "/paho")
        rates["ours"] = ours_throughput(broker.plain_port, qos, topic + "/ours")
        rates["gmqtt"] = gmqtt_throughput(broker.plain_port, qos, topic + "/gmqtt")

    benchmark.pedantic(run, rounds=1, iterations=1)
    row = ratio(
        f"messaging.throughput.qos{qos}",
        rates["ours"],
        "paho-mqtt",
        rates["paho"],
        target=0.8,
        gmqtt_msgs_per_s=round(rates["gmqtt"]),
    )
    print(
        f"\nQoS {qos}: ours {rates['ours']:,.0f}/s paho {rates['paho']:,.0f}/s "
        f"gmqtt {rates['gmqtt']:,.0f}/s ratio {row['ratio']}x"
    )


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def ours_round_trips(port: int, topic: str) -> list[float]:
    requester, responder = _ours(port), _ours(port)
    responder.subscribe(topic, lambda _t, m: responder.reply(m, _msg()), max_concurrency=1)
    wait_until(lambda: _answered(requester, topic), 10, "responder", interval=0.05)
    samples = []
    for _ in range(ROUND_TRIPS):
        started = time.perf_counter()
        requester.request(topic, _msg(), timeout_secs=5).get()
        samples.append(time.perf_counter() - started)
    requester.close(), responder.close()
    return samples


def _answered(client: MessagingClient, topic: str) -> bool:
    try:
        client.request(topic, _msg(), timeout_secs=0.5).get()
    except TimeoutError:
        return False
    return True


def paho_round_trips(port: int, topic: str) -> list[float]:
    payload = _msg().to_bytes()
    reply_topic = f"lib/reply-{uuid.uuid4().hex}"
    got = threading.Event()

    def respond(client: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        client.publish(reply_topic, message.payload, 1)

    responder = _paho(port, respond)
    responder.subscribe(topic, 1)
    requester = _paho(port, lambda *_: got.set())
    requester.subscribe(reply_topic, 1)
    wait_until(lambda: requester.publish(topic, payload, 1) and got.wait(0.05), 10, "responder")
    samples = []
    for _ in range(ROUND_TRIPS):
        got.clear()
        started = time.perf_counter()
        requester.publish(topic, payload, 1)
        assert got.wait(5)
        samples.append(time.perf_counter() - started)
    for c in (requester, responder):
        c.disconnect(), c.loop_stop()
    return samples


def test_request_reply_latency(benchmark, ratio, broker) -> None:
    topic = f"bench/{uuid.uuid4().hex[:8]}/cmd/sb/echo"
    samples: dict[str, list[float]] = {}

    def run() -> None:
        samples["paho"] = paho_round_trips(broker.plain_port, topic + "-paho")
        samples["ours"] = ours_round_trips(broker.plain_port, topic)

    benchmark.pedantic(run, rounds=1, iterations=1)
    ours_p50, ours_p99 = _percentiles(samples["ours"])
    paho_p50, paho_p99 = _percentiles(samples["paho"])
    row = ratio(
        "messaging.request_reply.qos1",
        1 / ours_p99,
        "paho-mqtt (1/p99)",
        1 / paho_p99,
        target=1.0,
        ours_p50_ms=round(ours_p50 * 1e3, 3),
        ours_p99_ms=round(ours_p99 * 1e3, 3),
        paho_p50_ms=round(paho_p50 * 1e3, 3),
        paho_p99_ms=round(paho_p99 * 1e3, 3),
    )
    print(
        f"\nrequest/reply QoS 1: ours p50 {ours_p50 * 1e3:.3f} ms p99 {ours_p99 * 1e3:.3f} ms; "
        f"paho p50 {paho_p50 * 1e3:.3f} ms p99 {paho_p99 * 1e3:.3f} ms; ratio {row['ratio']}x"
    )
