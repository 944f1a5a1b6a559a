"""Durable idempotency records for mutating verbs, keyed on (component, scope, requestId)
with a canonical hash of the arguments, in SQLite (WAL)."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = ["Claim", "ClaimKind", "IdempotencyKey", "IdempotencyStore", "arguments_hash"]

_log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    component TEXT NOT NULL,
    scope TEXT NOT NULL,
    request_id TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'done')),
    outcome TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (component, scope, request_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_age ON idempotency (updated_ms);
"""

# Pruning runs at open and then after this many new records, so it costs nothing per request.
_PRUNE_EVERY = 1000
# The checkpointer folds the WAL back into the database after this many commits (a claim and
# its outcome are two; SQLite's own automatic checkpoint comes at about 1000 pages, some 250
# requests), or after this many idle seconds when any commit waits.
CHECKPOINT_EVERY_COMMITS = 500
CHECKPOINT_IDLE_SECS = 30.0
# Page size of a new store file. Each commit appends every page it changed to the WAL (a claim:
# the table's leaf and the age index's leaf, and so does its outcome): 1 KiB pages instead of
# SQLite's 4 KiB cut the bytes written per request by two thirds and the store's CPU per
# request by a fifth (docs/decisions.md). A file made before keeps its page size.
PAGE_SIZE = 1024


