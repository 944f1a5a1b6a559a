"""Per-signal state of one instance: scaling, the change gate (publishMode and deadband),
batch windows, staleness and the last value for sb/read and sb/signals."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from unskit.envelope import MAX_SAMPLE_STATUS_BYTES, MessageBuilder
from unskit.errors import EnvelopeError
from unskit.signal import GateSpec, SignalBank, scale_values
from unskit.southbound.driver import PublishMode, Quality, Reading, SignalSpec

__all__ = [
    "SignalState",
    "SignalTable",
    "bounded_status",
    "channel_token",
    "not_encodable",
    "scale_value",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def channel_token(path: str) -> str:
    """A signal path sanitised to one topic token: every run of characters other than
    letters, digits, dot, underscore and hyphen becomes one underscore."""
    token = _UNSAFE.sub("_", path).strip("_")
    return token or "_"


def bounded_status(detail: str) -> str:
    """A reading's detail as a sample status: a longer one (a CIP error text) is cut to the
    envelope's bound, on a character boundary, so the update is still published."""
    return detail.encode()[:MAX_SAMPLE_STATUS_BYTES].decode(errors="ignore")


def not_encodable(value: Any) -> str | None:
    """The status of a value the envelope cannot carry (``not encodable: <why>``, within the
    status bound), or None when it can: what a sample, sb/signals and sb/read show instead."""
    try:
        MessageBuilder("-", "-").body([value])
    except (EnvelopeError, TypeError, ValueError) as error:
        why = str(error).removeprefix("invalid envelope: ").replace("body[0]", "value", 1)
        return bounded_status(f"not encodable: {why}")
    return None


def _numbers(raw: Any) -> bool:
    return isinstance(raw, (int, float)) and not isinstance(raw, bool)


def _unscaled(spec: SignalSpec) -> bool:
    return spec.scale is None and spec.offset is None


def scale_value(spec: SignalSpec, raw: Any) -> Any:
    """raw * scale + offset for numeric signals (element-wise for arrays) through the Rust
    kernel; others, and unscaled signals (integers stay integers), as read."""
    if not spec.numeric or _unscaled(spec) or raw is None:
        return raw
    if isinstance(raw, list):
        return scale_values(raw, spec.scale, spec.offset) if all(map(_numbers, raw)) else raw
    return scale_values([raw], spec.scale, spec.offset)[0] if _numbers(raw) else raw


def _gate_spec(spec: SignalSpec) -> GateSpec:
    deadband: Any = spec.deadband.type
    return GateSpec(spec.scale, spec.offset, deadband, spec.deadband.value, spec.publish_mode.value)


def _fresh(state: SignalState, quality: Quality) -> bool:
    """The first sample, and every quality change, restart the gate."""
    return state.published_quality is None or quality != state.published_quality


def _rounds(readings: Sequence[Reading]) -> Iterator[Sequence[Reading]]:
    """`readings` cut before each repeat of a signal, so a signal's later reading is gated
    after its earlier one is recorded (whose quality decides whether the gate restarts)."""
    start, seen = 0, set[str]()
    for k, reading in enumerate(readings):
        if reading.signal_id in seen:
            yield readings[start:k]
            start, seen = k, set()
        seen.add(reading.signal_id)
    yield readings[start:]


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
    #: The signal's slots in the instance's SignalBank (one per element), or None for
    #: signals the numeric gate does not apply to (BOOL, strings).
    slots: range | None = None
    #: The data topic, built on the first publication (a topic is validated as it is made).
    topic: str | None = None


