"""Assembly plans through the bindings: ids, decoding, sampleMs and deadband, batches,
refused plans, output encoding, and parity with the `struct` twin on random fields."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unskit._reference import cip as ref
from unskit.cip.frames import REASONS, build
from unskit.cip.plan import AssemblyField, InputPlan, OutputPlan
from unskit.errors import CipError, UnskitError

F = AssemblyField


def frame(data: bytes, fmt: str = "header32", seq: int = 1) -> bytes:
    return build(1, seq, seq, fmt, data=data)  # type: ignore[arg-type]


def sample_plan(**kw) -> InputPlan:
    fields = [
        F("run", 0, "BOOL", bit=3),
        F("temps", 2, "INT", array_count=2, scale=0.5, value_offset=1.0),
        F("level", 6, "REAL", deadband="absolute", deadband_value=1.0),
        F("count", 10, "dint"),
        F("big", 16, "ULINT"),
    ]
    return InputPlan(100, 24, fields, real_time_format="header32", **kw)


def sample_data(level: float = 1.5, temp: int = 10, count: int = -7) -> bytes:
    data = bytearray(24)
    data[0] = 0b1000
    struct.pack_into("<hhfi", data, 2, -4, temp, level, count)
    struct.pack_into("<Q", data, 16, 2**64 - 1)
    return bytes(data)


def test_ids_and_typed_values():
    plan = sample_plan()
    assert plan.ids == [
        "a100/0/BOOL.3",
        "a100/2/INT",
        "a100/6/REAL",
        "a100/10/DINT",
        "a100/16/ULINT",
    ]
    out = plan.decode(frame(sample_data()), 0)
    assert (out.reason, out.cip_sequence, out.run) == (None, 1, True)
    assert out.updates == [
        ("a100/0/BOOL.3", True),
        ("a100/2/INT", [-1.0, 6.0]),
        ("a100/6/REAL", 1.5),
        ("a100/10/DINT", -7),
        ("a100/16/ULINT", 2**64 - 1),  # exact, above 2**53
    ]
    assert isinstance(out.updates[0][1], bool)
    assert isinstance(out.updates[3][1], int)


def test_only_fields_due_publish():
    plan = sample_plan()
    plan.decode(frame(sample_data()), 0)
    assert plan.decode(frame(sample_data()), 1).updates == []
    # Inside the REAL's deadband; an array element and the DINT change.
    out = plan.decode(frame(sample_data(level=2.4, temp=12, count=0)), 2)
    assert [i for i, _ in out.updates] == ["a100/2/INT", "a100/10/DINT"]
    out = plan.decode(frame(sample_data(level=2.5, temp=12, count=0)), 3)
    assert out.updates == [("a100/6/REAL", 2.5)]
    plan.reset()
    assert len(plan.decode(frame(sample_data(level=2.5, temp=12, count=0)), 4).updates) == 5


def test_sample_ms_then_deadband_and_always():
    fields = [F("a", 0, "DINT"), F("b", 4, "DINT", publish_mode="always")]
    plan = InputPlan(1, 8, fields, sample_ms=100)

    def at(value: int, now: int) -> list[str]:
        return [
            i
            for i, _ in plan.decode(
                frame(struct.pack("<ii", value, value), "modeless"), now
            ).updates
        ]

    assert at(1, 1000) == ["a1/0/DINT", "a1/4/DINT"]
    assert at(2, 1099) == []
    assert at(1, 1100) == ["a1/4/DINT"]  # a did not change since it published
    assert at(3, 1150) == ["a1/0/DINT"]


def test_dropped_datagrams_carry_their_reason():
    plan = sample_plan()
    assert plan.decode(frame(b"\x00" * 23), 0).reason == "wrong_size"
    assert plan.decode(b"\x02\x00", 0).reason == "truncated"
    assert plan.decode(frame(sample_data(), "modeless"), 0).reason == "wrong_size"


def test_batch_is_columnar_and_equals_single_decodes():
    frames = [frame(sample_data(level=float(i % 5), temp=i // 3)) for i in range(200)]
    frames[7] = frames[7][:-1]
    single = sample_plan()
    want = []
    for d, f in enumerate(frames):
        for sid, value in single.decode(f, d).updates:
            values = value if isinstance(value, list) else [value]
            want.append((d, sid, [float(v) for v in values]))
    batch = sample_plan().decode_batch(frames, list(range(200)))
    assert list(batch.rows()) == want
    assert batch.status[7] == 1 + REASONS.index("truncated")
    assert sum(1 for s in batch.status if s) == 1
    one_time = sample_plan().decode_batch(frames, 0)
    assert list(one_time.rows()) == list(sample_plan().decode_batch(frames, [0] * 200).rows())
    with pytest.raises(CipError, match="2 times for 200 datagrams"):
        sample_plan().decode_batch(frames, [0, 1])


def test_columns_publish_what_the_batch_rows_do_and_hold_every_value():
    frames = [frame(sample_data(level=float(i % 5), temp=i // 3)) for i in range(200)]
    frames[7] = frames[7][:-1]
    rows = list(sample_plan().decode_batch(frames, list(range(200))).rows())
    cols = sample_plan().decode_columns(frames, list(range(200)))
    assert list(cols.rows()) == rows
    assert cols.values.shape == (200, 6)
    assert cols.published.shape == (200, 5)
    assert cols.status[7] == 1 + REASONS.index("truncated")
    assert np.isnan(cols.values[7]).all()
    assert not cols.published[7].any()
    # Every datagram's values are there, published or not.
    assert cols.column("a100/6/REAL")[:6, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]
    assert cols.column(1)[3].tolist() == [-1.0, 1.0 + 0.5 * 1]
    assert cols.column("a100/16/ULINT")[0, 0] == float(2**64 - 1)
    assert cols.values.dtype == np.float64
    assert not cols.values.flags.writeable


def test_columns_take_one_buffer_of_whole_datagrams():
    frames = [frame(sample_data(level=float(i % 7))) for i in range(100)]
    blob = b"".join(frames)
    from_list = sample_plan().decode_columns(frames, 5)
    for buffer in (blob, bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
        got = sample_plan().decode_columns(buffer, 5)
        assert (got.status == from_list.status).all()
        assert (got.published == from_list.published).all()
        assert got.values.tobytes() == from_list.values.tobytes()
    empty = sample_plan().decode_columns(b"", 0)
    assert empty.values.shape == (0, 6)
    assert list(empty.rows()) == []


@pytest.mark.parametrize(
    ("datagrams", "now_ms", "match"),
    [
        (b"\0" * 50, 0, "50 bytes are not whole datagrams of 48 bytes"),
        ([b"x"] * 3, [1, 2], "2 times for 3 datagrams"),
        ([b"x"], "soon", "now_ms must be an int"),
        (12, 0, "bytes-like buffer or a sequence"),
        (["text"], 0, "a datagram must be bytes"),
    ],
)
def test_columns_refuse_bad_input_with_a_clear_error(datagrams, now_ms, match):
    plan = sample_plan()
    with pytest.raises(CipError, match=match):
        plan.decode_columns(datagrams, now_ms)
    # Nothing moved: the first real datagram still publishes every field.
    assert len(plan.decode(frame(sample_data()), 0).updates) == 5


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ([F("x", 6, "DINT")], '"x": bytes 6..10 do not fit inside sizeBytes 8'),
        ([F("arr", 0, "INT", array_count=5)], '"arr"'),
        ([F("b", 0, "INT", bit=1)], '"b": bit is for BOOL fields only'),
        ([F("b", 0, "BOOL", bit=8)], "bit must be 0 to 7"),
        ([F("s", 0, "BOOL", scale=2.0)], "numeric types only"),
        ([F("d", 0, "BOOL", deadband="absolute", deadband_value=1)], "numeric types only"),
        ([F("t", 0, "STRING")], '"t": .*type "STRING"'),
        ([F("a", 0, "INT"), F("b", 0, "INT")], "same signal id a1/0/INT"),
        ([F("a", 0, "INT"), F("a", 2, "INT")], "same name"),
        ([F("n", 0, "INT", deadband="percent", deadband_value=-1)], '"n".*deadband value'),
    ],
)
def test_plans_that_cannot_work_are_refused_naming_the_field(fields, match):
    with pytest.raises(CipError, match=match) as info:
        InputPlan(1, 8, fields)
    assert isinstance(info.value, UnskitError)


def test_overlapping_fields_are_allowed():
    plan = InputPlan(1, 4, [F("word", 0, "DINT"), F("bit0", 0, "BOOL", bit=0)])
    out = plan.decode(frame(b"\x01\x00\x00\x00", "modeless"), 0)
    assert out.updates == [("a1/0/DINT", 1), ("a1/0/BOOL.0", True)]


def test_from_config():
    doc = {
        "sizeBytes": 4,
        "realTimeFormat": "header32",
        "sampleMs": 0,
        "signals": [
            {"name": "speed", "offset": 0, "type": "INT", "scale": 0.1,
             "deadband": {"type": "percent", "value": 5}},
            {"name": "go", "offset": 2, "type": "BOOL", "bit": 0},
        ],
    }  # fmt: skip
    plan = InputPlan.from_config(101, doc)
    assert plan.ids == ["a101/0/INT", "a101/2/BOOL.0"]
    assert plan.decode(frame(b"\x64\x00\x01\x00"), 0).updates[0] == ("a101/0/INT", 10.0)


def test_output_encode():
    fields = [
        F("speed", 0, "INT", scale=0.1),
        F("go", 2, "BOOL", bit=1),
        F("big", 4, "ULINT"),
        F("set", 12, "REAL", array_count=2),
    ]
    plan = OutputPlan(150, 20, fields)
    asm = plan.encode({"speed": 12.34, "a150/2/BOOL.1": True, "big": 2**64 - 1, "set": [1.5, 2]})
    assert struct.unpack("<hBxQff", asm) == (123, 0b10, 2**64 - 1, 1.5, 2.0)
    again = plan.encode({"go": False}, base=asm)
    assert again[2] == 0
    assert again[:2] == asm[:2]
    assert plan.encode({"speed": 0.25})[:2] == b"\x02\x00"  # half to even
    for values, match in [
        ({"speed": 4000.0}, "outside INT's -32768..32767"),
        ({"speed": math.nan}, "finite"),
        ({"big": -1}, "outside ULINT"),
        ({"go": 1}, "true or false"),
        ({"speed": True}, "takes a number"),
        ({"set": [1e300, 0]}, "outside REAL's range"),
        ({"set": [1.0]}, "takes 2 value"),
        ({"nope": 1}, "no output field"),
        ({"speed": "1"}, "bool or a number"),
    ]:
        with pytest.raises(CipError, match=match):
            plan.encode(values, base=asm)
    with pytest.raises(CipError, match="base must be 20 bytes"):
        plan.encode({}, base=b"\x00")
    heartbeat = OutputPlan(151, 0)
    assert (heartbeat.real_time_format, heartbeat.encode({})) == ("heartbeat", b"")
    with pytest.raises(CipError, match="no signals"):
        OutputPlan(151, 0, [F("x", 0, "INT")])


# ---------------------------------------------------------------------------------------
# Parity with the reference twin on random fields and frames.

TYPES = list(ref.TYPES)


@st.composite
def field_sets(draw):
    size = draw(st.integers(1, 40))
    fields = []
    for n in range(draw(st.integers(1, 6))):
        ty = draw(st.sampled_from(TYPES))
        bit = draw(st.none() | st.integers(0, 7)) if ty == "BOOL" else None
        count = None if bit is not None else draw(st.none() | st.integers(1, 4))
        width = (
            1
            if bit is not None
            else (
                -(-(count or 1) // 8) if ty == "BOOL" and count else (count or 1) * ref.TYPES[ty][1]
            )
        )
        if width > size:
            continue
        offset = draw(st.integers(0, size - width))
        numeric = ty != "BOOL"
        fields.append(
            ref.RefField(
                name=f"f{n}",
                offset=offset,
                type=ty,
                bit=bit,
                array_count=count,
                scale=draw(st.none() | st.floats(-100, 100)) if numeric else None,
                value_offset=draw(st.none() | st.floats(-100, 100)) if numeric else None,
                deadband=draw(st.sampled_from(["none", "absolute", "percent"]))
                if numeric
                else "none",
                deadband_value=draw(st.floats(0, 50)),
                always=draw(st.booleans()),
            )
        )
    ids = set()
    unique = []
    for f in fields:
        key = (f.offset, f.type, f.bit)
        if key not in ids:
            ids.add(key)
            unique.append(f)
    return size, unique


def as_plan_fields(fields: list[Any]) -> list[F]:
    """The reference's fields as the plan's."""
    return [
        F(f.name, f.offset, f.type, f.bit, f.array_count, f.scale, f.value_offset,
          f.deadband, f.deadband_value, "always" if f.always else "onChange")  # type: ignore[arg-type]
        for f in fields
    ]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(spec=field_sets(), fmt=st.sampled_from(["modeless", "header32"]), data=st.data())
def test_random_plans_agree_with_the_reference_bit_for_bit(spec, fmt, data):
    size, fields = spec
    if not fields:
        return
    sample_ms = data.draw(st.integers(0, 5))
    plan_fields = as_plan_fields(fields)
    ours, twin_columns = (
        InputPlan(7, size, plan_fields, real_time_format=fmt, sample_ms=sample_ms) for _ in range(2)
    )
    twin = ref.RefInputPlan(fmt, size, sample_ms, fields)
    now = 0
    frames = []
    for _ in range(data.draw(st.integers(1, 8))):
        payload = data.draw(st.binary(min_size=size, max_size=size) | st.binary(max_size=size + 2))
        frames.append(frame(payload, fmt))
    times = [now + 3 * i for i in range(len(frames))]
    batch = ours.decode_batch(frames, times)
    columns = twin_columns.decode_columns(frames, times)
    got = list(batch.rows())
    packed = [(d, i, [struct.pack("<d", x) for x in v]) for d, i, v in got]
    assert [(d, i, [struct.pack("<d", x) for x in v]) for d, i, v in columns.rows()] == packed
    assert (columns.status == np.frombuffer(batch.status, np.uint8)).all()
    want = []
    for d, (f, t) in enumerate(zip(frames, times, strict=True)):
        reason, updates = twin.decode(f, t)
        assert batch.status[d] == (0 if reason is None else 1 + REASONS.index(reason))
        want += [(d, ours.ids[i], values) for i, values in updates]
    assert [(d, i) for d, i, _ in got] == [(d, i) for d, i, _ in want]
    for (_, _, a), (_, _, b) in zip(got, want, strict=True):
        assert [struct.pack("<d", x) for x in a] == [struct.pack("<d", x) for x in b]


@settings(max_examples=150, deadline=None)
@given(spec=field_sets(), fmt=st.sampled_from(["modeless", "header32"]), data=st.data())
def test_random_plans_decode_one_buffer_as_the_list_of_datagrams(spec, fmt, data):
    # One buffer of whole datagrams takes the strided path (a bit field's byte read once for
    # every bit of it, its flags from the bytes); a list takes the per-datagram one, which
    # the test above holds to the reference. Both, in two batches, must agree bit for bit.
    size, fields = spec
    if not fields:
        return
    sample_ms = data.draw(st.integers(0, 2))
    plan_fields = as_plan_fields(fields)
    from_buffer, from_list, single = (
        InputPlan(7, size, plan_fields, real_time_format=fmt, sample_ms=sample_ms) for _ in range(3)
    )
    # Few distinct bytes too, so that values repeat and the gates both hold and pass.
    payload = st.binary(min_size=size, max_size=size) | st.lists(
        st.sampled_from([0, 1, 3, 0x80, 0xFF]), min_size=size, max_size=size
    ).map(bytes)
    frames = [frame(data.draw(payload), fmt) for _ in range(data.draw(st.integers(0, 30)))]
    times = [2 * i for i in range(len(frames))]
    half = data.draw(st.integers(0, len(frames)))
    for part in (slice(0, half), slice(half, None)):
        got = from_buffer.decode_columns(b"".join(frames[part]), times[part])
        want = from_list.decode_columns(frames[part], times[part])
        assert got.status.tolist() == want.status.tolist()
        assert got.published.tolist() == want.published.tolist()
        assert got.values.tobytes() == want.values.tobytes()
        rows = single.decode_batch(frames[part], times[part]).rows()
        assert _bits(got.rows()) == _bits(rows)


def _bits(rows: Iterator[tuple[int, str, list[float]]]) -> list[tuple[int, str, list[bytes]]]:
    return [(d, i, [struct.pack("<d", x) for x in v]) for d, i, v in rows]
