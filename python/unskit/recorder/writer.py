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
    """One dictionary-encoded column: codes per row, each distinct value stored once."""

    __slots__ = ("codes", "index", "values")

    def __init__(self, values: Sequence[str] = ()) -> None:
        self.values: list[str | None] = list(values)
        self.index: dict[str | None, int] = {v: i for i, v in enumerate(self.values)}
        self.codes = array("i")

    def code(self, value: str | None) -> int:
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.values)
            self.values.append(value)
        return found

    def repeat(self, value: str | None, count: int) -> None:
        self.codes.extend(array("i", (self.code(value),)) * count)

    def build(self) -> pa.Array:
        codes = np.frombuffer(self.codes, dtype=np.int32)
        nulls = self.index.get(None)
        dictionary = pa.array([v if v is not None else "" for v in self.values], pa.string())
        mask = codes == nulls if nulls is not None else None
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=mask), dictionary)


class _Sparse:
    """A value column most rows leave empty: the rows that have a value, and the values."""

    __slots__ = ("rows", "values")

    def __init__(self, values: Any) -> None:
        self.rows = array("q")
        self.values = values

    def build(self, count: int, kind: pa.DataType) -> pa.Array:
        if not self.rows:
            return pa.nulls(count, kind)
        compact = pa.array(self.values, kind)
        if len(self.rows) == count:
            return compact
        indices = np.full(count, -1, dtype=np.int64)
        indices[np.frombuffer(self.rows, dtype=np.int64)] = np.arange(len(self.rows))
        return compact.take(pa.array(indices, mask=indices < 0))


def _timestamps(values: array[int]) -> pa.Array:
    # 0 is the envelope's "not set": a null, not 1970.
    data = np.frombuffer(values, dtype=np.int64)
    return pa.array(data, _TS, mask=data == 0)


class _Columns:
    """The rows buffered for one file, column by column."""

    def __init__(self, tag_keys: Sequence[str], variant: bool) -> None:
        self.tag_keys = tuple(tag_keys)
        self.variant = variant
        self.count = 0
        self.source_ts = array("q")
        self.server_ts = array("q")
        self.receive_ts = array("q")
        self.root = _Dictionary()
        self.device = _Dictionary()
        self.component = _Dictionary()
        self.instance = _Dictionary()
        self.signal_id = _Dictionary()
        self.signal_path = _Dictionary()
        self.quality = _Dictionary(QUALITIES)
        self.value_type = array("i")
        self.status = _Sparse([])
        self.f64 = _Sparse(array("d"))
        self.i64 = _Sparse(array("q"))
        self.bools = _Sparse([])
        self.strings = _Sparse([])
        self.lists = _Sparse([])
        self.json = _Sparse([])
        self.tags = [_Dictionary() for _ in self.tag_keys]

    def add(
        self, source: Source, samples: Sequence[Mapping[str, Any]], receive_ms: int
    ) -> tuple[int, int]:
        """Appends one message's samples, as the envelope codec decodes them (value,
        quality and both timestamps always present, status when set); returns (rows added,
        values kept as JSON text because their type has no column of its own)."""
        start, n = self.count, len(samples)
        self.root.repeat(source.root, n)
        self.device.repeat(source.device, n)
        self.component.repeat(source.component, n)
        self.instance.repeat(source.instance, n)
        self.signal_id.repeat(source.signal_id, n)
        self.signal_path.repeat(source.signal_path, n)
        tags = dict(source.tags)
        for key, column in zip(self.tag_keys, self.tags, strict=True):
            column.repeat(tags.get(key), n)
        self.receive_ts.extend(array("q", (receive_ms,)) * n)
        # Column at a time: each field is gathered by one comprehension and lands in its
        # buffer in one C-level extend; only a batch of mixed value types goes sample by
        # sample.
        self.source_ts.extend(array("q", [s["source_timestamp_ms"] for s in samples]))
        self.server_ts.extend(array("q", [s["server_timestamp_ms"] for s in samples]))
        qualities = [s["quality"] for s in samples]
        codes = self.quality.codes
        if len(set(qualities)) == 1:
            codes.extend(array("i", (self.quality.code(qualities[0]),)) * n)
        else:
            codes.extend(array("i", map(self.quality.code, qualities)))
        statuses = [s.get("status") for s in samples]
        if any(statuses):
            for k, status in enumerate(statuses):
                if status:
                    self.status.rows.append(start + k)
                    self.status.values.append(status)
        values = [s["value"] for s in samples]
        odd = 0
        if not self._homogeneous(start, values):
            value_type = self.value_type
            for k, value in enumerate(values):
                kind = self._value(start + k, value)
                value_type.append(kind)
                odd += kind == _JSON
        self.count += n
        return n, odd

    def _homogeneous(self, start: int, values: list[Any]) -> bool:
        """Appends a batch whose values share one scalar type in one step; False (nothing
        appended) for any other batch."""
        if self.variant:
            return False
        kinds = set(map(type, values))
        if len(kinds) != 1:
            return False
        (kind,) = kinds
        n = len(values)
        if kind is float:
            column, code = self.f64, _F64
            column.values.extend(array("d", values))
        elif kind is int:
            column, code = self.i64, _I64
            try:
                column.values.extend(array("q", values))
            except OverflowError:
                return False
        elif kind is bool:
            column, code = self.bools, _BOOL
            column.values.extend(values)
        elif kind is str:
            column, code = self.strings, _STR
            column.values.extend(values)
        else:
            return False
        column.rows.frombytes(np.arange(start, start + n, dtype=np.int64).tobytes())
        self.value_type.extend(array("i", (code,)) * n)
        return True

    def _value(self, row: int, value: Any) -> int:
        kind = type(value)
        if value is None:
            return _NULL
        if self.variant:
            self.json.rows.append(row)
            self.json.values.append(_json(value))
            return _typed(value)
        if kind is float:
            self.f64.rows.append(row)
            self.f64.values.append(value)
            return _F64
        if kind is bool:
            self.bools.rows.append(row)
            self.bools.values.append(value)
            return _BOOL
        if kind is int and _INT64_MIN <= value <= _INT64_MAX:
            self.i64.rows.append(row)
            self.i64.values.append(value)
            return _I64
        if kind is str:
            self.strings.rows.append(row)
            self.strings.values.append(value)
            return _STR
        if kind is list and all(type(v) in (int, float) for v in value):
            self.lists.rows.append(row)
            self.lists.values.append([float(v) for v in value])
            return _LIST
        self.json.rows.append(row)
        self.json.values.append(_json(value))
        return _JSON

    def table(self, schema: pa.Schema) -> pa.Table:
        """The buffered rows as one table of `schema`."""
        n = self.count
        codes = np.frombuffer(self.value_type, dtype=np.int32)
        columns: list[pa.Array] = [
            _timestamps(self.source_ts),
            _timestamps(self.server_ts),
            pa.array(np.frombuffer(self.receive_ts, dtype=np.int64), _TS),
            self.root.build(),
            self.device.build(),
            self.component.build(),
            self.instance.build(),
            self.signal_id.build(),
            self.signal_path.build(),
            self.quality.build(),
            self.status.build(n, pa.string()),
            pa.DictionaryArray.from_arrays(pa.array(codes), _VALUE_TYPE_DICT),
        ]
        if not self.variant:
            columns += [
                self.f64.build(n, pa.float64()),
                self.i64.build(n, pa.int64()),
                self.bools.build(n, pa.bool_()),
                self.strings.build(n, pa.string()),
                self.lists.build(n, pa.list_(pa.float64())),
            ]
        columns.append(self.json.build(n, pa.string()))
        columns += [column.build() for column in self.tags]
        return pa.Table.from_arrays(columns, schema=schema)


