"""The leak guard of tests/conftest.py sees a messaging client's threads while they run."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import client_threads_left
from tests.support.servers import free_port
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

pytestmark = pytest.mark.integration


def test_a_running_client_is_seen_and_a_closed_one_is_not() -> None:
    before = set(threading.enumerate())
    # Nobody listens on the port: the client keeps dialling it, as a leaked one does.
    config = BrokerConfig(host="127.0.0.1", port=free_port(), client_id="leak-guard-probe")
    client = MessagingClient(MessagingConfig(local=config)).start()
    try:
        left = client_threads_left(before, exit_s=0.2)
        assert "paho-mqtt-client-leak-guard-probe" in left, left
        assert "unskit-deadlines" in left, left
    finally:
        client.close(1)
    assert client_threads_left(before) == []


def test_other_threads_are_none_of_its_business() -> None:
    before = set(threading.enumerate())
    done = threading.Event()
    worker = threading.Thread(target=done.wait, args=(30,), name="some-worker", daemon=True)
    worker.start()
    try:
        assert client_threads_left(before, exit_s=0) == []
    finally:
        done.set()
        worker.join(5)
