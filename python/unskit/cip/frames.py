"""Class-1 UDP datagrams in the Common Packet Format: parse T-to-O, build O-to-T.

`parse` never raises on bad bytes: a datagram is "complete", "incomplete" (needs more
bytes) or "malformed" with a `reason` from `REASONS` that the caller counts; with `size`
given, a whole datagram of any other assembly size is malformed with reason "wrong_size".
"""

from __future__ import annotations

from typing import Any, Literal

from unskit._core import cip as _cip

__all__ = ["REASONS", "Datagram", "ParseResult", "RealTimeFormat", "build", "parse"]

#: Every reason a datagram is dropped, in the order `InputPlan.decode_batch` codes them
#: (status 1 + index).
REASONS: tuple[str, ...] = tuple(_cip.REASONS)

Datagram = _cip.Datagram
ParseResult = _cip.ParseResult
RealTimeFormat = Literal["modeless", "header32", "heartbeat"]


def parse(data: Any, real_time_format: RealTimeFormat, size: int | None = None) -> ParseResult:
    """Parses `data` (bytes are read in place; other buffers copied first)."""
    return _cip.parse(data, real_time_format, size)


def build(
    connection_id: int,
    sequence_number: int,
    cip_sequence: int,
    real_time_format: RealTimeFormat,
    *,
    run: bool = True,
    data: bytes = b"",
) -> bytes:
    """One O-to-T datagram: header32 carries the run bit in its run/idle header, modeless
    has no header, a heartbeat carries no data (CipError when given some)."""
    return _cip.build_datagram(
        connection_id, sequence_number, cip_sequence, real_time_format, run, data
    )
