"""Twin of `rust/unskit-core/src/cip`: class-1 datagrams and assembly plans, in plain
Python with `struct`."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from unskit._reference.signal import passes
from unskit.elementary_types import STRUCT_FORMATS
from unskit.elementary_types import TYPES as ELEMENTARY_TYPES

#: (struct letter, size) by type name, from the one elementary type table; the parity tests
#: check the table itself against `struct` and pycomm3, so the twin stays an oracle.
TYPES = {name: (STRUCT_FORMATS[name], row.size) for name, row in ELEMENTARY_TYPES.items()}


def prefix(fmt: str) -> int:
    return 6 if fmt == "header32" else 2


def parse_datagram(buf: bytes, fmt: str, size: int) -> tuple[str | None, dict[str, Any]]:
    """(reason, {}) when dropped, else (None, fields of the datagram)."""
    if len(buf) < 6:
        return "truncated", {}
    count, kind, length = struct.unpack_from("<HHH", buf, 0)
    if count != 2:
        return "item_count", {}
    if kind != 0x8002:
        return "address_item", {}
    if length != 8:
        return "address_length", {}
    if len(buf) < 18:
        return "truncated", {}
    conn, seq, kind, length = struct.unpack_from("<IIHH", buf, 6)
    if kind != 0x00B1:
        return "data_item", {}
    if length < prefix(fmt):
        return "data_length", {}
    if len(buf) < 18 + length:
        return "truncated", {}
    if len(buf) > 18 + length:
        return "trailing_bytes", {}
    if length - prefix(fmt) != size:
        return "wrong_size", {}
    (cip_seq,) = struct.unpack_from("<H", buf, 18)
    run_idle = struct.unpack_from("<I", buf, 20)[0] if fmt == "header32" else None
    return None, {
        "connection_id": conn,
        "sequence_number": seq,
        "cip_sequence": cip_seq,
        "run_idle": run_idle,
        "run": run_idle is None or bool(run_idle & 1),
        "data": bytes(buf[18 + prefix(fmt) :]),
    }


def build(conn: int, seq: int, cip_seq: int, fmt: str, run: bool, data: bytes) -> bytes:
    head = struct.pack(
        "<HHHIIHHH", 2, 0x8002, 8, conn, seq, 0x00B1, prefix(fmt) + len(data), cip_seq
    )
    if fmt == "header32":
        head += struct.pack("<I", 1 if run else 0)
    return head + data


@dataclass
class RefField:
    name: str
    offset: int
    type: str
    bit: int | None = None
    array_count: int | None = None
    scale: float | None = None
    value_offset: float | None = None
    deadband: str = "none"
    deadband_value: float = 0.0
    always: bool = False
    last: list[float] = field(default_factory=list)
    published_ms: int | None = None

    @property
    def count(self) -> int:
        return self.array_count or 1

    def raw(self, data: bytes, k: int) -> float:
        if self.type == "BOOL":
            if self.bit is not None:
                return float(data[self.offset] >> self.bit & 1)
            if self.array_count is not None:
                return float(data[self.offset + k // 8] >> (k % 8) & 1)
            return 1.0 if data[self.offset] else 0.0
        code, size = TYPES[self.type]
        return float(struct.unpack_from("<" + code, data, self.offset + k * size)[0])

    def scaled(self, raw: float) -> float:
        if self.scale is None and self.value_offset is None:
            return raw
        s = 1.0 if self.scale is None else self.scale
        o = 0.0 if self.value_offset is None else self.value_offset
        return raw * s + o


class RefInputPlan:
    def __init__(self, fmt: str, size: int, sample_ms: int, fields: list[RefField]) -> None:
        self.fmt, self.size, self.sample_ms, self.fields = fmt, size, sample_ms, fields

    def decode(self, buf: bytes, now_ms: int) -> tuple[str | None, list[tuple[int, list[float]]]]:
        reason, dg = parse_datagram(buf, self.fmt, self.size)
        if reason is not None:
            return reason, []
        data = dg["data"]
        out = []
        for i, f in enumerate(self.fields):
            if f.published_ms is not None and max(now_ms - f.published_ms, 0) < self.sample_ms:
                continue
            values = [f.scaled(f.raw(data, k)) for k in range(f.count)]
            ok = (
                f.published_ms is None
                or f.always
                or any(
                    passes(f.deadband, f.deadband_value, last, v)
                    for last, v in zip(f.last, values, strict=True)
                )
            )
            if ok:
                f.last = values
                f.published_ms = now_ms
                out.append((i, values))
        return None, out
