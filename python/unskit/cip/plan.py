"""Assembly plans, compiled once from an assembly's fields (Rust).

`InputPlan.decode` takes one T-to-O datagram and returns only the fields due for
publication: a field is eligible `sampleMs` after its last publication; then publishMode
``always`` publishes it and ``onChange`` asks its deadband (an array publishes when any
element passes). Signal ids are ``a<instance>/<offset>/<TYPE>`` with ``.<bit>`` for bit
fields. `OutputPlan.encode` writes engineering values into an O-to-T assembly, unscaled
``(v - valueOffset) / scale``, integers rounded half to even and range-checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from unskit._core import cip as _cip
from unskit.cip.frames import RealTimeFormat

__all__ = ["AssemblyField", "Decoded", "InputPlan", "OutputPlan", "PlanBatch", "PlanColumns"]


@dataclass(frozen=True)
class AssemblyField:
    """One field of an assembly's signals[], as the configuration states it."""

    name: str
    offset: int
    type: str
    bit: int | None = None
    array_count: int | None = None
    scale: float | None = None
    value_offset: float | None = None
    deadband: Literal["none", "absolute", "percent"] = "none"
    deadband_value: float = 0.0
    publish_mode: Literal["onChange", "always"] = "onChange"

    @classmethod
    def from_config(
        cls, doc: Mapping[str, Any], publish_mode: Literal["onChange", "always"] = "onChange"
    ) -> AssemblyField:
        """From a signals[] entry (name, offset, type, bit, arrayCount, scale, valueOffset,
        deadband {type, value})."""
        deadband = doc.get("deadband") or {}
        return cls(
            name=doc["name"],
            offset=doc["offset"],
            type=doc["type"],
            bit=doc.get("bit"),
            array_count=doc.get("arrayCount"),
            scale=doc.get("scale"),
            value_offset=doc.get("valueOffset"),
            deadband=deadband.get("type", "none"),
            deadband_value=float(deadband.get("value", 0.0)),
            publish_mode=publish_mode,
        )

    def as_tuple(
        self,
    ) -> tuple[str, int, str, int | None, int | None, float | None, float | None, str, float, bool]:
        return (
            self.name,
            self.offset,
            self.type,
            self.bit,
            self.array_count,
            self.scale,
            self.value_offset,
            self.deadband,
            float(self.deadband_value),
            self.publish_mode == "always",
        )


@dataclass(frozen=True)
class Decoded:
    """One datagram: `reason` when it was dropped, else its CIP sequence count, run/idle
    bit and the (signal id, value) pairs due for publication."""

    reason: str | None
    cip_sequence: int | None
    run: bool | None
    updates: list[tuple[str, Any]]


@dataclass(frozen=True)
class PlanBatch:
    """Columnar outcome of `InputPlan.decode_batch` (zero-copy views).

    ``status[d]`` is 0 for a decoded datagram, else 1 + its reason's index in `REASONS`.
    Row ``r`` says datagram ``row_datagram[r]`` publishes field ``row_field[r]`` with
    ``counts[field]`` values, which follow each other in `values` in row order.
    """

    status: memoryview[int]
    row_datagram: memoryview[int]
    row_field: memoryview[int]
    values: memoryview[float]
    ids: Sequence[str]
    counts: Sequence[int]

    def rows(self) -> Iterator[tuple[int, str, list[float]]]:
        """(datagram index, signal id, values) per published field, in order."""
        at = 0
        for d, f in zip(self.row_datagram, self.row_field, strict=True):
            n = self.counts[f]
            yield d, self.ids[f], list(self.values[at : at + n])
            at += n


@dataclass(slots=True)
class PlanColumns:
    """`InputPlan.decode_columns` as NumPy arrays over the memory Rust filled (no copy, no
    Python object per value; read-only). Each column is contiguous: ``values[:, j]`` and
    ``published[:, f]`` are views of one run of memory each.

    ``status[d]`` is 0 for a decoded datagram, else 1 + its reason's index in `REASONS`.
    ``values[d, starts[f] : starts[f] + counts[f]]`` are field ``f``'s elements in
    datagram ``d``, scaled, whether published or not (NaN when the datagram was dropped);
    ``published[d, f]`` is True when field ``f`` is due for publication in datagram ``d``.
    """

    status: npt.NDArray[np.uint8]
    values: npt.NDArray[np.float64]
    published: npt.NDArray[np.bool_]
    ids: Sequence[str]
    counts: Sequence[int]
    starts: Sequence[int]

    def column(self, field: int | str) -> npt.NDArray[np.float64]:
        """Field `field`'s (index or signal id) values per datagram: datagrams x elements."""
        f = field if isinstance(field, int) else list(self.ids).index(field)
        return self.values[:, self.starts[f] : self.starts[f] + self.counts[f]]

    def rows(self) -> Iterator[tuple[int, str, list[float]]]:
        """(datagram index, signal id, values) per published field, as `PlanBatch.rows`."""
        for d, f in zip(*np.nonzero(self.published), strict=True):
            start = self.starts[f]
            yield int(d), self.ids[f], self.values[d, start : start + self.counts[f]].tolist()


