"""The metric cadence of the EtherNet/IP and OPC UA adapters: the adapter's own
`component.global.metrics.metricsIntervalSecs` applies only when given, else the framework's
`metricEmission.intervalSeconds`; both default to 60 s. Each adapter runs on a real Mosquitto
(and the OPC UA one against the asyncua simulator)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.adapter import Adapter, AdapterHarness
from tests.support.mosquitto import Mosquitto
from tests.support.opcua import FAST_TIMING, SIM, OpcUaSim
from tests.support.servers import wait_until
from unskit.cip.component import EthernetIpAdapter
from unskit.opcua.component import OpcUaAdapter
from unskit.southbound.component import SouthboundComponent

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def opcua_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpcUaSim]:
    sim = OpcUaSim(tmp_path_factory.mktemp("opcua-sim")).start()
    yield sim
    sim.stop()


def _cip_instance(_sim: OpcUaSim) -> dict[str, Any]:
    return {
        "id": "press-1",
        "adapter": "sim",
        "connection": {"endpoint": "sim.local"},
        "pollGroups": [{"signals": [{"name": "speed", "tagPath": "Speed", "type": "REAL"}]}],
    }


def _opcua_instance(sim: OpcUaSim) -> dict[str, Any]:
    return {
        "id": "line1",
        "connection": {"endpoint": sim.endpoint, "securityPolicy": "None"},
        "subscriptions": [{"id": "sim", "include": [{"namespaceUri": SIM, "match": "^Counter$"}]}],
    }


ADAPTERS: dict[str, tuple[type[SouthboundComponent], Callable[[OpcUaSim], dict[str, Any]]]] = {
    "ethernet-ip": (EthernetIpAdapter, _cip_instance),
    "opcua": (OpcUaAdapter, _opcua_instance),
}


@pytest.fixture
def start(
    broker: Mosquitto, tmp_path: Path, opcua_sim: OpcUaSim, restore_root_logging: None
) -> Iterator[Callable[..., Adapter]]:
    harness = AdapterHarness(broker, tmp_path)

    def start_adapter(adapter: str, framework: int | None, own: int | None) -> Adapter:
        app_class, instance = ADAPTERS[adapter]
        harness_document = harness.document(
            {"global": _global(own), "instances": [instance(opcua_sim)]},
            metricEmission=_emission(framework),
        )
        return harness.start(app_class, harness_document)

    yield start_adapter
    harness.close()


def _global(own: int | None) -> dict[str, Any]:
    section: dict[str, Any] = {"timing": FAST_TIMING}
    if own is not None:
        section["metrics"] = {"metricsIntervalSecs": own}
    return section


def _emission(framework: int | None) -> dict[str, Any]:
    emission: dict[str, Any] = {"enabled": True, "target": "log"}
    if framework is not None:
        emission["intervalSeconds"] = framework
    return emission


def interval(adapter: Adapter) -> float:
    reporter = adapter.runtime._reporter
    assert reporter is not None
    return reporter.interval


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
@pytest.mark.parametrize(
    ("framework", "own", "expected"),
    [
        pytest.param(None, None, 60.0, id="neither-set"),
        pytest.param(5, None, 5.0, id="only-framework"),
        pytest.param(None, 7, 7.0, id="only-adapter"),
        pytest.param(5, 7, 7.0, id="both-set-adapter-wins"),
    ],
)
def test_the_adapter_key_applies_only_when_given(
    start: Callable[..., Adapter], adapter: str, framework: int | None, own: int | None, expected
) -> None:
    assert interval(start(adapter, framework, own)) == expected


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_reload_that_drops_the_adapter_key_falls_back_to_the_framework_key(
    start: Callable[..., Adapter], adapter: str
) -> None:
    running = start(adapter, 5, 7)
    assert interval(running) == 7.0
    document = dict(running.document)
    document["component"] = {**document["component"], "global": _global(None)}
    running.reload(document)
    wait_until(lambda: interval(running) == 5.0, 10, "the framework's interval after reload")
    document["component"] = {**document["component"], "global": _global(9)}
    running.reload(document)
    wait_until(lambda: interval(running) == 9.0, 10, "the adapter's interval after reload")
