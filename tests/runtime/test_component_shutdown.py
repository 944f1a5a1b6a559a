"""Every component run as `unskit run NAME` on a real Mosquitto, its metrics on, stopped by
SIGTERM: exit 0 and nothing at ERROR and no traceback in its log. The stores a component's
metrics read (camera catalog, egress progress, command records) close only after the final
metric emission and after messaging has drained."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.adapter import framework_sections
from tests.support.logs import recording_logs
from tests.support.mosquitto import Mosquitto
from tests.support.opcua import SIM, OpcUaSim
from tests.support.servers import component_process, wait_until

from unskit.config import load_config
from unskit.runtime.component import Runtime

pytestmark = pytest.mark.integration


def _echo(_tmp: Path, _sim: Callable[[], OpcUaSim]) -> dict[str, Any]:
    return {}


def _ethernet_ip(_tmp: Path, _sim: Callable[[], OpcUaSim]) -> dict[str, Any]:
    signals = [{"name": "speed", "tagPath": "Speed", "type": "REAL"}]
    return {
        "instances": [
            {
                "id": "press-1",
                "adapter": "sim",
                "connection": {"endpoint": "sim.local"},
                "pollGroups": [{"id": "fast", "pollIntervalMs": 100, "signals": signals}],
            }
        ]
    }


def _opcua(_tmp: Path, sim: Callable[[], OpcUaSim]) -> dict[str, Any]:
    server = sim()
    return {
        "instances": [
            {
                "id": "line1",
                "connection": {"endpoint": server.endpoint, "securityPolicy": "None"},
                "subscriptions": [
                    {"id": "sim", "include": [{"namespaceUri": SIM, "match": "^Counter$"}]}
                ],
            }
        ]
    }


def _camera(tmp: Path, _sim: Callable[[], OpcUaSim]) -> dict[str, Any]:
    return {
        "cameras": [
            {
                "instance": "cam-1",
                "backend": "sim",
                "connection": {"width": 320, "height": 240},
                "schedules": [{"id": "often", "intervalMs": 200}],
            }
        ],
        "storage": {
            "outputRoot": str(tmp / "images"),
            "outputMinFreeBytes": 0,
            "stateMinFreeBytes": 0,
            "fsync": False,
        },
    }


def _egress(tmp: Path, _sim: Callable[[], OpcUaSim]) -> dict[str, Any]:
    source = tmp / "source"
    source.mkdir()
    (source / "a.csv").write_bytes(b"x" * 4096)
    return {
        "instances": [
            {
                "id": "line-1",
                "source": {"path": str(source), "settleSeconds": 0},
                "egress": [{"id": "nas", "type": "local", "path": str(tmp / "nas")}],
            }
        ]
    }


def _recorder(tmp: Path, _sim: Callable[[], OpcUaSim]) -> dict[str, Any]:
    return {"output": {"path": str(tmp / "parquet")}}


COMPONENTS = {
    "echo": _echo,
    "ethernet-ip-adapter": _ethernet_ip,
    "opcua-adapter": _opcua,
    "camera-adapter": _camera,
    "file-egress": _egress,
    "signal-recorder": _recorder,
}


@pytest.fixture
def opcua_sim(tmp_path: Path) -> Iterator[Callable[[], OpcUaSim]]:
    started: list[OpcUaSim] = []

    def start() -> OpcUaSim:
        sim = OpcUaSim(tmp_path / "opcua-sim")
        started.append(sim)
        return sim.start()

    yield start
    for sim in started:
        sim.stop()


def metric_emits(log: Path) -> int:
    return log.read_text(errors="replace").count('"metrics":[')


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_sigterm_exits_0_with_no_error_and_no_traceback(
    name: str, broker: Mosquitto, tmp_path: Path, opcua_sim: Callable[[], OpcUaSim]
) -> None:
    document = {
        **framework_sections(broker.plain_port, tmp_path),
        "component": COMPONENTS[name](tmp_path, opcua_sim),
        # Every metric is read on each emit and once more at shutdown; the probes and the
        # heartbeat run too, as they do in production.
        "metricEmission": {"enabled": True, "target": "log", "intervalSeconds": 1},
        "health": {"enabled": True, "port": 0},
        "heartbeat": {"enabled": True, "intervalSeconds": 1},
        "logging": {"level": "INFO"},
    }
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps(document))
    log = tmp_path / f"{name}.log"
    with component_process(name, log, "-c", str(config), "-t", "gw") as process:
        wait_until(
            lambda: f"{name} running".encode() in log.read_bytes() or process.poll() is not None,
            60,
            f"{name} to start",
        )
        assert process.poll() is None, log.read_text()
        # One emit while running, so the readers have all been read before the drain.
        wait_until(lambda: metric_emits(log) >= 1, 30, f"a metrics emit of {name}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()[-5000:]
    output = log.read_text()
    assert "shutdown: complete" in output, output[-5000:]
    errors = [line for line in output.splitlines() if "[ERROR]" in line or "[CRITICAL]" in line]
    assert errors == [], output[-5000:]
    assert "Traceback" not in output, output[-5000:]


class _StoreComponent:
    """A component whose queue gauge reads a store it closes in close(), recording when."""

    token = "store-test"
    schema = None

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.closed = False
        self.runtime: Runtime | None = None

    def start(self, runtime: Runtime) -> None:
        self.runtime = runtime
        runtime.observe_queue("store", self._depth)

    def _depth(self) -> int:
        assert not self.closed, "the gauge read a closed store"
        self.calls.append("read")
        return 0

    def drain(self) -> None:
        self.calls.append("drain")

    def close(self) -> None:
        assert self.runtime is not None
        messaging = self.runtime.get_messaging()
        self.calls.append("close after messaging" if not messaging.connected() else "close")
        self.closed = True


def test_close_runs_after_the_final_metric_read_and_messaging(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> None:
    document = {
        **framework_sections(broker.plain_port, tmp_path),
        "component": {},
        "metricEmission": {"enabled": True, "target": "log", "intervalSeconds": 3600},
    }
    path = tmp_path / "store.json"
    path.write_text(json.dumps(document))
    app = _StoreComponent()
    runtime = Runtime(load_config(path, thing="gw", default_component=app.token))
    with recording_logs() as logs:
        runtime.start(app)
        wait_until(runtime.get_messaging().connected, 10, "the component to connect")
        runtime.shutdown()
        runtime.shutdown()  # once only
    # The final emission read the store after the drain; the store closed after messaging.
    assert app.calls == ["drain", "read", "close after messaging"]
    assert logs.tracebacks() == []
    assert not [r for r in logs.records if r.levelno >= logging.ERROR]
