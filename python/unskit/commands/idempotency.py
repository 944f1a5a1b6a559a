"""Durable idempotency records for mutating verbs, keyed on (component, scope, requestId)
with a canonical hash of the arguments: held in memory, each change appended to a journal
file (`unskit._core.journal`) before it is answered."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from unskit._core.journal import Journal
from unskit._core.journal import read as read_journal
from unskit.errors import JournalError

__all__ = [
    "Claim",
    "ClaimKind",
    "IdempotencyKey",
    "IdempotencyStore",
    "arguments_hash",
    "journaled_states",
]

_log = logging.getLogger(__name__)

# Pruning runs at open and then after this many new records, so it costs nothing per request.
_PRUNE_EVERY = 1000
# The journal is rewritten with only the live records once it holds more than twice as many
# records as are live, plus this many.
COMPACT_SLACK = 1000
# A store of an earlier version: its records move into the journal at the first open.
LEGACY_SUFFIX = ".sqlite3"

# One journal record per change: a record's whole state ("put") or its removal ("del").
_PUT = "put"
_DEL = "del"


def arguments_hash(namespace: str, arguments: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the namespace and the arguments."""
    canonical = _CANONICAL.encode({"namespace": namespace, "arguments": arguments})
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# Made once: json.dumps builds a new encoder for every call given other settings.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class IdempotencyKey(NamedTuple):
    """A record's key. A tuple, so hashing it (several times a request) is done in C."""

    component: str
    #: The addressed instance, or "" for the component namespace.
    scope: str
    request_id: str


class ClaimKind(Enum):
    NEW = "new"  # run the operation, then complete() or forget()
    REPLAY = "replay"  # the original outcome, to send again
    IN_FLIGHT = "in-flight"  # the same operation is running now: wait on `waiter`
    CONFLICT = "conflict"  # the requestId was used with other arguments
    UNKNOWN = "unknown"  # an earlier process started it and never recorded the outcome


@dataclass(frozen=True)
class Claim:
    kind: ClaimKind
    outcome: Mapping[str, Any] | None = None
    waiter: Future[Mapping[str, Any]] | None = None