def _typed(value: Any) -> int:
    kind = type(value)
    if kind is float:
        return _F64
    if kind is bool:
        return _BOOL
    if kind is int:
        return _I64 if _INT64_MIN <= value <= _INT64_MAX else _JSON
    if kind is str:
        return _STR
    if kind is list and all(type(v) in (int, float) for v in value):
        return _LIST
    return _JSON


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
        """Appends one message's samples, each to the partition of its own timestamp
        (source, else server, else receive time); returns the rows kept."""
        if not samples:
            return 0
        kept = 0
        for partition, group in self._by_partition(source, samples, receive_ms):
            kept += self._append(partition, source, group, receive_ms)
        return kept

    def _by_partition(
        self, source: Source, samples: Sequence[Mapping[str, Any]], receive_ms: int
    ) -> Iterable[tuple[tuple[str, ...], Sequence[Mapping[str, Any]]]]:
        by_time = [p for p in self.partition_by if p in ("date", "hour")]
        if not by_time:
            return [(self._partition(source, 0), samples)]
        width = _HOUR_MS if "hour" in by_time else _DAY_MS
        stamps = [s["source_timestamp_ms"] for s in samples]
        low, high = min(stamps), max(stamps)
        if low > 0 and low // width == high // width:
            # The usual update: every sample stamped by its source within one hour.
            return [(self._partition(source, low), samples)]
        buckets: dict[int, list[Mapping[str, Any]]] = {}
        first = None
        for sample in samples:
            at = (
                sample.get("source_timestamp_ms") or sample.get("server_timestamp_ms") or receive_ms
            )
            bucket = at // width
            if first is None:
                first = bucket
            buckets.setdefault(bucket, []).append(sample)
        if len(buckets) == 1:
            return [(self._partition(source, first or 0), samples)]
        return [(self._partition(source, b * width), group) for b, group in buckets.items()]

    def _partition(self, source: Source, at_ms: int) -> tuple[str, ...]:
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
        self,
        partition: tuple[str, ...],
        source: Source,
        samples: Sequence[Mapping[str, Any]],
        receive_ms: int,
    ) -> int:
        tag_keys = tuple(k for k, _ in source.tags)
        key = (partition, tag_keys)
        kept = 0
        while samples:
            opened = self._files.get(key)
            if opened is None:
                opened = self._files[key] = self._open(partition, tag_keys)
            opened.last_used = self._clock()
            # maxRows is exact: a batch larger than the room left continues in a new file.
            room = min(self.roll.max_rows - opened.rows, self.row_group_rows - opened.buffer.count)
            chunk, samples = samples[:room], samples[room:]
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
        with contextlib.suppress(Exception):
            if opened.writer is not None:
                opened.writer.close()
        with contextlib.suppress(OSError):
            if opened.handle is not None:
                opened.handle.close()
        with contextlib.suppress(OSError):
            opened.tmp.unlink(missing_ok=True)
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
            with contextlib.suppress(Exception):
                if opened.writer is not None:
                    opened.writer.close()
            with contextlib.suppress(OSError):
                if opened.handle is not None:
                    opened.handle.close()
            with contextlib.suppress(OSError):
                opened.tmp.unlink(missing_ok=True)
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
