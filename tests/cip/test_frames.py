"""Class-1 datagrams through the bindings: layout, every drop reason, and parity with the
`struct` twin in `unskit._reference.cip` on random frames."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unskit._reference import cip as ref
from unskit.cip.frames import REASONS, build, parse
from unskit.errors import CipError


def test_header32_layout_and_round_trip():
    data = bytes(range(64))
    wire = build(0x11223344, 7, 0xBEEF, "header32", run=True, data=data)
    assert len(wire) == 88
    assert struct.unpack_from("<HHHIIHHHI", wire) == (
        2, 0x8002, 8, 0x11223344, 7, 0x00B1, 70, 0xBEEF, 1
    )  # fmt: skip
    result = parse(wire, "header32", 64)
    assert (result.status, result.consumed, result.reason) == ("complete", 88, None)
    d = result.datagram
    assert d is not None
    assert (d.connection_id, d.sequence_number, d.cip_sequence) == (0x11223344, 7, 0xBEEF)
    assert (d.run_idle, d.run, d.data) == (1, True, data)
    idle = parse(build(1, 1, 1, "header32", run=False, data=data), "header32", 64).datagram
    assert idle is not None
    assert idle.run is False


def test_modeless_heartbeat_and_buffers():
    wire = build(1, 2, 3, "modeless", data=b"\x01\x02")
    d = parse(bytearray(wire), "modeless", 2).datagram
    assert d is not None
    assert (d.data, d.run_idle, d.run) == (b"\x01\x02", None, True)
    heartbeat = build(1, 2, 3, "heartbeat")
    assert len(heartbeat) == 20
    assert parse(memoryview(heartbeat), "heartbeat", 0).status == "complete"
    with pytest.raises(CipError, match="heartbeat datagram carries no data"):
        build(1, 2, 3, "heartbeat", data=b"x")
    with pytest.raises(CipError, match="realTimeFormat"):
        build(1, 2, 3, "header16")  # type: ignore[arg-type]


def test_incomplete_without_a_size_and_every_reason_with_one():
    good = build(1, 2, 3, "header32", data=b"\x00" * 4)
    assert (parse(good[:3], "header32").status, parse(good[:3], "header32").needed) == (
        "incomplete",
        6,
    )
    assert parse(good + b"\x00", "header32").consumed == len(good)

    def patched(at: int, value: int) -> bytes:
        return good[:at] + bytes([value]) + good[at + 1 :]

    cases = {
        "truncated": good[:-1],
        "item_count": patched(0, 3),
        "address_item": patched(2, 0),
        "address_length": patched(4, 4),
        "data_item": patched(14, 0xB2),
        "data_length": patched(16, 5),
        "trailing_bytes": good + b"\x00",
        "wrong_size": build(1, 2, 3, "header32", data=b"\x00" * 5),
    }
    assert sorted(cases) == sorted(REASONS)
    for reason, wire in cases.items():
        result = parse(wire, "header32", 4)
        assert (result.status, result.reason, result.datagram) == ("malformed", reason, None)


def test_not_a_buffer_is_a_cip_error():
    with pytest.raises(CipError, match="bytes, bytearray"):
        parse("text", "modeless", 1)  # type: ignore[arg-type]


formats = st.sampled_from(["modeless", "header32"])


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=40), fmt=formats, size=st.integers(0, 40), cut=st.integers(0, 80))
def test_random_frames_agree_with_the_reference(data, fmt, size, cut):
    wire = build(5, 6, 7, fmt, data=data)
    for candidate in (wire, wire[:cut], wire + data[:1]):
        ours = parse(candidate, fmt, size)
        reason, fields = ref.parse_datagram(candidate, fmt, size)
        assert ours.reason == reason
        if reason is None:
            d = ours.datagram
            assert d is not None
            assert (d.cip_sequence, d.run_idle, d.run, d.data) == (
                fields["cip_sequence"],
                fields["run_idle"],
                fields["run"],
                fields["data"],
            )


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(max_size=64), fmt=formats, size=st.integers(0, 50))
def test_random_bytes_never_crash_and_agree(junk, fmt, size):
    assert parse(junk, fmt, size).reason == ref.parse_datagram(junk, fmt, size)[0]


@given(
    conn=st.integers(0, 2**32 - 1),
    cip=st.integers(0, 2**16 - 1),
    run=st.booleans(),
    data=st.binary(max_size=32),
    fmt=formats,
)
def test_build_agrees_with_the_reference(conn, cip, run, data, fmt):
    assert build(conn, 9, cip, fmt, run=run, data=data) == ref.build(conn, 9, cip, fmt, run, data)
