"""Class-1 decode of an 88-byte datagram (header32, a 64-byte assembly of 20 fields: eight
bits, INTs, DINTs, REALs, an INT[4]) with scaling and deadband: ours (`InputPlan`, batch of
1,000 datagrams and single) beside one precompiled `struct.Struct` pure-Python decoder
doing the same work, and a NumPy batch decode (structured dtype over the datagrams back to
back; decode and scaling only, the deadband is sequential and has no vectorised form)
beside ours returning columns (`decode_columns`) from the same buffer. Rate is datagrams
per second; the targets are >= 10x the struct decoder in batch mode and >= 1x NumPy."""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from benches.interleaved import compare
from unskit.cip.frames import build
from unskit.cip.plan import AssemblyField, InputPlan

F = AssemblyField
INSTANCE = 100
FIELDS = [
    *[F(f"bit-{b}", 0, "BOOL", bit=b) for b in range(8)],
    F("int-a", 2, "INT", scale=0.1),
    F("int-b", 4, "INT", scale=0.1, value_offset=-5.0, deadband="absolute", deadband_value=1.0),
    F("int-c", 6, "INT"),
    F("dint-a", 8, "DINT"),
    F("dint-b", 12, "DINT", deadband="absolute", deadband_value=10),
    F("real-a", 16, "REAL", deadband="absolute", deadband_value=0.5),
    F("real-b", 20, "REAL", deadband="percent", deadband_value=2.0),
    F("real-c", 24, "REAL", scale=2.0, deadband="absolute", deadband_value=0.2),
    F("real-d", 28, "REAL", deadband="percent", deadband_value=1.0),
    F("ints", 32, "INT", array_count=4, scale=0.01, deadband="absolute", deadband_value=0.5),
    F("dint-c", 40, "DINT"),
    F("real-e", 44, "REAL", deadband="percent", deadband_value=5.0),
]
assert len(FIELDS) == 20
BATCH = 1_000
ASSEMBLY = struct.Struct("<BxhhhiiffffhhhhIf16x")
assert ASSEMBLY.size == 64

rng = np.random.default_rng(11)


def make_frames(n: int) -> list[bytes]:
    frames = []
    walk = np.cumsum(rng.normal(0, 0.3, (n, 6)), axis=0) + 50
    for i in range(n):
        bits = int(rng.integers(0, 256)) if i % 10 == 0 else 0b1010_0101
        ints = [int(x) for x in rng.integers(100, 110, 3)]
        data = ASSEMBLY.pack(
            bits,
            *ints,
            1000 + i // 50,
            int(walk[i, 0] * 100),
            *[float(x) for x in walk[i, 1:5]],
            *[int(x) for x in rng.integers(1000, 1100, 4)],
            i // 100,
            float(walk[i, 5]),
        )
        frames.append(build(0x1234, i, i & 0xFFFF, "header32", data=data))
    return frames


FRAMES = make_frames(BATCH)
assert all(len(f) == 88 for f in FRAMES)
# The datagrams back to back, as a batch receive (recvmmsg into one buffer) leaves them.
BLOB = b"".join(FRAMES)

# ---------------------------------------------------------------------------------------
# The anchor: one struct.Struct, the same fields, scaling and gate in plain Python.

WIRE = struct.Struct("<HHHIIHHHI" + ASSEMBLY.format[1:])
IDS = InputPlan(INSTANCE, 64, FIELDS).ids


def _passes(kind: str, thr: float, last: float, v: float) -> bool:
    if kind == "none" or not math.isfinite(v) or not math.isfinite(last):
        return v != last and not (math.isnan(v) and math.isnan(last))
    if kind == "percent":
        if last == 0.0:
            return v != last
        thr = abs(last) * thr / 100.0
    return abs(v - last) >= thr and v != last


class StructDecoder:
    def __init__(self) -> None:
        self.last: list[Any] = [None] * len(FIELDS)
        # Per scalar field after the bits: (slot in the unpacked tuple, scale, offset).
        self.scalars = []
        slot = 10  # header fields 0-8, bits byte at 9
        for i, f in enumerate(FIELDS[8:], start=8):
            if f.array_count:
                self.array_at = (i, slot)
                slot += f.array_count
                continue
            self.scalars.append((i, slot, f.scale, f.value_offset, f.deadband, f.deadband_value))
            slot += 1

    def decode(self, frame: bytes) -> list[tuple[str, Any]]:
        if len(frame) != 88:
            return []
        t = WIRE.unpack(frame)
        if t[0] != 2 or t[1] != 0x8002 or t[2] != 8 or t[5] != 0xB1 or t[6] != 70:
            return []
        out = []
        last = self.last
        bits = t[9]
        for b in range(8):
            v = bool(bits >> b & 1)
            if last[b] is None or last[b] != v:
                last[b] = v
                out.append((IDS[b], v))
        for i, slot, scale, offset, kind, thr in self.scalars:
            raw = t[slot]
            v = raw if scale is None and offset is None else (
                raw * (1.0 if scale is None else scale) + (0.0 if offset is None else offset)
            )  # fmt: skip
            prev = last[i]
            if prev is None or _passes(kind, thr, prev, v):
                last[i] = v
                out.append((IDS[i], v))
        i, slot = self.array_at
        f = FIELDS[i]
        values = [x * f.scale + 0.0 for x in t[slot : slot + 4]]  # type: ignore[operator]
        prev = last[i]
        if prev is None or any(
            _passes(f.deadband, f.deadband_value, p, v) for p, v in zip(prev, values, strict=True)
        ):
            last[i] = values
            out.append((IDS[i], values))
        return out


