"""Scaling + deadband over 1,000,000 samples of 1,000 signals in irregular arrival order
(half absolute, half percent deadbands): ours (`SignalBank.offer_batch`, NumPy arrays in,
mask and scaled values out) beside the same gate as a numba ``@njit`` loop, NumPy (scaling
vectorised, the gate a Python loop: it is sequential per signal, NumPy has no form of it)
and plain Python. Throughput is samples per second; the target is >= 1.1x numba."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from unskit.signal import GateSpec, SignalBank

SIGNALS = 1_000
SAMPLES = 1_000_000
# Plain Python and the NumPy row run a tenth of the samples (the rate is what counts).
SLOW_SAMPLES = 100_000

rng = np.random.default_rng(2026)
INDICES = rng.integers(0, SIGNALS, SAMPLES).astype(np.int32)
# A random walk per signal seen through noise, so some samples pass and most do not.
VALUES = (rng.normal(100.0, 2.0, SAMPLES)).astype(np.float64)
SCALE = rng.uniform(0.5, 2.0, SIGNALS)
OFFSET = rng.uniform(-10, 10, SIGNALS)
KIND = np.arange(SIGNALS) % 2  # 0 absolute, 1 percent
THRESHOLD = np.where(KIND == 0, 1.5, 1.0)
SPECS = [
    GateSpec(
        float(SCALE[i]),
        float(OFFSET[i]),
        "absolute" if KIND[i] == 0 else "percent",
        float(THRESHOLD[i]),
    )
    for i in range(SIGNALS)
]


def ours() -> Callable[[], Any]:
    # One bank for every round, as an adapter keeps it; the anchors keep their state too.
    bank = SignalBank(SPECS)

    def run() -> Any:
        return bank.offer_batch(INDICES, VALUES)

    return run


def _gate(kind: int, thr: float, last: float, v: float) -> bool:
    if not math.isfinite(v) or not math.isfinite(last):
        return v != last and not (math.isnan(v) and math.isnan(last))
    if kind == 1:
        if last == 0.0:
            return v != last
        thr = abs(last) * thr / 100.0
    return abs(v - last) >= thr and v != last


def python_row() -> Callable[[], Any]:
    idx = INDICES[:SLOW_SAMPLES].tolist()
    raw = VALUES[:SLOW_SAMPLES].tolist()
    scale, offset, kind, thr = SCALE.tolist(), OFFSET.tolist(), KIND.tolist(), THRESHOLD.tolist()

    last: list[float | None] = [None] * SIGNALS

    def run() -> Any:
        mask = [False] * len(idx)
        out = [0.0] * len(idx)
        for k, (i, r) in enumerate(zip(idx, raw, strict=True)):
            v = r * scale[i] + offset[i]
            prev = last[i]
            if prev is None or _gate(kind[i], thr[i], prev, v):
                last[i] = v
                mask[k] = True
            out[k] = v
        return mask, out

    return run


def numpy_row() -> Callable[[], Any]:
    idx = INDICES[:SLOW_SAMPLES]
    raw = VALUES[:SLOW_SAMPLES]
    kind, thr = KIND.tolist(), THRESHOLD.tolist()
    last: list[float | None] = [None] * SIGNALS

    def run() -> Any:
        scaled = raw * SCALE[idx] + OFFSET[idx]
        mask = np.zeros(len(idx), dtype=bool)
        for k, (i, v) in enumerate(zip(idx.tolist(), scaled.tolist(), strict=True)):
            prev = last[i]
            if prev is None or _gate(kind[i], thr[i], prev, v):
                last[i] = v
                mask[k] = True
        return mask, scaled

    return run


def numba_row() -> Callable[[], Any]:
    from numba import njit

    @njit(cache=False)  # type: ignore[misc]
    def kernel(idx, raw, scale, offset, kind, thr, has, last):  # type: ignore[no-untyped-def]
        mask = np.zeros(idx.shape[0], dtype=np.bool_)
        out = np.empty(idx.shape[0])
        for k in range(idx.shape[0]):
            i = idx[k]
            v = raw[k] * scale[i] + offset[i]
            out[k] = v
            ok = not has[i]
            if not ok:
                p = last[i]
                if not np.isfinite(v) or not np.isfinite(p):
                    ok = v != p and not (np.isnan(v) and np.isnan(p))
                else:
                    t = thr[i]
                    if kind[i] == 1:
                        t = abs(p) * t / 100.0
                        ok = (v != p) if p == 0.0 else (abs(v - p) >= t and v != p)
                    else:
                        ok = abs(v - p) >= t and v != p
            if ok:
                has[i] = True
                last[i] = v
                mask[k] = True
        return mask, out

    has = np.zeros(SIGNALS, dtype=np.bool_)
    last = np.zeros(SIGNALS)
    kernel(INDICES[:10], VALUES[:10], SCALE, OFFSET, KIND, THRESHOLD, has.copy(), last)  # compile

    def run() -> Any:
        return kernel(INDICES, VALUES, SCALE, OFFSET, KIND, THRESHOLD, has, last)

    return run


ROWS: dict[str, tuple[Callable[[], Callable[[], Any]], int]] = {
    "ours": (ours, SAMPLES),
    "numba": (numba_row, SAMPLES),
    "numpy": (numpy_row, SLOW_SAMPLES),
    "python": (python_row, SLOW_SAMPLES),
}

_measured: dict[str, float] = {}


def test_rows_agree() -> None:
    """The anchors compute what ours does (on the prefix they all run)."""
    batch = SignalBank(SPECS).offer_batch(INDICES[:SLOW_SAMPLES], VALUES[:SLOW_SAMPLES])
    mask = np.frombuffer(batch.mask.obj, dtype=np.uint8).astype(bool)
    values = np.frombuffer(batch.values.obj)
    py_mask, py_values = python_row()()
    assert mask.tolist() == py_mask
    assert values.tolist() == py_values
    nb_mask, nb_values = numba_row()()
    assert (mask == nb_mask[:SLOW_SAMPLES]).all()
    assert (values == nb_values[:SLOW_SAMPLES]).all()
    assert 0.01 < mask.mean() < 0.9, "the workload should publish some samples, not all"


@pytest.mark.parametrize("impl", list(ROWS))
def test_signal_gate(benchmark, ratio, impl: str) -> None:
    make, samples = ROWS[impl]
    benchmark.group = "signal scale+deadband 1M samples / 1k signals"
    benchmark.extra_info["samples_per_call"] = samples
    benchmark(make())
    _measured[impl] = benchmark.stats.stats.ops * samples
    if impl != "ours" and "ours" in _measured:
        row = ratio(
            f"signal.gate.vs_{impl}",
            _measured["ours"],
            impl,
            _measured[impl],
            unit="samples/s",
            target=1.1 if impl == "numba" else None,
        )
        print(f"\n{row['name']}: ours/{impl} = {row['ratio']}x")
