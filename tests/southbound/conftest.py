"""The sim southbound component in-process on a real Mosquitto, with a client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.southbound.sim_component import Pushed, SimComponent, Switch, SwitchedDriver
from tests.support.adapter import Adapter, AdapterHarness
from tests.support.mosquitto import Mosquitto
from tests.support.tiers import server_fixture


def real_signal(name: str, **settings: Any) -> dict[str, Any]:
    return {"id": f"Program:Main.{name}", "name": name, "type": "REAL", **settings}


def instance(instance_id: str, *signals: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {
        "id": instance_id,
        "groups": [{"id": "fast", "intervalMs": 20, "signals": list(signals)}],
        **settings,
    }


@server_fixture
def start_adapter(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[Callable[..., Adapter]]:
    SwitchedDriver.switch = Switch()
    Pushed.reset()
    SimComponent.unstartable = set()
    harness = AdapterHarness(broker, tmp_path)

    def start(
        instances: list[dict[str, Any]],
        timing: dict[str, Any] | None = None,
        **sections: Any,
    ) -> Adapter:
        component = {
            "instances": instances,
            "timing": {
                "reconnect_backoff_min_ms": 20,
                "reconnect_backoff_max_ms": 100,
                "keepalive_probe_interval_ms": 30,
                **(timing or {}),
            },
        }
        return harness.start(SimComponent, harness.document(component, **sections))

    yield start
    harness.close()