def anchor_single() -> Callable[[], Any]:
    decoder = StructDecoder()
    frames = itertools.cycle(FRAMES)
    return lambda: decoder.decode(next(frames))


def anchor_batch() -> Callable[[], Any]:
    decoder = StructDecoder()
    return lambda: [decoder.decode(f) for f in FRAMES]


def numpy_batch() -> Callable[[], Any]:
    dtype = np.dtype(
        [("head", "V24"), ("bits", "u1"), ("pad", "u1"), ("i", "<i2", 3), ("d", "<i4", 2),
         ("r", "<f4", 4), ("arr", "<i2", 4), ("dc", "<i4"), ("re", "<f4"), ("tail", "V16")]
    )  # fmt: skip
    assert dtype.itemsize == 88
    blob = BLOB
    scale_i = np.array([0.1, 0.1, 1.0])
    offset_i = np.array([0.0, -5.0, 0.0])

    def run() -> Any:
        rec = np.frombuffer(blob, dtype=dtype)
        bits = np.unpackbits(rec["bits"][:, None], axis=1, bitorder="little").astype(bool)
        ints = rec["i"] * scale_i + offset_i
        reals = rec["r"].astype(np.float64) * np.array([1.0, 1.0, 2.0, 1.0])
        arr = rec["arr"] * 0.01
        return bits, ints, rec["d"], reals, arr, rec["dc"], rec["re"].astype(np.float64)

    return run


def ours_batch() -> Callable[[], Any]:
    plan = InputPlan(INSTANCE, 64, FIELDS, real_time_format="header32")
    return lambda: plan.decode_batch(FRAMES, 0)


def ours_columns() -> Callable[[], Any]:
    plan = InputPlan(INSTANCE, 64, FIELDS, real_time_format="header32")
    return lambda: plan.decode_columns(BLOB, 0)


def ours_single() -> Callable[[], Any]:
    plan = InputPlan(INSTANCE, 64, FIELDS, real_time_format="header32")
    frames = itertools.cycle(FRAMES)
    return lambda: plan.decode(next(frames), 0)


ROWS: dict[str, tuple[Callable[[], Callable[[], Any]], int]] = {
    "ours_batch": (ours_batch, BATCH),
    "ours_columns": (ours_columns, BATCH),
    "ours_single": (ours_single, 1),
    "struct_single": (anchor_single, 1),
    "struct_batch": (anchor_batch, BATCH),
    "numpy_batch": (numpy_batch, BATCH),
}


def test_ours_publishes_what_the_struct_decoder_does() -> None:
    plan = InputPlan(INSTANCE, 64, FIELDS, real_time_format="header32")
    decoder = StructDecoder()
    published = 0
    for frame in FRAMES:
        ours = [(i, v) for i, v in plan.decode(frame, 0).updates]
        theirs = decoder.decode(frame)
        # The struct decoder publishes the array after the scalars; ours in field order.
        assert sorted(ours, key=lambda u: IDS.index(u[0])) == sorted(
            theirs, key=lambda u: IDS.index(u[0])
        )
        published += len(ours)
    assert BATCH < published < BATCH * 20 / 2, "the workload should gate out most fields"


def test_columns_hold_what_the_numpy_decode_computes() -> None:
    bits, ints, dints, reals, arr, dc, re = numpy_batch()()
    cols = InputPlan(INSTANCE, 64, FIELDS, real_time_format="header32").decode_columns(BLOB, 0)
    assert not cols.status.any()
    assert (cols.values[:, :8] == bits).all()
    assert (cols.values[:, 8:11] == ints).all()
    assert (cols.values[:, 11:13] == dints).all()
    assert (cols.values[:, 13:17] == reals).all()
    assert (cols.values[:, 17:21] == arr).all()
    assert (cols.values[:, 21] == dc).all()
    assert (cols.values[:, 22] == re).all()


@pytest.mark.parametrize("impl", list(ROWS))
def test_cip_decode(benchmark, impl: str) -> None:
    make, datagrams = ROWS[impl]
    benchmark.group = "cip class-1 decode, 88-byte datagram, 20 fields"
    benchmark.extra_info["datagrams_per_call"] = datagrams
    benchmark(make())


#: Gated rows: ours, its anchor, calls per round (a single decode takes ~0.5 us, too short
#: to time alone), a round of both sides' rough length in seconds, the target.
PAIRS: dict[str, tuple[str, str, int, float, float | None]] = {
    "cip.decode.batch_vs_struct": ("ours_batch", "struct_batch", 1, 5.3e-3, 10.0),
    "cip.decode.single_vs_struct": ("ours_single", "struct_single", 200, 1.3e-3, None),
    "cip.decode.columns_vs_numpy": ("ours_columns", "numpy_batch", 1, 3.5e-4, 1.0),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_cip_decode_ratio(benchmark, ratio, name: str) -> None:
    """Ours and its anchor in interleaved rounds (benches/interleaved.py): the gate's rows."""
    ours, anchor, calls, seconds_each, target = PAIRS[name]
    datagrams = ROWS[ours][1]
    benchmark.group = f"{name} (interleaved best rounds)"
    ops = compare(benchmark, ROWS[ours][0](), ROWS[anchor][0](), seconds_each, calls)
    row = ratio(
        name, ops[0] * datagrams, anchor, ops[1] * datagrams, unit="datagrams/s", target=target
    )
    print(f"\n{row['name']}: {row['ratio']}x")
