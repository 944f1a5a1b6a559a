"""One update's samples as arrays (`Batch`) and the rows buffered for one file
(`_Columns`), turned into Arrow columns in one step per row group."""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from unskit.recorder.schema import (
    _BOOL,
    _F64,
    _I64,
    _INT64_MAX,
    _INT64_MIN,
    _JSON,
    _LIST,
    _STR,
    _TS,
    _VALUE_TYPE_DICT,
    QUALITIES,
)

__all__ = ["Batch", "Source"]


@dataclass(frozen=True)
class Source:
    """Where a signal update came from: constant for every sample of one message."""

    root: str
    device: str
    component: str
    instance: str | None
    signal_id: str
    signal_path: str | None
    tags: tuple[tuple[str, str], ...] = ()


class _Dictionary:
    """One dictionary-encoded column's distinct values, each stored once."""

    __slots__ = ("index", "values")

    def __init__(self) -> None:
        self.values: list[str | None] = []
        self.index: dict[str | None, int] = {}

    def code(self, value: str | None) -> int:
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.values)
            self.values.append(value)
        return found

    def build(self, codes: np.ndarray[Any, Any]) -> pa.Array:
        nulls = self.index.get(None)
        dictionary = pa.array([v if v is not None else "" for v in self.values], pa.string())
        mask = codes == nulls if nulls is not None else None
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=mask), dictionary)


_NUMERIC = (int, float)
#: The envelope's quality numbers (proto enum) and their names, as the body projects them.
_QUALITY_NAMES = ("UNSPECIFIED", *QUALITIES)


def _is_number_list(value: Any) -> bool:
    return type(value) is list and all(type(v) in _NUMERIC for v in value)


