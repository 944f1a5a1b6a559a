"""The OPC UA simulator as a real server, application certificates for its secure endpoints,
and the driver with a sink that collects what it delivers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.opcua import AppCertificate, OpcUaSim, make_app_certificate
from unskit.opcua.adapter import OpcUaDriver
from unskit.southbound.driver import InstanceSpec


@pytest.fixture
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
