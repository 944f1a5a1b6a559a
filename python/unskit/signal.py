"""Scaling and deadband kernels (Rust) for every adapter: `raw * scale + offset` and the
change gate that decides which samples are due for publication.

The gate's rule is `docs/decisions.md` ("Change gate"): the first sample of a signal always
publishes; publishMode ``always`` bypasses the deadband; ``none`` publishes any change;
``absolute`` needs ``|new - last| >= value``; ``percent`` needs it ``>= value% of |last|``
(from a last value of 0, any change). ``last`` is the last *published* scaled value. NaN and
infinities publish on every transition and never on a repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from unskit._core import signal as _signal

__all__ = ["GateBatch", "GateSpec", "SignalBank", "scale_values"]

DeadbandType = Literal["none", "absolute", "percent"]


@dataclass(frozen=True)
class GateSpec:
    """One signal's scaling and change gate, as the configuration states them."""

    scale: float | None = None
    offset: float | None = None
    deadband: DeadbandType = "none"
    deadband_value: float = 0.0
    publish_mode: Literal["onChange", "always"] = "onChange"

    def as_tuple(self) -> tuple[float | None, float | None, str, float, bool]:
        return (
            self.scale,
            self.offset,
            self.deadband,
            float(self.deadband_value),
            self.publish_mode == "always",
        )


@dataclass(frozen=True)
class GateBatch:
    """A batch's outcome in arrival order: ``mask[i]`` (bool) and ``values[i]`` (float,
    scaled) for sample ``i``. Both are zero-copy views; ``numpy.frombuffer(batch.values)``
    works too."""

    mask: memoryview[bool]
    values: memoryview[float]

    def passed(self) -> list[int]:
        """Positions of the samples that passed the gate."""
        return [i for i, ok in enumerate(self.mask) if ok]


class SignalBank:
    """N signals' gates and last published values, addressed by position (0..N-1)."""

    def __init__(self, specs: Sequence[GateSpec]) -> None:
        self._bank = _signal.SignalBank([spec.as_tuple() for spec in specs])

    def __len__(self) -> int:
        return len(self._bank)

    def offer(self, index: int, raw: float) -> tuple[bool, float]:
        """One sample: (passed, scaled value)."""
        return self._bank.offer(index, raw)

    def offer_array(self, start: int, values: Sequence[float]) -> tuple[bool, list[float]]:
        """One sample of an array whose elements are signals start..start+n-1: (passed,
        scaled values); when any element passes, every element becomes last published."""
        return self._bank.offer_array(start, list(values))

    def offer_batch(self, signal_indices: Any, values: Any) -> GateBatch:
        """Samples in arrival order; both arguments are NumPy arrays, other numeric buffers
        or lists. Large batches run with the GIL released. A bad index raises `SignalError`
        and changes nothing."""
        mask, scaled = self._bank.offer_batch(signal_indices, values)
        return GateBatch(memoryview(mask).cast("?"), memoryview(scaled).cast("d"))

    def last(self, index: int) -> float | None:
        """The last published scaled value of signal `index` (None before the first)."""
        return self._bank.last(index)

    def reset(self, index: int | None = None) -> None:
        """Forgets one signal's (or every signal's) last published value."""
        self._bank.reset(index)


def scale_values(
    values: Any, scale: float | None = None, offset: float | None = None
) -> list[float]:
    """``value * scale + offset`` element-wise; the values unchanged when both are None."""
    return _signal.scale_values(values, scale, offset)