class SignalTable:
    """The signals of one instance, by stable id."""

    def __init__(self, signals: Iterable[tuple[str, SignalSpec]]) -> None:
        self.by_id: dict[str, SignalState] = {}
        #: Scaling and the change gate of every numeric signal, in Rust.
        self._bank = SignalBank([])
        self.define(signals, None)

    def define(self, signals: Iterable[tuple[str, SignalSpec]], now: float | None) -> None:
        """Sets the signals (a push source's change as it browses): a signal still present
        keeps its last value and pending samples, a new one starts its staleness clock at
        `now`, a removed one is forgotten. Every change gate starts afresh."""
        previous, self.by_id = self.by_id, {}
        gates: list[GateSpec] = []
        for group, spec in signals:
            old = previous.get(spec.id)
            if old is not None and old.spec == spec:
                state, state.group = old, group
            else:
                state = SignalState(spec, group, channel_token(spec.name))
                state.last_good_monotonic = now
            state.slots, state.published_quality = None, None
            if spec.numeric:
                count = spec.array_count or 1
                state.slots = range(len(gates), len(gates) + count)
                gates += [_gate_spec(spec)] * count
            self.by_id[spec.id] = state
        self._bank = SignalBank(gates)

    def accept(self, readings: Sequence[Reading], now_ms: int, now: float) -> None:
        """Scales readings and queues the ones the change gate lets through."""
        for batch in _rounds(readings):
            scalars = self._gate_scalars(batch)
            for k, reading in enumerate(batch):
                self._record(reading, scalars.get(k), now_ms, now)

    def _record(
        self, reading: Reading, gated: tuple[Any, bool] | None, now_ms: int, now: float
    ) -> None:
        state = self.by_id.get(reading.signal_id)
        if state is None:
            return
        if gated is None:
            gated = self._gate(state, reading.value, reading.quality)
        value, passed = gated
        state.last_value, state.last_quality = value, reading.quality
        server_ms = reading.server_timestamp_ms or now_ms
        state.last_source_ms, state.last_server_ms = reading.source_timestamp_ms, server_ms
        state.last_detail = reading.detail
        if reading.quality is Quality.GOOD:
            state.last_good_monotonic = now
        if not passed:
            return
        state.published_value, state.published_quality = value, reading.quality
        sample = {
            "value": value,
            "quality": reading.quality.value,
            "source_timestamp_ms": reading.source_timestamp_ms,
            "server_timestamp_ms": server_ms,
        }
        if reading.detail:
            sample["status"] = bounded_status(reading.detail)
        state.pending.append(sample)
        if state.window_ends is None:
            state.window_ends = now + state.spec.batch_ms / 1000.0

    def _gate_scalars(self, readings: Sequence[Reading]) -> dict[int, tuple[Any, bool]]:
        """The numeric scalar readings through the bank in one batch (one Rust call per
        poll): position -> (value to publish, passed). `readings` name each signal once."""
        positions: list[int] = []
        slots: list[int] = []
        raws: list[float] = []
        for k, reading in enumerate(readings):
            state = self.by_id.get(reading.signal_id)
            if state is None or state.slots is None or len(state.slots) != 1:
                continue
            if not _numbers(reading.value):
                continue
            if _fresh(state, reading.quality):
                self._bank.reset(state.slots.start)
            positions.append(k)
            slots.append(state.slots.start)
            raws.append(float(reading.value))
        if not positions:
            return {}
        batch = self._bank.offer_batch(slots, raws)
        gated: dict[int, tuple[Any, bool]] = {}
        for i, k in enumerate(positions):
            raw = readings[k].value
            unscaled = _unscaled(self.by_id[readings[k].signal_id].spec)
            gated[k] = (raw if unscaled else batch.values[i]), batch.mask[i]
        return gated

    def _gate(self, state: SignalState, raw: Any, quality: Quality) -> tuple[Any, bool]:
        """The value to publish and whether it passes, for what `_gate_scalars` leaves: the
        first sample and every quality change pass; numeric arrays go through the bank
        (scaling, publishMode, deadband)."""
        spec = state.spec
        fresh = _fresh(state, quality)
        slots = state.slots
        if (
            slots is not None
            and isinstance(raw, list)
            and len(raw) == len(slots)
            and all(map(_numbers, raw))
        ):
            if fresh:
                for slot in slots:
                    self._bank.reset(slot)
            passed, values = self._bank.offer_array(slots.start, raw)
            return (raw if _unscaled(spec) else values), passed
        # BOOL, strings, BAD readings without a value, arrays of the wrong length.
        value = scale_value(spec, raw)
        always = spec.publish_mode is PublishMode.ALWAYS
        return value, fresh or always or value != state.published_value

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

    def touch(self, signal_ids: Iterable[str], now: float) -> None:
        """Signals read good now without a new sample (a change-only push source)."""
        for signal_id in signal_ids:
            state = self.by_id.get(signal_id)
            if state is not None and state.last_quality in (None, Quality.GOOD):
                state.last_good_monotonic = now

    def restart_staleness(self, now: float) -> None:
        """After a pause: the paused time does not count towards staleness."""
        for state in self.by_id.values():
            state.last_good_monotonic = now