def arguments_hash(namespace: str, arguments: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the namespace and the arguments."""
    canonical = json.dumps(
        {"namespace": namespace, "arguments": arguments},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class IdempotencyKey:
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
    """One SQLite file per component; safe to share between the inbox's worker threads."""

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
        # Every claim this run is running, with the future its duplicates wait on: made by
        # the first duplicate, since almost no claim has one.
        self._waiters: dict[IdempotencyKey, Future[Mapping[str, Any]] | None] = {}
        self._since_prune = 0
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        # Only takes effect on a file without tables yet (and before WAL mode is set).
        self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL survives a killed process (the WAL is in the OS); FULL also a power cut.
        self._synchronous = "FULL" if synchronous_full else "NORMAL"
        self._db.execute(f"PRAGMA synchronous={self._synchronous}")
        self._db.executescript(_SCHEMA)
        # Checkpoints (the fsyncs of NORMAL) run on their own thread and connection, never
        # inside a request's commit: there they held the store's lock for milliseconds, every
        # few hundred requests (docs/decisions.md, "Idempotency checkpoints off the request
        # path"). Each commit still reaches the WAL before claim/complete return, as before.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._commits = 0
        #: Checkpoints the checkpointer ran.
        self.checkpoints = 0
        self._checkpoint_due = threading.Event()
        self._closing = False
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, name="unskit-idempotency-checkpoint", daemon=True
        )
        self._checkpointer.start()
        self.prune()

    def claim(self, key: IdempotencyKey, args_hash: str) -> Claim:
        """Looks the key up; a NEW claim is committed as pending before it is returned."""
        now = _now_ms()
        with self._lock:
            while True:
                # One statement for a new key (the common case): each statement gives up the
                # GIL and must win it back while every other inbox worker waits for this lock.
                inserted = self._db.execute(
                    "INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, 'pending', NULL, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (key.component, key.scope, key.request_id, args_hash, self.boot_id, now, now),
                ).rowcount
                if inserted:
                    break
                row = self._db.execute(
                    "SELECT args_hash, boot_id, state, outcome FROM idempotency "
                    "WHERE component = ? AND scope = ? AND request_id = ?",
                    (key.component, key.scope, key.request_id),
                ).fetchone()
                if row is not None:  # else pruned in between by another process: insert again
                    return self._existing(key, args_hash, row)
            self._committed()
            self._waiters[key] = None
            self._since_prune += 1
            prune = self._since_prune >= _PRUNE_EVERY
        if prune:
            self.prune()
        return Claim(ClaimKind.NEW)

    def _existing(self, key: IdempotencyKey, args_hash: str, row: tuple[Any, ...]) -> Claim:
        stored_hash, boot_id, state, outcome = row
        if stored_hash != args_hash:
            return Claim(ClaimKind.CONFLICT)
        if state == "done":
            return Claim(ClaimKind.REPLAY, outcome=json.loads(outcome))
        # Called with the lock held, so the future is made once and complete() finds it.
        if boot_id == self.boot_id and key in self._waiters:
            waiter = self._waiters[key]
            if waiter is None:
                waiter = self._waiters[key] = Future()
            return Claim(ClaimKind.IN_FLIGHT, waiter=waiter)
        return Claim(ClaimKind.UNKNOWN)

    def complete(self, key: IdempotencyKey, outcome: Mapping[str, Any]) -> None:
        """Records the outcome (committed), then wakes duplicates waiting on it."""
        encoded = json.dumps(outcome)  # not while the other workers wait for the lock
        with self._lock:
            self._db.execute(
                "UPDATE idempotency SET state = 'done', outcome = ?, updated_ms = ? "
                "WHERE component = ? AND scope = ? AND request_id = ?",
                (encoded, _now_ms(), key.component, key.scope, key.request_id),
            )
            self._committed()
            waiter = self._waiters.pop(key, None)
        if waiter is not None:
            waiter.set_result(outcome)

    def forget(self, key: IdempotencyKey, outcome: Mapping[str, Any]) -> None:
        """Drops a pending record (a refusal of the moment); waiting duplicates get
        `outcome` and a later retry runs anew."""
        with self._lock:
            self._db.execute(
                "DELETE FROM idempotency WHERE component = ? AND scope = ? AND request_id = ? "
                "AND state = 'pending'",
                (key.component, key.scope, key.request_id),
            )
            self._committed()
            waiter = self._waiters.pop(key, None)
        if waiter is not None:
            waiter.set_result(outcome)

    def _committed(self) -> None:
        # Called with the lock held.
        self._commits += 1
        if self._commits >= CHECKPOINT_EVERY_COMMITS:
            self._commits = 0
            self._checkpoint_due.set()

    def _checkpoint_loop(self) -> None:
        db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            while True:
                due = self._checkpoint_due.wait(CHECKPOINT_IDLE_SECS)
                self._checkpoint_due.clear()
                if self._closing:
                    return
                if not due:
                    with self._lock:
                        idle_commits, self._commits = self._commits, 0
                    if not idle_commits:
                        continue
                try:
                    # PASSIVE: never waits for, nor blocks, the request path's writes.
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.checkpoints += 1
                except sqlite3.Error as error:
                    _log.warning("idempotency: checkpoint of %s failed: %s", self.path, error)
        finally:
            db.close()

    def prune(self) -> int:
        """Deletes records older than the retention, then the oldest beyond max_records."""
        cutoff = _now_ms() - int(self.retention_seconds * 1000)
        with self._lock:
            self._since_prune = 0
            expired = self._db.execute(
                "DELETE FROM idempotency WHERE updated_ms < ?", (cutoff,)
            ).rowcount
            excess = 0
            count = self._db.execute("SELECT count(*) FROM idempotency").fetchone()[0]
            if count > self.max_records:
                excess = self._db.execute(
                    "DELETE FROM idempotency WHERE (component, scope, request_id) IN ("
                    " SELECT component, scope, request_id FROM idempotency"
                    " ORDER BY updated_ms LIMIT ?)",
                    (count - self.max_records,),
                ).rowcount
        if expired or excess:
            _log.debug("idempotency: pruned %d expired and %d excess records", expired, excess)
        return int(expired + excess)

    def count(self) -> int:
        """How many records the store holds."""
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM idempotency").fetchone()[0])

    def close(self) -> None:
        """Stops the checkpointer and closes the database (which checkpoints what is left)."""
        self._closing = True
        self._checkpoint_due.set()
        self._checkpointer.join(10)
        with self._lock:
            self._db.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
