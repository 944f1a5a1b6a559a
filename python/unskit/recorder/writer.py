"""Samples buffered column by column, written as Parquet row groups into Hive partitions.

Each open file has its own buffer of typed columns (`array.array` buffers and dictionary
codes, turned into Arrow arrays in one step per row group), is written as
``.name.parquet.tmp`` (hidden: dataset readers skip it) and renamed to ``name.parquet``
only once closed (footer written, fsynced), so a reader or the file egress never sees a
partial file. The only module that imports pyarrow's writer."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import socket
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from unskit.recorder.config import RollPolicy

__all__ = [
    "METADATA_KEY",
    "QUALITIES",
    "SCHEMA_VERSION",
    "VALUE_TYPES",
    "FileFailure",
    "RecordWriter",
    "Source",
    "file_schema",
    "process_identity",
]

_log = logging.getLogger(__name__)

#: Bumped whenever a column is added, removed or changes type (docs/configuration.md).
SCHEMA_VERSION = "1"
METADATA_KEY = b"unskit.recorder.schema_version"
TMP_SUFFIX = ".parquet.tmp"
ABANDONED_SUFFIX = ".parquet.abandoned"
TAG_PREFIX = "tag_"
_DICT = pa.dictionary(pa.int32(), pa.string())
_TS = pa.timestamp("ms", tz="UTC")
#: What `value_type` holds: which column carries the sample's value.
VALUE_TYPES = ("null", "float64", "int64", "bool", "string", "list", "json")
(_NULL, _F64, _I64, _BOOL, _STR, _LIST, _JSON) = range(len(VALUE_TYPES))
QUALITIES = ("GOOD", "UNCERTAIN", "BAD")
_VALUE_TYPE_DICT = pa.array(VALUE_TYPES, pa.string())
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS


def process_identity() -> str:
    """``{host}-{pid}-{random}``: names this process's files apart from every other
    recorder's (a share group's members write into one root) and from its own last run's
    (a container restarts with the same pid)."""
    host = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())
    return f"{host or 'host'}-{os.getpid()}-{secrets.token_hex(3)}"


def file_schema(tag_keys: Sequence[str], *, variant: bool) -> pa.Schema:
    """The schema of a file whose messages carry these tag keys (schema version 1)."""
    fields = [
        pa.field("source_ts", _TS),
        pa.field("server_ts", _TS),
        pa.field("receive_ts", _TS, nullable=False),
        pa.field("root", _DICT, nullable=False),
        pa.field("device", _DICT, nullable=False),
        pa.field("component", _DICT, nullable=False),
        pa.field("instance", _DICT),
        pa.field("signal_id", _DICT, nullable=False),
        pa.field("signal_path", _DICT),
        pa.field("quality", _DICT, nullable=False),
        pa.field("status", pa.string()),
        pa.field("value_type", _DICT, nullable=False),
    ]
    if not variant:
        fields += [
            pa.field("value_float64", pa.float64()),
            pa.field("value_int64", pa.int64()),
            pa.field("value_bool", pa.bool_()),
            pa.field("value_string", pa.string()),
            pa.field("value_list", pa.list_(pa.float64())),
        ]
    fields.append(pa.field("value_json", pa.string()))
    fields += [pa.field(TAG_PREFIX + key, _DICT) for key in tag_keys]
    return pa.schema(fields, metadata={METADATA_KEY: SCHEMA_VERSION.encode()})


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


@dataclass
class FileFailure:
    """A file that could not be written: its rows are lost, its .tmp removed."""

    path: Path
    rows_lost: int
    error: str


@dataclass
class _OpenFile:
    partition: tuple[str, ...]
    tag_keys: tuple[str, ...]
    path: Path
    schema: pa.Schema
    buffer: _Columns
    opened: float
    handle: IO[bytes] | None = None
    writer: pq.ParquetWriter | None = None
    rows_written: int = 0
    bytes_written: int = 0
    last_used: float = field(default=0.0)

    @property
    def rows(self) -> int:
        return self.rows_written + self.buffer.count

    @property
    def tmp(self) -> Path:
        return self.path.with_name(f".{self.path.name}.tmp")

    def discard(self) -> None:
        # Best effort: the file is being given up, so a second failure must not hide the first.
        with contextlib.suppress(Exception):
            if self.writer is not None:
                self.writer.close()
        with contextlib.suppress(OSError):
            if self.handle is not None:
                self.handle.close()
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)


@dataclass
class WriterStats:
    files_closed: int = 0
    bytes_written: int = 0
    samples_written: int = 0
    samples_lost: int = 0
    write_errors: int = 0
    json_values: int = 0
    last_error: str | None = None


class RecordWriter:
    """The open files of one recorder, keyed by partition and tag keys. Not thread-safe:
    the component calls it under its own lock."""

    def __init__(
        self,
        output: Path,
        *,
        partition_by: Sequence[str],
        roll: RollPolicy,
        row_group_rows: int,
        codec: str,
        level: int | None,
        variant: bool,
        fsync: bool,
        max_open_files: int,
        identity: str,
        on_failure: Callable[[FileFailure], None] | None = None,
        on_closed: Callable[[Path], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.output = output
        self.partition_by = tuple(partition_by)
        self.roll = roll
        self.row_group_rows = row_group_rows
        self.compression = codec if codec != "none" else None
        self.level = level
        self.variant = variant
        self.fsync = fsync
        self.max_open_files = max_open_files
        self.identity = identity
        self.stats = WriterStats()
        self._files: dict[tuple[tuple[str, ...], tuple[str, ...]], _OpenFile] = {}
        #: The last file number used; file names never repeat within one identity.
        self.sequence = 0
        self._partitions: dict[tuple[int, str, str, str | None], tuple[str, ...]] = {}
        self._on_failure = on_failure
        self._on_closed = on_closed
        self._clock = clock

    # -- status ---------------------------------------------------------------------------

    @property
    def open_files(self) -> int:
        return len(self._files)

    @property
    def rows_buffered(self) -> int:
        return sum(f.buffer.count for f in self._files.values())

    def open_paths(self) -> list[Path]:
        """The final names of the files open now (each exists as ``.tmp`` until closed)."""
        return [f.path for f in self._files.values()]

    # -- writing --------------------------------------------------------------------------

    def add(self, source: Source, samples: Sequence[Mapping[str, Any]], receive_ms: int) -> int:
        """Appends sample dicts (as `Message.body` projects them); see `add_batch`."""
        if not samples:
            return 0
        return self.add_batch(source, Batch.from_samples(samples), receive_ms)

    def add_batch(self, source: Source, batch: Batch, receive_ms: int) -> int:
        """Appends one update's samples, each to the partition of its own time (source
        timestamp, else server timestamp, else `receive_ms`); returns the rows kept."""
        if not len(batch):
            return 0
        kept = 0
        for partition, group in self._by_partition(source, batch, receive_ms):
            kept += self._append(partition, source, group, receive_ms)
        return kept

    def _by_partition(
        self, source: Source, batch: Batch, receive_ms: int
    ) -> Iterable[tuple[tuple[str, ...], Batch]]:
        by_time = [p for p in self.partition_by if p in ("date", "hour")]
        if not by_time:
            return [(self._partition(source, 0), batch)]
        width = _HOUR_MS if "hour" in by_time else _DAY_MS
        stamps = batch.source_ts
        low, high = int(stamps.min()), int(stamps.max())
        if low > 0 and low // width == high // width:
            # The usual update: every sample stamped by its source within one hour.
            return [(self._partition(source, low), batch)]
        at = np.where(
            stamps > 0, stamps, np.where(batch.server_ts > 0, batch.server_ts, receive_ms)
        )
        buckets = at // width
        found = np.unique(buckets)
        if len(found) == 1:
            return [(self._partition(source, int(found[0]) * width), batch)]
        return [
            (self._partition(source, int(b) * width), batch.take(np.nonzero(buckets == b)[0]))
            for b in found
        ]

    def _partition(self, source: Source, at_ms: int) -> tuple[str, ...]:
        key = (at_ms // _HOUR_MS, source.device, source.component, source.instance)
        known = self._partitions.get(key)
        if known is None:
            if len(self._partitions) >= 4096:
                self._partitions.clear()
            known = self._partitions[key] = self._partition_of(source, at_ms)
        return known

    def _partition_of(self, source: Source, at_ms: int) -> tuple[str, ...]:
        values = []
        stamp = time.gmtime(at_ms // 1000) if at_ms >= 0 else time.gmtime(0)
        for key in self.partition_by:
            if key == "date":
                value = time.strftime("%Y-%m-%d", stamp)
            elif key == "hour":
                value = time.strftime("%H", stamp)
            elif key == "device":
                value = source.device
            elif key == "component":
                value = source.component
            else:
                value = source.instance or "_"
            values.append(f"{key}={quote(value, safe='')}")
        return tuple(values)

    def _append(
        self, partition: tuple[str, ...], source: Source, batch: Batch, receive_ms: int
    ) -> int:
        tag_keys = tuple(k for k, _ in source.tags)
        key = (partition, tag_keys)
        kept, done, total = 0, 0, len(batch)
        while done < total:
            opened = self._files.get(key)
            if opened is None:
                opened = self._files[key] = self._open(partition, tag_keys)
            opened.last_used = self._clock()
            # maxRows is exact: a batch larger than the room left continues in a new file.
            room = min(self.roll.max_rows - opened.rows, self.row_group_rows - opened.buffer.count)
            chunk = batch.slice(done, done + room)
            done += len(chunk)
            added, odd = opened.buffer.add(source, chunk, receive_ms)
            self.stats.json_values += odd
            if opened.buffer.count >= self.row_group_rows and not self._write_group(opened):
                return kept
            kept += added
            if opened.rows >= self.roll.max_rows or opened.bytes_written >= self.roll.max_bytes:
                self._close(key)
        return kept

    def _open(self, partition: tuple[str, ...], tag_keys: tuple[str, ...]) -> _OpenFile:
        if len(self._files) >= self.max_open_files:
            # The least recently used file makes room: a flood of late samples over many
            # hours must not hold a file per hour open.
            oldest = min(self._files, key=lambda k: self._files[k].last_used)
            self._close(oldest)
        folder = self.output.joinpath(*partition)
        while True:
            self.sequence += 1
            path = folder / f"{self.identity}-{self.sequence:06d}.parquet"
            # Never over a closed file (a writer rebuilt by a reload continues the count).
            if not path.exists():
                break
        schema = file_schema(tag_keys, variant=self.variant)
        return _OpenFile(
            partition, tag_keys, path, schema, _Columns(tag_keys, self.variant), self._clock()
        )

    def _write_group(self, opened: _OpenFile) -> bool:
        """Writes the buffered rows as one row group; False (file failed) on an error."""
        if opened.buffer.count == 0:
            return True
        try:
            table = opened.buffer.table(opened.schema)
            if opened.writer is None:
                opened.path.parent.mkdir(parents=True, exist_ok=True)
                opened.handle = open(opened.tmp, "wb")  # noqa: SIM115 (closed in _close/_fail)
                opened.writer = pq.ParquetWriter(
                    opened.handle,
                    opened.schema,
                    compression=self.compression,
                    compression_level=self.level,
                    write_statistics=True,
                )
            opened.writer.write_table(table, row_group_size=max(table.num_rows, 1))
            assert opened.handle is not None
            opened.bytes_written = opened.handle.tell()
        except (OSError, pa.ArrowException) as error:
            self._fail(opened, error)
            return False
        opened.rows_written += opened.buffer.count
        opened.buffer = _Columns(opened.tag_keys, self.variant)
        return True

    def _close(self, key: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
        opened = self._files.pop(key)
        if opened.rows == 0:
            return True
        if not self._write_group(opened):
            return False
        assert opened.writer is not None
        assert opened.handle is not None
        try:
            opened.writer.close()
            opened.handle.flush()
            if self.fsync:
                os.fsync(opened.handle.fileno())
            size = opened.handle.tell()
            opened.handle.close()
            os.replace(opened.tmp, opened.path)
            if self.fsync:
                _fsync_dir(opened.path.parent)
        except OSError as error:
            self._fail(opened, error)
            return False
        self.stats.files_closed += 1
        self.stats.bytes_written += size
        self.stats.samples_written += opened.rows_written
        if self._on_closed is not None:
            self._on_closed(opened.path)
        return True

    def _fail(self, opened: _OpenFile, error: BaseException) -> None:
        self._files = {k: f for k, f in self._files.items() if f is not opened}
        rows = opened.rows
        opened.discard()
        self.stats.write_errors += 1
        self._lose(rows)
        text = f"{opened.tmp}: {error}"
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            text = f"{opened.tmp}: no space left on the device"
        self.stats.last_error = text
        _log.warning("recorder: %d rows lost, file abandoned: %s", rows, text)
        if self._on_failure is not None:
            self._on_failure(FileFailure(opened.path, rows, text))

    def _lose(self, rows: int) -> None:
        self.stats.samples_lost += rows

    # -- closing --------------------------------------------------------------------------

    def close_expired(self) -> int:
        """Closes the files open for longer than roll.maxSeconds; returns how many."""
        now = self._clock()
        expired = [
            key
            for key, opened in self._files.items()
            if now - opened.opened >= self.roll.max_seconds
        ]
        return sum(self._close(key) for key in expired)

    def close_all(self) -> int:
        """Closes every open file (sb/flush, a stop); returns how many closed cleanly."""
        return sum(self._close(key) for key in list(self._files))

    def abandon_all(self) -> int:
        """Drops every open file without closing it (flushOnStop false); returns the rows."""
        rows = 0
        for opened in list(self._files.values()):
            rows += opened.rows
            opened.discard()
        self._files.clear()
        self._lose(rows)
        return rows


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recover_leftovers(output: Path, identity: str) -> list[Path]:
    """Renames the hidden ``.tmp`` files a crashed recorder of this host left (its pid is
    gone, or it is ours from an earlier run) to ``.parquet.abandoned``: they have no footer
    and cannot be read, and neither a reader nor the egress must take them. Returns the new
    names."""
    host, pid, _ = identity.rsplit("-", 2)
    moved: list[Path] = []
    if not output.is_dir():
        return moved
    for tmp in output.rglob(f".{host}-*{TMP_SUFFIX}"):
        parts = tmp.name[len(host) + 2 :].split("-")
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        owner = int(parts[0])
        if tmp.name.startswith(f".{identity}-"):
            continue
        if owner != int(pid) and _alive(owner):
            continue
        target = tmp.with_name(tmp.name[: -len(TMP_SUFFIX)] + ABANDONED_SUFFIX)
        try:
            os.replace(tmp, target)
        except OSError as error:
            _log.warning("recorder: leftover %s not set aside: %s", tmp, error)
            continue
        moved.append(target)
    return moved


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
