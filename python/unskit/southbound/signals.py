"""Per-signal state of one instance: scaling, the change gate (publishMode and deadband),
batch windows, staleness and the last value for sb/read and sb/signals."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from unskit.southbound.driver import PublishMode, Quality, Reading, SignalSpec

__all__ = ["INTEGER_RANGES", "SignalState", "SignalTable", "channel_token", "scale_value"]

#: The CIP (and IEC 61131) integer types and their ranges.
INTEGER_RANGES = {
    "SINT": (-128, 127),
    "INT": (-32768, 32767),
    "DINT": (-(2**31), 2**31 - 1),
    "LINT": (-(2**63), 2**63 - 1),
    "USINT": (0, 255),
    "UINT": (0, 65535),
    "UDINT": (0, 2**32 - 1),
    "ULINT": (0, 2**64 - 1),
}

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def channel_token(path: str) -> str:
    """A signal path sanitised to one topic token: every run of characters other than
    letters, digits, dot, underscore and hyphen becomes one underscore."""
    token = _UNSAFE.sub("_", path).strip("_")
    return token or "_"


def scale_value(spec: SignalSpec, raw: Any) -> Any:
    """raw * scale + offset for numeric signals (element-wise for arrays); others as read."""
    if not spec.numeric or (spec.scale is None and spec.offset is None) or raw is None:
        return raw
    scale = 1.0 if spec.scale is None else spec.scale
    offset = 0.0 if spec.offset is None else spec.offset
    if isinstance(raw, list):
        return [item * scale + offset for item in raw]
    return raw * scale + offset


def _changed(spec: SignalSpec, last: Any, value: Any) -> bool:
    if isinstance(value, list) or isinstance(last, list):
        if not isinstance(value, list) or not isinstance(last, list) or len(value) != len(last):
            return True
        return any(_element_changed(spec, a, b) for a, b in zip(last, value, strict=True))
    return _element_changed(spec, last, value)


def _element_changed(spec: SignalSpec, last: Any, value: Any) -> bool:
    kind = spec.deadband.type
    if kind == "none" or not isinstance(value, (int, float)) or isinstance(value, bool):
        return bool(value != last) and not _both_nan(last, value)
    if not isinstance(last, (int, float)):
        return True
    if math.isnan(value) or math.isnan(last) or math.isinf(value) or math.isinf(last):
        # Not a number or infinite: any transition publishes, a repeat does not.
        return not (_both_nan(last, value) or value == last)
    threshold = spec.deadband.value
    if kind == "percent":
        if last == 0:
            return bool(value != last)
        threshold = abs(last) * spec.deadband.value / 100.0
    return abs(value - last) >= threshold and value != last


def _both_nan(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


@dataclass
class SignalState:
    spec: SignalSpec
    group: str
    channel: str
    last_value: Any = None
    last_quality: Quality | None = None
    last_source_ms: int = 0
    last_server_ms: int = 0
    last_detail: str = ""
    published_value: Any = None
    published_quality: Quality | None = None
    last_good_monotonic: float | None = None
    pending: list[dict[str, Any]] = field(default_factory=list)
    window_ends: float | None = None


class SignalTable:
    """The signals of one instance, by stable id."""

    def __init__(self, signals: Iterable[tuple[str, SignalSpec]]) -> None:
        self.by_id: dict[str, SignalState] = {}
        for group, spec in signals:
            self.by_id[spec.id] = SignalState(spec, group, channel_token(spec.name))

    def accept(self, readings: Sequence[Reading], now_ms: int, now: float) -> None:
        """Scales readings and queues the ones the change gate lets through."""
        for reading in readings:
            state = self.by_id.get(reading.signal_id)
            if state is None:
                continue
            value = scale_value(state.spec, reading.value)
            state.last_value, state.last_quality = value, reading.quality
            state.last_source_ms, state.last_server_ms = reading.source_timestamp_ms, now_ms
            state.last_detail = reading.detail
            if reading.quality is Quality.GOOD:
                state.last_good_monotonic = now
            if not self._passes(state, value, reading.quality):
                continue
            state.published_value, state.published_quality = value, reading.quality
            state.pending.append(
                {
                    "value": value,
                    "quality": reading.quality.value,
                    "source_timestamp_ms": reading.source_timestamp_ms,
                    "server_timestamp_ms": now_ms,
                }
            )
            if state.window_ends is None:
                state.window_ends = now + state.spec.batch_ms / 1000.0

    @staticmethod
    def _passes(state: SignalState, value: Any, quality: Quality) -> bool:
        if state.published_quality is None or quality != state.published_quality:
            return True  # the first sample, and every quality change
        if state.spec.publish_mode is PublishMode.ALWAYS:
            return True
        return _changed(state.spec, state.published_value, value)

    def due(self, now: float, *, flush: bool = False) -> list[SignalState]:
        """Signals whose batch window has closed (every signal with samples when flushing)."""
        return [
            state
            for state in self.by_id.values()
            if state.pending
            and (flush or state.window_ends is None or state.window_ends <= now + 1e-9)
        ]

    def next_window(self) -> float | None:
        """The earliest open window's end (monotonic seconds), if any."""
        ends = [s.window_ends for s in self.by_id.values() if s.pending and s.window_ends]
        return min(ends) if ends else None

    def take(self, state: SignalState) -> list[dict[str, Any]]:
        samples, state.pending, state.window_ends = state.pending, [], None
        return samples

    def stale(self, now: float, threshold_s: float) -> list[SignalState]:
        """Signals with no good read for longer than the threshold."""
        return [
            state
            for state in self.by_id.values()
            if state.last_good_monotonic is None or now - state.last_good_monotonic > threshold_s
        ]

    def restart_staleness(self, now: float) -> None:
        """After a pause: the paused time does not count towards staleness."""
        for state in self.by_id.values():
            state.last_good_monotonic = now
