"""`Message.signal_columns()` (the codec's columnar view of a signal update, the recorder's
fast path) agrees with `Message.body` (the projection every other consumer reads) on
generated updates, sample by sample."""

from __future__ import annotations

import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from unskit import Message, MessageBuilder

text = st.text(max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | text
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)
samples = st.lists(
    st.fixed_dictionaries(
        {"value": values},
        optional={
            "quality": st.sampled_from(["GOOD", "UNCERTAIN", "BAD"]),
            "source_timestamp_ms": st.integers(min_value=0, max_value=2**50),
            "server_timestamp_ms": st.integers(min_value=0, max_value=2**50),
            "status": st.text(max_size=8),
        },
    ),
    max_size=20,
)
KINDS = {0: type(None), 1: float, 2: int, 3: bool, 4: str}
QUALITIES = {1: "GOOD", 2: "UNCERTAIN", 3: "BAD"}


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(samples, st.text(min_size=1, max_size=8), st.none() | st.text(min_size=1, max_size=8))
def test_the_columns_agree_with_the_projected_body(given_samples, signal_id, name):
    message = Message.from_bytes(
        MessageBuilder("SouthboundSignalUpdate", "1.0")
        .signal_update(signal_id, given_samples, name=name)
        .build()
        .to_bytes()
    )
    body = message.body
    columns = message.signal_columns()
    assert columns is not None
    (ident, label, n, source, server, quality, kinds, doubles, ints, bools) = columns[:10]
    strings, others, statuses = (dict(pairs) for pairs in columns[10:])
    expected = body["samples"]
    assert (ident, label, n) == (body["signal"]["id"], body["signal"].get("name"), len(expected))
    source = struct.unpack(f"={n}q", source)
    server = struct.unpack(f"={n}q", server)
    quality = struct.unpack(f"={n}i", quality)
    doubles = struct.unpack(f"={n}d", doubles)
    ints = struct.unpack(f"={n}q", ints)
    for k, sample in enumerate(expected):
        assert source[k] == sample["source_timestamp_ms"]
        assert server[k] == sample["server_timestamp_ms"]
        assert QUALITIES[quality[k]] == sample["quality"]
        assert statuses.get(k) == sample.get("status")
        value, kind = sample["value"], kinds[k]
        if kind == 5:
            assert same(others[k], value)
            # A list or map, or an integer above the int64 column's range (a uint_value).
            assert isinstance(value, (list, dict)) or (type(value) is int and value >= 2**63)
            continue
        assert type(value) is KINDS[kind]
        column = {0: None, 1: doubles[k], 2: ints[k], 3: bool(bools[k]), 4: strings.get(k)}
        assert same(column[kind], value)


def test_other_bodies_have_no_columns():
    message = MessageBuilder("Reading", "1.0").body({"samples": [1]}).build()
    assert message.signal_columns() is None
    assert MessageBuilder("Empty", "1.0").build().signal_columns() is None
