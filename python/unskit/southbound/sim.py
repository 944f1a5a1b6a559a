"""`adapter: sim`: a device without hardware. Values are deterministic waveforms of the wall
clock (the same instant gives the same value in every process), so demos and tests can
predict them: REAL/LREAL a sine, integers a counter, BOOL a square wave. Writes override a
signal's value until the next write."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from unskit.elementary_types import INTEGER_RANGES
from unskit.southbound.driver import InstanceSpec, PollGroupSpec, Reading, SignalSpec

__all__ = ["SimDriver", "sim_value"]

#: Waveform period in seconds, shared by every sim signal.
PERIOD_S = 60.0


def _phase(signal: SignalSpec, element: int) -> float:
    # A stable phase per signal and element, so signals are not all in step.
    return (sum(signal.id.encode()) + 7 * element) % 360 * math.pi / 180


def _element(signal: SignalSpec, element: int, at_s: float) -> Any:
    kind = signal.type.upper()
    if kind == "BOOL":
        return int((at_s + element) // 5) % 2 == 0
    if kind in INTEGER_RANGES:
        low, high = INTEGER_RANGES[kind]
        return low + (int(at_s) + element) % min(high - low + 1, 10_000)
    return round(50.0 + 50.0 * math.sin(2 * math.pi * at_s / PERIOD_S + _phase(signal, element)), 6)


def sim_value(signal: SignalSpec, at_s: float) -> Any:
    """The raw value of a sim signal at wall-clock second `at_s`."""
    if signal.array_count is None:
        return _element(signal, 0, at_s)
    return [_element(signal, i, at_s) for i in range(signal.array_count)]


class SimDriver:
    """A `DeviceDriver` that needs no device."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self._overrides: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._open = False

    def connect(self, deadline_s: float) -> None:
        self._open = True

    def read(self, group: PollGroupSpec) -> list[Reading]:
        now = time.time()
        with self._lock:
            overrides = dict(self._overrides)
        return [
            Reading(
                signal.id,
                overrides.get(signal.id, sim_value(signal, now)),
                source_timestamp_ms=int(now * 1000),
            )
            for signal in group.signals
        ]

    def write(self, signal: SignalSpec, value: Any) -> None:
        with self._lock:
            self._overrides[signal.id] = value

    def probe(self) -> None:
        return None

    def close(self) -> None:
        self._open = False

    def describe(self) -> Mapping[str, Any]:
        return {"adapter": "sim", "waveformPeriodSecs": PERIOD_S}