class InputPlan:
    """The T-to-O assembly of one connection: fields, gates and last publication times."""

    def __init__(
        self,
        instance: int,
        size_bytes: int,
        fields: Sequence[AssemblyField],
        *,
        real_time_format: RealTimeFormat = "modeless",
        sample_ms: int = 0,
    ) -> None:
        self._plan = _cip.InputPlan(
            instance, size_bytes, real_time_format, sample_ms, [f.as_tuple() for f in fields]
        )
        self.ids: list[str] = self._plan.ids
        self.names: list[str] = self._plan.names
        self.counts: list[int] = self._plan.counts
        self.starts: list[int] = self._plan.starts
        self._elements: int = self._plan.elements
        self._fields = len(self.ids)
        self.size_bytes = size_bytes

    @classmethod
    def from_config(
        cls,
        instance: int,
        input_doc: Mapping[str, Any],
        publish_mode: Literal["onChange", "always"] = "onChange",
    ) -> InputPlan:
        """From io.input (sizeBytes, realTimeFormat, sampleMs, signals) and io.assemblies.input."""
        return cls(
            instance,
            input_doc["sizeBytes"],
            [AssemblyField.from_config(s, publish_mode) for s in input_doc["signals"]],
            real_time_format=input_doc.get("realTimeFormat", "modeless"),
            sample_ms=input_doc.get("sampleMs", 0),
        )

    @property
    def core(self) -> _cip.InputPlan:
        """The compiled Rust plan (what the class-1 engine takes)."""
        return self._plan

    def decode(self, datagram: bytes, now_ms: int) -> Decoded:
        """One whole UDP datagram; `now_ms` is a monotonic clock in milliseconds."""
        out = self._plan.decode(datagram, now_ms)
        ids = self.ids
        return Decoded(out.reason, out.cip_sequence, out.run, [(ids[i], v) for i, v in out.updates])

    def decode_batch(self, datagrams: Sequence[bytes], now_ms: int | Sequence[int]) -> PlanBatch:
        """Many datagrams in arrival order in one call (the GIL released from 64)."""
        status, rows_d, rows_f, values = self._plan.decode_batch(datagrams, now_ms)
        return PlanBatch(
            memoryview(status),
            memoryview(rows_d).cast("I"),
            memoryview(rows_f).cast("I"),
            memoryview(values).cast("d"),
            self.ids,
            self.counts,
        )

    def decode_columns(self, datagrams: Any, now_ms: int | Sequence[int]) -> PlanColumns:
        """Many datagrams as columns for batch callers: `datagrams` is one bytes-like buffer
        of whole datagrams back to back, or a sequence of datagrams (the GIL released from 64)."""
        status, values, published = self._plan.decode_columns(datagrams, now_ms)
        n = len(status)
        frombuffer: Any = np.frombuffer  # numpy's stub lists buffer types, not the protocol
        # Rust writes column after column; the transposed views index [datagram, column].
        return PlanColumns(
            frombuffer(status, np.uint8),
            frombuffer(values, np.float64).reshape(self._elements, n).T,
            frombuffer(published, np.bool_).reshape(self._fields, n).T,
            self.ids,
            self.counts,
            self.starts,
        )

    def reset(self) -> None:
        """Forgets every last publication: the next datagram publishes every field."""
        self._plan.reset()


class OutputPlan:
    """The O-to-T assembly of one connection, for writes (sizeBytes 0: a heartbeat)."""

    def __init__(
        self,
        instance: int,
        size_bytes: int,
        fields: Sequence[AssemblyField] = (),
        *,
        real_time_format: RealTimeFormat = "header32",
    ) -> None:
        self._plan = _cip.OutputPlan(
            instance, size_bytes, real_time_format, [f.as_tuple() for f in fields]
        )
        self.ids: list[str] = self._plan.ids
        self.names: list[str] = self._plan.names
        self.size_bytes = size_bytes
        self.real_time_format: str = self._plan.real_time_format

    def encode(self, values: Mapping[str, Any], base: bytes | None = None) -> bytes:
        """`base` (zeros when None) with `values` (by name or signal id) written in; raises
        CipError, writing nothing, when any value does not fit its field."""
        return self._plan.encode(values, base)
