"""cpppo's Logix simulator and the ethernet-ip-adapter run against it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support.adapter import Adapter, AdapterHarness
from tests.support.cpppo import LogixSimulator
from tests.support.mosquitto import Mosquitto
from tests.support.tiers import server_fixture
from unskit.cip.component import EthernetIpAdapter

#: Every elementary type the adapter reads, arrays, a BOOL array and one past cpppo's
#: 500-byte reply limit.
TAGS = (
    "Temp=REAL",
    "Level=LREAL",
    "Count=DINT",
    "Speed=INT",
    "Small=SINT",
    "Total=LINT",
    "Ucount=UDINT",
    "Flag=BOOL",
    "Counts=DINT[10]",
    "Flags=BOOL[16]",
    "Big=DINT[1000]",
)


@server_fixture
def logix(tmp_path: Path) -> Iterator[LogixSimulator]:
    simulator = LogixSimulator(TAGS, tmp_path / "cpppo").start()
    yield simulator
    simulator.stop()


def plc_signal(tag: str, kind: str, **settings: Any) -> dict[str, Any]:
    return {"name": tag.lower().replace("[", "-").rstrip("]"), "tagPath": tag, "type": kind}


def plc_instance(
    instance_id: str, endpoint: str, *signals: dict[str, Any], **settings: Any
) -> dict[str, Any]:
    return {
        "id": instance_id,
        "connection": {"endpoint": endpoint},
        "pollGroups": [{"id": "fast", "pollIntervalMs": 50, "signals": list(signals)}],
        **settings,
    }


#: Quick reconnects and probes, so outage tests finish in seconds.
FAST_TIMING = {
    "connectMs": 1000,
    "requestTimeoutMs": 1000,
    "reconnectBackoffMinMs": 50,
    "reconnectBackoffMaxMs": 200,
    "keepaliveProbeIntervalMs": 50,
}


@server_fixture
def start_cip(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[Callable[..., Adapter]]:
    harness = AdapterHarness(broker, tmp_path)

    def start(instances: list[dict[str, Any]], **global_: Any) -> Adapter:
        component = {"instances": instances, "global": {"timing": FAST_TIMING, **global_}}
        return harness.start(EthernetIpAdapter, harness.document(component))

    yield start
    harness.close()
