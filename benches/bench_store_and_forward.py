"""Store-and-forward: the northbound outbox's replay rate beside raw paho-mqtt.

Ours: N messages published northbound while the broker is down are stored in the outbox
(SQLite, WAL); the broker starts, and the rate is N over the time from the link coming up to
the last entry deleted on its PUBACK. Anchor: a raw paho client publishing the same N payloads
at QoS 1 to the same Mosquitto, timed from the first publish to the last PUBACK, with no
in-flight limit (paho's fastest); the row also records paho with 1,000 in flight, like
bench_messaging and the outbox's default window (paho then rescans its queue on every
PUBACK). Target (issue 18): ours >= 0.5x."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from tests.support.mosquitto import Mosquitto
from tests.support.pki import make_pki
from tests.support.servers import wait_until

from unskit.config.messaging import StoreAndForwardConfig
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient, QoS

COUNT = 20_000
DOCUMENT = {"p": "x" * 190}  # 200 bytes as JSON
TOPIC = "bench/saf"


@pytest.fixture
def northbound(tmp_path: Path) -> Iterator[Mosquitto]:
    """A second Mosquitto the bench starts once the outbox is full."""
    mosquitto = Mosquitto(tmp_path / "northbound", make_pki(tmp_path / "pki"))
    yield mosquitto
    mosquitto.stop()


def ours_replay(local: int, northbound: Mosquitto, outbox: Path) -> tuple[float, float]:
    """(replay messages/s, store messages/s)."""
    config = MessagingConfig(
        local=BrokerConfig(host="127.0.0.1", port=local, client_id=f"saf-l-{uuid.uuid4().hex}"),
        northbound=BrokerConfig(
            host="127.0.0.1",
            port=northbound.plain_port,
            client_id=f"saf-n-{uuid.uuid4().hex[:8]}",
            store_and_forward=StoreAndForwardConfig(path=outbox),
        ),
    )
    client = MessagingClient(config).start()
    try:
        started = time.perf_counter()
        for _ in range(COUNT):
            client.publish_northbound_raw(TOPIC, DOCUMENT, QoS.AT_LEAST_ONCE)
        store_rate = COUNT / (time.perf_counter() - started)
        status = client.outbox_status()
        assert status is not None
        assert status.entries == COUNT
        northbound.start()
        wait_until(client.northbound_connected, 60, "the northbound link", interval=0.001)
        up = time.perf_counter()
        wait_until(
            lambda: client.outbox_status().entries == 0,  # type: ignore[union-attr]
            120,
            "the outbox drained",
            interval=0.002,
        )
        replay_rate = COUNT / (time.perf_counter() - up)
    finally:
        client.close(timeout=5)
    return replay_rate, store_rate


def paho_publish(port: int, in_flight: int) -> float:
    payload = json.dumps(DOCUMENT, separators=(",", ":")).encode()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"raw-{uuid.uuid4().hex[:8]}")
    client.max_inflight_messages_set(in_flight)
    client.max_queued_messages_set(0)
    client.on_socket_open = lambda _c, _u, sock: sock.setsockopt(6, 1, 1)  # TCP_NODELAY
    connected, done = threading.Event(), threading.Event()
    acked = [0]

    def on_publish(*_: Any) -> None:
        acked[0] += 1
        if acked[0] >= COUNT:
            done.set()

    client.on_connect = lambda *_: connected.set()
    client.on_publish = on_publish
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert connected.wait(10)
        started = time.perf_counter()
        for _ in range(COUNT):
            client.publish(TOPIC, payload, 1)
        assert done.wait(120), f"{acked[0]} of {COUNT} acknowledged"
        return COUNT / (time.perf_counter() - started)
    finally:
        client.disconnect()
        client.loop_stop()


def test_store_and_forward_replay(benchmark, ratio, broker, northbound, tmp_path) -> None:
    rates: dict[str, float] = {}

    def run() -> None:
        rates["ours"], rates["store"] = ours_replay(
            broker.plain_port, northbound, tmp_path / "outbox.sqlite3"
        )
        rates["paho"] = paho_publish(northbound.plain_port, 0)
        rates["paho1000"] = paho_publish(northbound.plain_port, 1000)

    benchmark.pedantic(run, rounds=1, iterations=1)
    row = ratio(
        "messaging.storeAndForward.replay",
        rates["ours"],
        "paho-mqtt",
        rates["paho"],
        target=0.5,
        store_msgs_per_s=round(rates["store"]),
        paho_1000_in_flight_msgs_per_s=round(rates["paho1000"]),
    )
    print(
        f"\nstore-and-forward: replay {rates['ours']:,.0f}/s (stored at {rates['store']:,.0f}/s) "
        f"paho {rates['paho']:,.0f}/s (1,000 in flight: {rates['paho1000']:,.0f}/s) "
        f"ratio {row['ratio']}x"
    )
