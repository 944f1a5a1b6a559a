"""A southbound component for the runtime tests: `sim` devices and `test` devices whose
reachability the test switches, with a small instance format of its own."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from unskit.config.model import ComponentConfig, thaw
from unskit.southbound.component import Candidate, SouthboundComponent
from unskit.southbound.driver import (
    Deadband,
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    PublishMode,
    Reading,
    SignalSpec,
    Timing,
)
from unskit.southbound.service import DriverFactory, Skipped
from unskit.southbound.sim import SimDriver


class Switch:
    """Whether the `test` devices answer; shared by every SwitchedDriver of a test."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.up.set()
        self.connects = 0
        self.probes = 0
        self.reads = 0


class SwitchedDriver(SimDriver):
    """A sim device that can be made unreachable."""

    switch = Switch()

    def connect(self, deadline_s: float) -> None:
        self.switch.connects += 1
        if not self.switch.up.is_set():
            raise DeviceError("connection refused (test switch off)")
        super().connect(deadline_s)

    def read(self, group: PollGroupSpec) -> list[Reading]:
        self.switch.reads += 1
        if not self.switch.up.is_set():
            raise DeviceError("connection reset (test switch off)", connection_lost=True)
        return super().read(group)

    def probe(self) -> None:
        self.switch.probes += 1
        if not self.switch.up.is_set():
            raise DeviceError("probe failed", connection_lost=True)


def _signal(entry: Mapping[str, Any], group: Mapping[str, Any]) -> SignalSpec:
    deadband = entry.get("deadband", {})
    return SignalSpec(
        id=entry["id"],
        name=entry["name"],
        type=entry.get("type", "REAL"),
        array_count=entry.get("arrayCount"),
        scale=entry.get("scale"),
        offset=entry.get("offset"),
        deadband=Deadband(deadband.get("type", "none"), deadband.get("value", 0.0)),
        publish_mode=PublishMode(entry.get("publishMode", group.get("publishMode", "onChange"))),
        batch_ms=entry.get("batchMs", group.get("batchMs", 0)),
    )


class SimComponent(SouthboundComponent):
    token: ClassVar[str] = "sim-adapter"
    schema: ClassVar[Mapping[str, Any] | None] = {"type": "object"}
    unstartable: ClassVar[set[str]] = set()

    def drivers(self) -> Mapping[str, DriverFactory]:
        def test_driver(spec: InstanceSpec) -> SwitchedDriver:
            if spec.id in self.unstartable:
                raise ValueError(f"{spec.id} has a broken certificate (test)")
            return SwitchedDriver(spec)

        return {"sim": SimDriver, "test": test_driver}

    def parse(self, config: ComponentConfig) -> Candidate:
        component = thaw(config.component)
        timing = Timing(**component.get("timing", {}))
        specs: list[InstanceSpec] = []
        skipped: list[Skipped] = []
        seen: set[str] = set()
        for index, entry in enumerate(component.get("instances", [])):
            if not isinstance(entry.get("id"), str) or "groups" not in entry:
                skipped.append(Skipped(str(entry.get("id", f"#{index}")), "malformed entry"))
                continue
            if entry["id"] in seen:
                skipped.append(Skipped(entry["id"], "duplicate id: the first one wins"))
                continue
            seen.add(entry["id"])
            groups = [
                PollGroupSpec(
                    group.get("id", f"group-{n + 1}"),
                    group.get("intervalMs", 50),
                    [_signal(signal, group) for signal in group["signals"]],
                )
                for n, group in enumerate(entry["groups"])
            ]
            specs.append(
                InstanceSpec(
                    id=entry["id"],
                    adapter=entry.get("adapter", "sim"),
                    endpoint=f"sim://{entry['id']}",
                    poll_groups=groups,
                    writes_allow=frozenset(entry.get("writes", [])),
                    timing=timing,
                    entry=entry,
                )
            )
        return Candidate(specs, skipped)
