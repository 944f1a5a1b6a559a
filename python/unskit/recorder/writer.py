"""Samples buffered column by column, written as Parquet row groups into Hive partitions.

Each open file has its own buffer of typed columns (`array.array` buffers and dictionary
codes, turned into Arrow arrays in one step per row group), is written as
``.name.parquet.tmp`` (hidden: dataset readers skip it) and renamed to ``name.parquet``
only once closed (footer written, fsynced), so a reader or the file egress never sees a
partial file. With `files.py`, the only modules that import pyarrow's writer."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from unskit.files import fsync_directory
from unskit.recorder.columns import Batch as Batch
from unskit.recorder.columns import Source, _Columns
from unskit.recorder.config import RollPolicy
from unskit.recorder.files import FileFailure, _OpenFile, process_identity
from unskit.recorder.files import recover_leftovers as recover_leftovers
from unskit.recorder.schema import METADATA_KEY, QUALITIES, SCHEMA_VERSION, VALUE_TYPES, file_schema

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

_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS


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
                fsync_directory(opened.path.parent)
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
