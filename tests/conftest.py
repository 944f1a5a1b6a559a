"""Fixtures every test folder shares (the test PKI, a real Mosquitto broker) and the test tiers."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.mosquitto import Mosquitto
from tests.support.nats import NatsCluster
from tests.support.pki import Pki, make_pki
from tests.support.servers import root_logging_restored


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path_factory.mktemp("mosquitto"), pki).start()
    yield mosquitto
    mosquitto.stop()


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """A 3-node NATS cluster speaking MQTT, one per test module (failover tests kill nodes)."""
    cluster = NatsCluster(tmp_path_factory.mktemp("nats")).start()
    yield cluster
    cluster.remove()


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    """For tests that run a Runtime in-process: it configures the root logger."""
    with root_logging_restored():
        yield


# -- test tiers ------------------------------------------------------------------------------
# unit: no network, no subprocess (enforced below); integration: real servers or processes;
# slow: over ~5 s. A test is integration when it uses a server fixture or its module or class
# is marked so; every other test is unit, and the guard fails it if it reaches the network.

#: Fixtures that start or reach a real server, a component or a process.
SERVER_FIXTURES = frozenset(
    {
        "broker",
        "broker_later",
        "own_broker",
        "logix",
        "packed_logix",
        "moto",
        "bucket",
        "sshd",
        "ftps",
        "httpd",
        "upload",
        "rtsp_url",
        "harness",
        "rig",
        "start_adapter",
        "start_cip",
        "start_sample",
        "start_sample_once",
        "make_client",
        "make_server",
        "server",
        "connected",
        "scrape_registry",
        "vault_files",
        "node_opcua_server",
        "opcua_server",
        "nats",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses_server = not SERVER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
        if uses_server and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.unit)


class UnitTierError(AssertionError):
    """A unit test reached for the network or a process: mark it integration."""


@pytest.fixture(autouse=True)
def _unit_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("unit") is None:
        return
    name = request.node.nodeid

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*_args: Any, **_kwargs: Any) -> Any:
            raise UnitTierError(f"{name} is a unit test but uses {what}: mark it integration")

        return refused

    real_connect = socket.socket.connect
    real_bind = socket.socket.bind

    def inet_only(real: Callable[..., Any], what: str) -> Callable[..., Any]:
        def guarded(sock: socket.socket, address: Any) -> Any:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                raise UnitTierError(f"{name} is a unit test but uses {what}: mark it integration")
            return real(sock, address)

        return guarded

    monkeypatch.setattr(socket.socket, "connect", inet_only(real_connect, "socket.connect"))
    monkeypatch.setattr(
        socket.socket, "connect_ex", inet_only(socket.socket.connect_ex, "socket.connect_ex")
    )
    monkeypatch.setattr(socket.socket, "bind", inet_only(real_bind, "socket.bind"))
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("a subprocess"))
