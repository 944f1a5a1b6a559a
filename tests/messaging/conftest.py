from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.config.model import BrokerConfig, BrokerCredentials, MessagingConfig, QosConfig
from unskit.messaging import MessagingClient

_ids = itertools.count()


def broker_config(
    port: int,
    *,
    client_id: str | None = None,
    credentials: BrokerCredentials | None = None,
    qos: QosConfig | None = None,
) -> BrokerConfig:
    return BrokerConfig(
        host="127.0.0.1",
        port=port,
        client_id=client_id or f"test-{next(_ids)}-{uuid.uuid4().hex[:8]}",
        qos=qos or QosConfig(),
        credentials=credentials or BrokerCredentials(),
    )


@server_fixture
def make_client() -> Iterator[Callable[..., MessagingClient]]:
    """Starts clients and closes them after the test; waits for the local link by default."""
    clients: list[MessagingClient] = []

    def make(
        local: BrokerConfig,
        *,
        northbound: BrokerConfig | None = None,
        request_timeout_seconds: float = 30.0,
        wait: bool = True,
    ) -> MessagingClient:
        client = MessagingClient(
            MessagingConfig(
                local=local,
                northbound=northbound,
                request_timeout_seconds=request_timeout_seconds,
            )
        ).start()
        clients.append(client)
        if wait:
            wait_until(client.connected, 10, "the client to connect")
        return client

    yield make
    for client in clients:
        client.close(timeout=2)


@pytest.fixture
def topic_root() -> str:
    """A fresh UNS root per test, so retained or late messages never cross tests."""
    return f"t{uuid.uuid4().hex[:10]}"


def tmp_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder
