"""The OPC UA servers (the asyncua sim and node-opcua), application certificates for their
secure endpoints, the driver with a sink that collects what it delivers, and the component
in-process on a real Mosquitto."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.adapter import Adapter, AdapterHarness
from tests.support.mosquitto import Mosquitto
from tests.support.node_opcua import NodeOpcuaServer
from tests.support.opcua import FAST_TIMING, AppCertificate, OpcUaSim, make_app_certificate
from tests.support.tiers import server_fixture
from unskit.opcua.adapter import OpcUaDriver
from unskit.opcua.component import OpcUaAdapter
from unskit.southbound.driver import InstanceSpec


@server_fixture
def opcua_server(tmp_path: Path) -> Iterator[Callable[..., OpcUaSim]]:
    """Starts simulators: `opcua_server("--users", "u:p")`; each is killed at the end."""
    started: list[OpcUaSim] = []

    def start(*options: str) -> OpcUaSim:
        sim = OpcUaSim(tmp_path / f"sim{len(started)}", options)
        started.append(sim)
        return sim.start()

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="session")
def opcua_certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AppCertificate]:
    folder = tmp_path_factory.mktemp("opcua-pki")
    return {
        "server": make_app_certificate(folder, "server", "urn:unskit:sim:server"),
        "client": make_app_certificate(folder, "client", "urn:unskit:test:client"),
    }


@pytest.fixture
def make_driver() -> Iterator[Callable[..., OpcUaDriver]]:
    """Builds drivers (`make_driver(spec, metrics=...)`) and closes every one at the end."""
    drivers: list[OpcUaDriver] = []

    def make(spec: InstanceSpec, **kwargs: Any) -> OpcUaDriver:
        driver = OpcUaDriver(spec, **kwargs)
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        driver.close()


@server_fixture(scope="module")
def node_opcua_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeOpcuaServer]:
    """node-opcua's server on a free loopback port, shared by a module's tests."""
    server = NodeOpcuaServer(tmp_path_factory.mktemp("node-opcua")).start()
    yield server
    server.stop()


@pytest.fixture
def start_opcua(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[Callable[..., Adapter]]:
    harness = AdapterHarness(broker, tmp_path)

    def start(instances: list[dict[str, Any]], **global_: Any) -> Adapter:
        component = {"global": {"timing": FAST_TIMING, **global_}, "instances": instances}
        return harness.start(OpcUaAdapter, harness.document(component))

    yield start
    harness.close()