class IdempotencyStore:
    """One journal per component, safe to share between the inbox's worker threads.

    Every record is in memory; each claim, outcome and removal is appended to the journal
    (one write, made with the GIL held) before the call returns, which is what survives a
    killed process; `synchronous_full` also puts it on disk (a power cut)."""

    def __init__(
        self,
        path: str | Path,
        *,
        retention_seconds: float = 24 * 3600,
        max_records: int = 100_000,
        synchronous_full: bool = False,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.retention_seconds = retention_seconds
        self.max_records = max_records
        # Each process run has its own id: a pending record of another run lost its outcome.
        self.boot_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        # Oldest change first, so pruning takes from the front.
        self._records: OrderedDict[IdempotencyKey, _Record] = OrderedDict()
        # Every claim this run is running, with the future its duplicates wait on: made by
        # the first duplicate, since almost no claim has one.
        self._running: dict[IdempotencyKey, Future[Mapping[str, Any]] | None] = {}
        self._since_prune = 0
        self._journal, lines, torn = Journal.open(self.path, sync=synchronous_full)
        try:
            for index, line in enumerate(lines):
                _replay(self._records, line, index, self.path)
            #: Records the journal file holds, live or not.
            self.journal_records = len(lines)
            if torn:
                _log.warning(
                    "idempotency: %s ended in %d bytes of an unfinished write (a killed "
                    "process or a power cut); cut off, the %d records before them kept",
                    self.path,
                    torn,
                    len(lines),
                )
            self._move_legacy_records()
            self.prune()
        except BaseException:
            self._journal.close()
            raise

    def claim(self, key: IdempotencyKey, args_hash: str) -> Claim:
        """Looks the key up; a NEW claim is journaled as pending before it is returned."""
        with self._lock:
            record = self._records.get(key)
            if record is None:
                now = _now_ms()
                self._put(key, _Record(args_hash, self.boot_id, None, now, now, done=False))
                self._running[key] = None
                self._since_prune += 1
                prune = self._since_prune >= _PRUNE_EVERY
            elif record.args_hash != args_hash:
                return Claim(ClaimKind.CONFLICT)
            elif record.done:
                assert record.outcome is not None
                return Claim(ClaimKind.REPLAY, outcome=json.loads(record.outcome))
            elif record.boot_id == self.boot_id and key in self._running:
                waiter = self._running[key]
                if waiter is None:
                    waiter = self._running[key] = Future()
                return Claim(ClaimKind.IN_FLIGHT, waiter=waiter)
            else:
                return Claim(ClaimKind.UNKNOWN)
        if prune:
            self.prune()
        return Claim(ClaimKind.NEW)

    def complete(self, key: IdempotencyKey, outcome: Mapping[str, Any]) -> None:
        """Records the outcome (journaled), then wakes duplicates waiting on it."""
        encoded = json.dumps(outcome)
        with self._lock:
            record = self._records.get(key)
            # None: pruned while it ran (beyond max_records), as a retry then runs anew.
            if record is not None:
                self._put(
                    key,
                    _Record(
                        record.args_hash,
                        record.boot_id,
                        encoded,
                        record.created_ms,
                        _now_ms(),
                        done=True,
                    ),
                )
            waiter = self._running.pop(key, None)
        if waiter is not None:
            waiter.set_result(outcome)

    def forget(self, key: IdempotencyKey, outcome: Mapping[str, Any]) -> None:
        """Drops a pending record (a refusal of the moment); waiting duplicates get
        `outcome` and a later retry runs anew."""
        with self._lock:
            record = self._records.get(key)
            if record is not None and not record.done:
                self._append(_line([_DEL, key.component, key.scope, key.request_id]))
                del self._records[key]
            waiter = self._running.pop(key, None)
        if waiter is not None:
            waiter.set_result(outcome)

    def prune(self) -> int:
        """Drops records older than the retention, then the oldest beyond max_records."""
        cutoff = _now_ms() - int(self.retention_seconds * 1000)
        with self._lock:
            self._since_prune = 0
            expired = excess = 0
            # Oldest change first (a clock stepped back may leave a few behind until later).
            while self._records:
                key, record = next(iter(self._records.items()))
                if record.updated_ms >= cutoff:
                    break
                del self._records[key]
                expired += 1
            while len(self._records) > self.max_records:
                self._records.popitem(last=False)
                excess += 1
            # Dropped records are not journaled one by one: they leave with the next
            # compaction, and a reopen before it prunes them again.
            self._compact_if_due()
        if expired or excess:
            _log.debug("idempotency: pruned %d expired and %d excess records", expired, excess)
        return expired + excess

    def count(self) -> int:
        """How many records the store holds."""
        with self._lock:
            return len(self._records)

    def close(self) -> None:
        """Closes the journal (and releases its lock on the file)."""
        with self._lock:
            self._journal.close()

    # -- the journal ----------------------------------------------------------------------

    def _put(self, key: IdempotencyKey, record: _Record) -> None:
        # Called with the lock held. Journaled first: a failed write changes nothing.
        self._append(_encode(key, record))
        self._records.pop(key, None)
        self._records[key] = record

    def _append(self, line: bytes) -> None:
        self._journal.append(line)
        self.journal_records += 1
        self._compact_if_due()

    def _compact_if_due(self) -> None:
        # Called with the lock held.
        if self.journal_records <= 2 * len(self._records) + COMPACT_SLACK:
            return
        self._journal.rewrite([_encode(key, record) for key, record in self._records.items()])
        self.journal_records = len(self._records)

    def _move_legacy_records(self) -> None:
        """Moves the records of an earlier version's SQLite store beside the journal into it
        (once: the old files are removed after the journal has them on disk)."""
        legacy = self.path.with_suffix(LEGACY_SUFFIX)
        if legacy == self.path or not legacy.exists():
            return
        if self._records:  # moved before, and the removal did not finish
            _remove_sqlite_files(legacy)
            return
        try:
            with contextlib.closing(sqlite3.connect(legacy)) as db:
                rows = db.execute(
                    "SELECT component, scope, request_id, args_hash, boot_id, state, outcome, "
                    "created_ms, updated_ms FROM idempotency ORDER BY updated_ms"
                ).fetchall()
        except sqlite3.Error as error:
            raise JournalError(
                f"{legacy}: the earlier idempotency store cannot be read ({error}); "
                "move it away to start without its records"
            ) from None
        for row in rows:
            self._records[IdempotencyKey(*row[:3])] = _Record(
                row[3], row[4], row[6], row[7], row[8], done=row[5] == "done"
            )
        self._journal.rewrite([_encode(key, record) for key, record in self._records.items()])
        self.journal_records = len(self._records)
        _remove_sqlite_files(legacy)
        _log.info("idempotency: moved %d records from %s to %s", len(rows), legacy, self.path)


@dataclass(slots=True)
class _Record:
    args_hash: str
    boot_id: str
    #: The outcome's JSON, once done.
    outcome: str | None
    created_ms: int
    updated_ms: int
    done: bool


def journaled_states(path: str | Path) -> dict[IdempotencyKey, str]:
    """Each record's state ("pending" or "done") in the journal at `path`, read without
    disturbing the store that has it open (for inspection and tests)."""
    records: OrderedDict[IdempotencyKey, _Record] = OrderedDict()
    for index, line in enumerate(read_journal(path)):
        _replay(records, line, index, Path(path))
    return {key: "done" if record.done else "pending" for key, record in records.items()}


def _replay(
    records: OrderedDict[IdempotencyKey, _Record], line: bytes, index: int, path: Path
) -> None:
    try:
        fields = json.loads(line)
        kind, component, scope, request_id = fields[:4]
        key = IdempotencyKey(component, scope, request_id)
        if kind == _DEL and len(fields) == 4:
            records.pop(key, None)
            return
        if kind != _PUT or len(fields) != 10:
            raise ValueError(f"a record of kind {kind!r} with {len(fields)} fields")
        args_hash, boot_id, done, outcome, created_ms, updated_ms = fields[4:]
        record = _Record(args_hash, boot_id, outcome, created_ms, updated_ms, done=done)
    except (ValueError, TypeError) as error:
        raise JournalError(
            f"{path}: record {index + 1} is not an idempotency record ({error})"
        ) from None
    records.pop(key, None)
    records[key] = record


def _encode(key: IdempotencyKey, record: _Record) -> bytes:
    return _line(
        [
            _PUT,
            key.component,
            key.scope,
            key.request_id,
            record.args_hash,
            record.boot_id,
            record.done,
            record.outcome,
            record.created_ms,
            record.updated_ms,
        ]
    )


def _line(fields: list[Any]) -> bytes:
    return _COMPACT.encode(fields).encode()


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _remove_sqlite_files(database: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)


def _now_ms() -> int:
    return int(time.time() * 1000)
