"""The embedded broker: a real amqtt broker our messaging client talks to."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import socket
import sys
import threading

import pytest
from tests.support.servers import free_port, wait_until

from unskit import MessageBuilder
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.errors import MessagingError
from unskit.messaging import MessagingClient
from unskit.runtime.embedded_broker import EmbeddedBroker


@pytest.mark.integration
def test_messaging_round_trip_through_the_embedded_broker():
    broker = EmbeddedBroker(free_port()).start()
    client = MessagingClient(
        MessagingConfig(local=BrokerConfig(host="127.0.0.1", port=broker.port, client_id="e1"))
    ).start()
    try:
        wait_until(client.connected, 10, "a connection to the embedded broker")
        got = threading.Event()
        client.subscribe("uns/#", lambda _t, m: got.set())
        message = MessageBuilder("r", "1").body({"a": 1}).build()
        wait_until(
            lambda: client.publish("uns/gw/c/data/x", message) or got.is_set(),
            10,
            "the message to come back",
            interval=0.05,
        )
    finally:
        client.close(2)
        broker.stop()
    assert not broker.running
    broker.stop()  # idempotent


def test_without_amqtt_the_error_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "amqtt" else real(name, *a)
    )
    with pytest.raises(MessagingError, match=r"pip install 'unskit\[embedded\]'"):
        EmbeddedBroker(1).start()


@pytest.mark.integration
def test_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MessagingError, match=f"cannot listen on 127.0.0.1:{port}"):
            EmbeddedBroker(port).start()


@pytest.mark.integration
def test_restart_on_the_same_port():
    port = free_port()
    EmbeddedBroker(port).start().stop()
    broker = EmbeddedBroker(port).start()
    assert broker.running
    broker.stop()


@pytest.mark.integration
@pytest.mark.parametrize("sent", [b"", b"\x10"], ids=["nothing", "half-a-connect"])
def test_stop_closes_a_connection_still_in_its_handshake(monkeypatch, sent):
    # Such a connection's handler used to outlive the loop: its socket stayed open and its
    # StreamWriter warned at collection, in whichever later test the collector ran.
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.exc_value)))
    broker = EmbeddedBroker(free_port()).start()
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as peer:
        peer.sendall(sent)
        wait_until(lambda: _handlers(broker) == 1, 10, "the broker to take the connection")
        broker.stop()
        with contextlib.suppress(ConnectionResetError):
            assert peer.recv(1) == b""
    gc.collect()
    assert unraisable == []


def _handlers(broker: EmbeddedBroker) -> int:
    loop = broker._loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(_count(), loop).result(10)


async def _count() -> int:
    return sum(
        task.get_coro().__qualname__.endswith("stream_connected")  # type: ignore[union-attr]
        for task in asyncio.all_tasks()
    )
