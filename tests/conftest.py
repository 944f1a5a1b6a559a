"""Fixtures every test folder shares (the test PKI, a real Mosquitto broker) and the test tiers."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mosquitto import Mosquitto
from tests.support.nats import NatsCluster
from tests.support.pki import Pki, make_pki
from tests.support.servers import root_logging_restored
from tests.support.tiers import server_fixture, uses_server

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@server_fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path_factory.mktemp("mosquitto"), pki).start()
    yield mosquitto
    mosquitto.stop()


@server_fixture(scope="module")
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
# slow: over ~5 s. A test is integration when it uses a fixture declared with
# `tests.support.tiers.server_fixture` (directly or through other fixtures) or its module or
# class is marked so; every other test is unit, and the guard fails it if it reaches the
# network or starts a process.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") is None and uses_server(item):
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


# -- leaked messaging clients -----------------------------------------------------------------
# A client that a module never closes keeps dialling its broker's port after the module's
# broker is gone; free_port() later hands that port to another module's broker, and the stray
# client then joins it (the rare CI flake this guards against). So once a module's fixtures
# are torn down, no thread of a messaging client or of a component it started may be left.

#: Name prefixes of those threads: paho's network loop, and unskit's own (deadline timers,
#: subscription workers, the outbox forwarder, heartbeats, probes, watchers: all unskit-*).
CLIENT_THREAD_PREFIXES = ("paho-mqtt-client-", "unskit-")
#: How long a closed client's threads get to finish once the module's teardown is done.
CLIENT_THREAD_EXIT_S = 10.0

_threads_at_module_start: dict[Path, set[threading.Thread]] = {}


class LeakedClientError(AssertionError):
    """A test module left a messaging client (or a component) running after its teardown."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    _threads_at_module_start.setdefault(item.path, set(threading.enumerate()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    result = yield
    if nextitem is not None and nextitem.path == item.path:
        return result  # the module goes on: its module fixtures are still up
    before = _threads_at_module_start.pop(item.path, set())
    leaked = client_threads_left(before)
    if leaked:
        raise LeakedClientError(
            f"{item.path.name} left {', '.join(sorted(leaked))} running after its teardown: "
            "close every client (and stop every component) it starts, in a finally or a fixture"
        )
    return result


def client_threads_left(
    before: set[threading.Thread], exit_s: float = CLIENT_THREAD_EXIT_S
) -> list[str]:
    """Names of the client threads started since `before` still alive after `exit_s` s."""
    started = [
        thread
        for thread in threading.enumerate()
        if thread not in before and thread.name.startswith(CLIENT_THREAD_PREFIXES)
    ]
    deadline = time.monotonic() + exit_s
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread.name for thread in started if thread.is_alive()]
