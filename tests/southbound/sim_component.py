"""A southbound component for the runtime tests: `sim` devices and `test` devices whose
reachability the test switches, with a small instance format of its own."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from unskit.config.model import ComponentConfig, thaw
from unskit.southbound.component import Candidate, SouthboundComponent
from unskit.southbound.driver import (
    Deadband,
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    PublishMode,
    Quality,
    Reading,
    ReadingSink,
    SignalSpec,
    Timing,
)
from unskit.southbound.service import DriverFactory, Skipped
from unskit.southbound.sim import SimDriver, sim_value


class Switch:
    """Whether the `test` devices answer; shared by every SwitchedDriver of a test."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.up.set()
        #: Set: the device accepts a session, answers `answers` reads (pushes) on it and ends
        #: it at the next, as a controller does on a request it cannot parse.
        self.drop = threading.Event()
        self.answers = 0
        self.connects = 0
        self.connect_times: list[float] = []
        self.probes = 0
        self.reads = 0
        #: Set: a read raises an exception no driver should (a bug), not a DeviceError.
        self.explode = threading.Event()
        #: Raw values the device reads for these signal ids instead of its waveform.
        self.values: dict[str, Any] = {}


class SwitchedDriver(SimDriver):
    """A sim device that can be made unreachable."""

    switch = Switch()
    #: Answers given on the current session.
    session_answers = 0

    def connect(self, deadline_s: float) -> None:
        self.switch.connects += 1
        self.switch.connect_times.append(time.monotonic())
        if not self.switch.up.is_set():
            raise DeviceError("connection refused (test switch off)")
        self.session_answers = 0
        super().connect(deadline_s)

    def _drops(self) -> bool:
        """Whether the device ends the session now (counting this answer otherwise)."""
        if self.switch.drop.is_set() and self.session_answers >= self.switch.answers:
            return True
        self.session_answers += 1
        return False

    def read(self, group: PollGroupSpec) -> list[Reading]:
        self.switch.reads += 1
        if not self.switch.up.is_set():
            raise DeviceError("connection reset (test switch off)", connection_lost=True)
        if self._drops():
            raise DeviceError("session ended by the device (test drop)", connection_lost=True)
        if self.switch.explode.is_set():
            raise RuntimeError("driver bug (test explode)")
        readings = super().read(group)
        values = dict(self.switch.values)
        return [
            dataclasses.replace(r, value=values[r.signal_id]) if r.signal_id in values else r
            for r in readings
        ]

    def probe(self) -> None:
        self.switch.probes += 1
        if not self.switch.up.is_set():
            raise DeviceError("probe failed", connection_lost=True)


class PushedDriver(SwitchedDriver):
    """A push source for the runtime tests: after `subscribe` its own thread delivers every
    signal's sim value every 20 ms, as an OPC UA subscription would. Signals whose id holds
    "broken" fail (BAD, BadNodeIdUnknown) until `Pushed.healed` is set and `maintain` retries
    them; `Pushed.extra` signals appear when the test calls `announce()`."""

    def __init__(self, spec: InstanceSpec) -> None:
        super().__init__(spec)
        self._sink: ReadingSink | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: set[str] = set()
        #: The last `hold` the runtime asked for (pause True, resume False).
        self.held = False
        Pushed.drivers.append(self)

    def subscribe(self, sink: ReadingSink) -> None:
        Pushed.subscribes += 1
        self._sink = sink
        self._failed = {s.id for s in self.signals() if "broken" in s.id}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, args=(sink, self._stop), daemon=True)
        self._thread.start()

    def _send(self, sink: ReadingSink, stop: threading.Event) -> None:
        while not stop.wait(0.02):
            if not self.switch.up.is_set():
                sink.lost(DeviceError("session closed by the server (test switch off)"))
                return
            if self._drops():
                sink.lost(DeviceError("session ended by the device (test drop)"))
                return
            now = time.time()
            sink.deliver(
                [
                    Reading(
                        s.id,
                        None if s.id in self._failed else sim_value(s, now),
                        Quality.BAD if s.id in self._failed else Quality.GOOD,
                        source_timestamp_ms=int(now * 1000),
                        detail="BadNodeIdUnknown" if s.id in self._failed else "",
                    )
                    for s in self.signals()
                ]
            )

    def signals(self) -> Sequence[SignalSpec]:
        return [*self.spec.signals(), *Pushed.extra]

    def signal_for(self, signal_id: str) -> SignalSpec:
        if not signal_id.startswith("Program:"):
            raise ValueError(f"{signal_id!r} is not a tag path")
        return SignalSpec(signal_id, signal_id, "REAL")

    def hold(self, paused: bool) -> None:
        self.held = paused

    def maintain(self) -> float | None:
        Pushed.maintains += 1
        if Pushed.healed.is_set():
            self._failed.clear()
        return 0.05 if self._failed else None

    def announce(self) -> None:
        assert self._sink is not None
        self._sink.signals_changed()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        super().close()


class Pushed:
    """What the PushedDriver tests switch and count (reset by the fixture)."""

    drivers: ClassVar[list[PushedDriver]] = []
    extra: ClassVar[list[SignalSpec]] = []
    healed = threading.Event()
    subscribes = 0
    maintains = 0

    @classmethod
    def reset(cls) -> None:
        cls.drivers, cls.extra, cls.healed = [], [], threading.Event()
        cls.subscribes = cls.maintains = 0


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

        return {"sim": SimDriver, "test": test_driver, "push": PushedDriver}

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