@dataclass
class Batch:
    """One update's samples as arrays (one entry per sample): what the envelope codec's
    `Message.signal_columns` returns, or built from sample dicts. `kind` holds the
    VALUE_TYPES code of each sample; `strings`, `lists`, `others` and `statuses` are
    (index, value) pairs of the samples they belong to."""

    source_ts: np.ndarray[Any, Any]
    server_ts: np.ndarray[Any, Any]
    quality: np.ndarray[Any, Any]
    kind: np.ndarray[Any, Any]
    doubles: np.ndarray[Any, Any]
    ints: np.ndarray[Any, Any]
    bools: np.ndarray[Any, Any]
    strings: list[tuple[int, str]]
    lists: list[tuple[int, list[float]]]
    others: list[tuple[int, Any]]
    statuses: list[tuple[int, str]]

    def __len__(self) -> int:
        return len(self.kind)

    @classmethod
    def from_columns(cls, columns: tuple[Any, ...]) -> Batch:
        """From `Message.signal_columns()`'s buffers (no object per sample)."""
        (_, _, _, source, server, quality, kinds, doubles, ints, bools) = columns[:10]
        strings, others, statuses = columns[10:13]
        kind = np.frombuffer(kinds, dtype=np.uint8).astype(np.int32)
        lists: list[tuple[int, list[float]]] = []
        odd: list[tuple[int, Any]] = []
        for index, value in others:
            # The codec's "other": a list of numbers has its column, the rest is JSON.
            if _is_number_list(value):
                lists.append((index, [float(v) for v in value]))
                kind[index] = _LIST
            else:
                odd.append((index, value))
                kind[index] = _JSON
        return cls(
            np.frombuffer(source, dtype=np.int64),
            np.frombuffer(server, dtype=np.int64),
            np.frombuffer(quality, dtype=np.int32),
            kind,
            np.frombuffer(doubles, dtype=np.float64),
            np.frombuffer(ints, dtype=np.int64),
            np.frombuffer(bools, dtype=np.uint8).astype(bool),
            strings,
            lists,
            odd,
            statuses,
        )

    @classmethod
    def from_samples(cls, samples: Sequence[Mapping[str, Any]]) -> Batch:
        """From sample dicts as `Message.body` projects them (value, quality, both
        timestamps; status when set)."""
        n = len(samples)
        kind = np.zeros(n, dtype=np.int32)
        doubles = np.zeros(n, dtype=np.float64)
        ints = np.zeros(n, dtype=np.int64)
        bools = np.zeros(n, dtype=bool)
        strings, lists, others, statuses = [], [], [], []
        names = {name: code for code, name in enumerate(_QUALITY_NAMES)}
        quality = np.array(
            [names.get(q, q) if isinstance(q, str) else q for q in
             (s.get("quality", "GOOD") for s in samples)],
            dtype=np.int32,
        )  # fmt: skip
        for k, sample in enumerate(samples):
            value: Any = sample.get("value")
            status = sample.get("status")
            if status:
                statuses.append((k, status))
            if value is None:
                continue
            t: type = type(value)
            if t is float:
                kind[k], doubles[k] = _F64, value
            elif t is bool:
                kind[k], bools[k] = _BOOL, value
            elif t is int and _INT64_MIN <= value <= _INT64_MAX:
                kind[k], ints[k] = _I64, value
            elif t is str:
                kind[k] = _STR
                strings.append((k, value))
            elif _is_number_list(value):
                kind[k] = _LIST
                lists.append((k, [float(v) for v in value]))
            else:
                kind[k] = _JSON
                others.append((k, value))
        return cls(
            np.array([s.get("source_timestamp_ms", 0) for s in samples], dtype=np.int64),
            np.array([s.get("server_timestamp_ms", 0) for s in samples], dtype=np.int64),
            quality,
            kind,
            doubles,
            ints,
            bools,
            strings,
            lists,
            others,
            statuses,
        )

    def take(self, rows: np.ndarray[Any, Any]) -> Batch:
        """The samples at `rows` (sorted positions), renumbered from 0."""
        where = {int(old): new for new, old in enumerate(rows)}

        def pick(pairs: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
            return [(where[i], v) for i, v in pairs if i in where]

        return Batch(
            self.source_ts[rows],
            self.server_ts[rows],
            self.quality[rows],
            self.kind[rows],
            self.doubles[rows],
            self.ints[rows],
            self.bools[rows],
            pick(self.strings),
            pick(self.lists),
            pick(self.others),
            pick(self.statuses),
        )

    def slice(self, start: int, stop: int) -> Batch:
        """Samples start..stop-1, renumbered from 0."""
        if start == 0 and stop >= len(self):
            return self
        return self.take(np.arange(start, min(stop, len(self))))

    def value(self, k: int) -> Any:
        """Sample k's value as a Python object (the variant layout's JSON text needs it)."""
        code = int(self.kind[k])
        if code == _F64:
            return float(self.doubles[k])
        if code == _I64:
            return int(self.ints[k])
        if code == _BOOL:
            return bool(self.bools[k])
        for pairs in (self.strings, self.lists, self.others):
            for index, value in pairs:
                if index == k:
                    return value
        return None


class _Columns:
    """The rows buffered for one file: each update's arrays and its source, turned into
    columns in one step per row group."""

    def __init__(self, tag_keys: Sequence[str], variant: bool) -> None:
        self.tag_keys = tuple(tag_keys)
        self.variant = variant
        self.count = 0
        self.batches: list[Batch] = []
        self.sources: list[Source] = []
        self.receive_ms = array("q")

    def add(self, source: Source, batch: Batch, receive_ms: int) -> tuple[int, int]:
        """Appends one update's samples (no copy of its arrays until the row group is
        built); returns (rows added, values kept as JSON text because their type has no
        column of its own)."""
        self.batches.append(batch)
        self.sources.append(source)
        self.receive_ms.append(receive_ms)
        n = len(batch)
        self.count += n
        return n, len(batch.others)

    def _per_update(self, values: Sequence[str | None], counts: Any) -> pa.Array:
        """A dictionary column of one value per update, repeated over its samples."""
        column = _Dictionary()
        codes = np.array([column.code(v) for v in values], dtype=np.int32)
        return column.build(np.repeat(codes, counts))

    def table(self, schema: pa.Schema) -> pa.Table:
        """The buffered rows as one table of `schema`."""
        n = self.count
        batches, sources = self.batches, self.sources
        counts = np.array([len(b) for b in batches], dtype=np.int64)
        kind = np.concatenate([b.kind for b in batches])
        receive = np.repeat(np.frombuffer(self.receive_ms, dtype=np.int64), counts)
        columns: list[pa.Array] = [
            _timestamps(np.concatenate([b.source_ts for b in batches])),
            _timestamps(np.concatenate([b.server_ts for b in batches])),
            pa.array(receive).cast(_TS),
            self._per_update([s.root for s in sources], counts),
            self._per_update([s.device for s in sources], counts),
            self._per_update([s.component for s in sources], counts),
            self._per_update([s.instance for s in sources], counts),
            self._per_update([s.signal_id for s in sources], counts),
            self._per_update([s.signal_path for s in sources], counts),
            _qualities(np.concatenate([b.quality for b in batches])),
            _sparse(batches, "statuses", n, pa.string()),
            pa.DictionaryArray.from_arrays(pa.array(kind), _VALUE_TYPE_DICT),
        ]
        if self.variant:
            columns.append(_variant(batches, n))
        else:
            columns += [
                pa.array(np.concatenate([b.doubles for b in batches]), mask=kind != _F64),
                pa.array(np.concatenate([b.ints for b in batches]), mask=kind != _I64),
                pa.array(np.concatenate([b.bools for b in batches]), mask=kind != _BOOL),
                _sparse(batches, "strings", n, pa.string()),
                _sparse(batches, "lists", n, pa.list_(pa.float64())),
                _sparse(batches, "others", n, pa.string(), _json),
            ]
        for key in self.tag_keys:
            columns.append(self._per_update([dict(s.tags).get(key) for s in sources], counts))
        return pa.Table.from_arrays(columns, schema=schema)


def _timestamps(data: np.ndarray[Any, Any]) -> pa.Array:
    # 0 is the envelope's "not set": a null, not 1970. Built as int64 and cast: the
    # timestamp conversion of a masked NumPy array takes a slower path.
    return pa.array(data, mask=data == 0).cast(_TS)


def _qualities(numbers: np.ndarray[Any, Any]) -> pa.Array:
    names = list(_QUALITY_NAMES)
    if len(numbers) and (numbers.min() < 0 or numbers.max() >= len(names)):
        # A quality from a newer schema: named by its number, not guessed.
        found = np.unique(numbers)
        names = [_QUALITY_NAMES[q] if 0 <= q < len(_QUALITY_NAMES) else str(q) for q in found]
        numbers = np.searchsorted(found, numbers).astype(np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(numbers), pa.array(names, pa.string()))


def _sparse(
    batches: list[Batch],
    field_name: str,
    count: int,
    kind: pa.DataType,
    convert: Callable[[Any], Any] | None = None,
) -> pa.Array:
    """A column only some rows have a value in, from the batches' (index, value) pairs."""
    rows: list[int] = []
    values: list[Any] = []
    offset = 0
    for batch in batches:
        for index, value in getattr(batch, field_name):
            rows.append(offset + index)
            values.append(value if convert is None else convert(value))
        offset += len(batch)
    if not rows:
        return pa.nulls(count, kind)
    compact = pa.array(values, kind)
    if len(rows) == count:
        return compact
    indices = np.full(count, -1, dtype=np.int64)
    indices[np.array(rows, dtype=np.int64)] = np.arange(len(rows))
    return compact.take(pa.array(indices, mask=indices < 0))


def _variant(batches: list[Batch], count: int) -> pa.Array:
    texts: list[str | None] = []
    for batch in batches:
        for k in range(len(batch)):
            value = batch.value(k)
            texts.append(None if value is None else _json(value))
    return pa.array(texts, pa.string()) if texts else pa.nulls(count, pa.string())


def _json(value: Any) -> str:
    # NaN and infinities inside a JSON value are written as JavaScript prints them.
    return json.dumps(value, allow_nan=True, default=str, separators=(",", ":"))
