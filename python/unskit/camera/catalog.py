"""The durable capture catalog: one SQLite database (WAL) holding the jobs and groups; every
state change is committed here before anyone is told about it. Terminal jobs past the
retention (a count and an age) are pruned; images and sidecars are never touched."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unskit.camera.config import CatalogRetention
from unskit.camera.jobs import NON_TERMINAL, TERMINAL, Job, JobState, now_ms

__all__ = ["PRUNE_BATCH", "PRUNE_GRACE_MS", "Catalog", "GroupRecord"]

#: Terminal jobs one pruning pass looks at (its group mates come along): bounded work per
#: admission.
PRUNE_BATCH = 256
#: A job that ended less than this long ago is never pruned: the reply or group reply being
#: put together for it may still read its row.
PRUNE_GRACE_MS = 60_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    capture_id TEXT NOT NULL UNIQUE,
    camera TEXT NOT NULL,
    state TEXT NOT NULL,
    request_id TEXT,
    group_id TEXT,
    group_size INTEGER,
    trigger TEXT NOT NULL,
    profile TEXT NOT NULL,
    capture_mode TEXT NOT NULL,
    timeout_ms INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    accepted_ms INTEGER NOT NULL,
    terminal_ms INTEGER,
    error_code TEXT,
    error_message TEXT,
    result TEXT
);
CREATE INDEX IF NOT EXISTS jobs_request ON jobs (camera, request_id);
CREATE INDEX IF NOT EXISTS jobs_group ON jobs (group_id);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_terminal ON jobs (terminal_ms);
CREATE TABLE IF NOT EXISTS groups (
    group_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    accepted_ms INTEGER NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS groups_request ON groups (request_id);
"""

_COLUMNS = (
    "capture_id, camera, state, request_id, group_id, group_size, trigger, profile, "
    "capture_mode, timeout_ms, metadata, correlation_id, event_id, accepted_ms, terminal_ms, "
    "error_code, error_message, result"
)


@dataclass(frozen=True)
class GroupRecord:
    """A capture group as stored: its members are jobs carrying its id."""

    group_id: str
    request_id: str
    accepted_ms: int
    size: int


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _row(job: Job) -> tuple[Any, ...]:
    return (
        job.capture_id,
        job.camera,
        job.state.value,
        job.request_id,
        job.group_id,
        job.group_size,
        _dump(job.trigger),
        job.profile,
        job.capture_mode,
        job.timeout_ms,
        _dump(job.metadata),
        job.correlation_id,
        job.event_id,
        job.accepted_ms,
        job.terminal_ms,
        job.error_code,
        job.error_message,
        None if job.result is None else _dump(job.result),
    )


def _job(row: sqlite3.Row) -> Job:
    return Job(
        capture_id=row["capture_id"],
        camera=row["camera"],
        state=JobState(row["state"]),
        request_id=row["request_id"],
        group_id=row["group_id"],
        group_size=row["group_size"],
        trigger=json.loads(row["trigger"]),
        profile=row["profile"],
        capture_mode=row["capture_mode"],
        timeout_ms=row["timeout_ms"],
        metadata=json.loads(row["metadata"]),
        correlation_id=row["correlation_id"],
        event_id=row["event_id"],
        accepted_ms=row["accepted_ms"],
        terminal_ms=row["terminal_ms"],
        error_code=row["error_code"],
        error_message=row["error_message"],
        result=None if row["result"] is None else json.loads(row["result"]),
    )


_TERMINAL_VALUES = tuple(state.value for state in TERMINAL)
_TERMINAL_MARKS = ", ".join("?" * len(_TERMINAL_VALUES))


class Catalog:
    """Jobs and groups in ``{stateRoot}/catalog.sqlite3``; thread-safe. Pruned at open and
    on every insert, one bounded pass at a time."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous_full: bool,
        retention: CatalogRetention | None = None,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.retention = retention or CatalogRetention()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL syncs the WAL on every commit; NORMAL only at checkpoints (a power loss may
        # drop the last commits, a process crash never does).
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous_full else 'NORMAL'}")
        self._db.executescript(_SCHEMA)
        (self._terminal,) = self._db.execute(
            f"SELECT COUNT(*) FROM jobs WHERE state IN ({_TERMINAL_MARKS})", _TERMINAL_VALUES
        ).fetchone()
        # What a previous run (or a lower retention) left is caught up with at open.
        while True:
            looked, removed = self._prune(now_ms())
            if looked < PRUNE_BATCH or removed == 0:
                break

    def close(self) -> None:
        """Closes the database."""
        with self._lock:
            self._db.close()

    def insert(self, jobs: Iterable[Job], group: GroupRecord | None = None) -> None:
        """Writes new jobs (and their group) in one transaction, all or nothing, with one
        pruning pass in the same commit."""
        placeholders = ", ".join("?" * 18)
        rows = [_row(job) for job in jobs]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if group is not None:
                    self._db.execute(
                        "INSERT INTO groups VALUES (?, ?, ?, ?)",
                        (group.group_id, group.request_id, group.accepted_ms, group.size),
                    )
                self._db.executemany(f"INSERT INTO jobs ({_COLUMNS}) VALUES ({placeholders})", rows)
                added = sum(1 for row in rows if row[2] in _TERMINAL_VALUES)
                _, removed = self._prune_pass(now_ms(), self._terminal + added)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._terminal += added - removed

    def prune(self, at_ms: int | None = None) -> int:
        """One pruning pass as of `at_ms` (default now); how many jobs it removed."""
        return self._prune(now_ms() if at_ms is None else at_ms)[1]

    def _prune(self, at_ms: int) -> tuple[int, int]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                looked, removed = self._prune_pass(at_ms, self._terminal)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._terminal -= removed
            return looked, removed

    def _prune_pass(self, at_ms: int, terminal: int) -> tuple[int, int]:
        """Deletes the oldest terminal jobs beyond the count and those past the age, never
        one that ended within the grace, and a group's members only all together once all
        are terminal (with the group); (jobs looked at, jobs deleted). Inside a transaction."""
        excess = terminal - self.retention.max_terminal_jobs
        grace_cutoff = at_ms - PRUNE_GRACE_MS
        age_cutoff = at_ms - self.retention.max_age_ms
        cutoff = grace_cutoff if excess > 0 else min(grace_cutoff, age_cutoff)
        rows = self._db.execute(
            f"SELECT seq, group_id, terminal_ms FROM jobs WHERE state IN ({_TERMINAL_MARKS}) "
            "AND terminal_ms < ? ORDER BY terminal_ms, seq LIMIT ?",
            (*_TERMINAL_VALUES, cutoff, PRUNE_BATCH),
        ).fetchall()
        doomed: list[int] = []
        groups: dict[str, None] = {}
        for index, row in enumerate(rows):
            if index >= excess and row["terminal_ms"] >= age_cutoff:
                break
            if row["group_id"] is None:
                doomed.append(row["seq"])
            else:
                groups[row["group_id"]] = None
        gone_groups = []
        for group_id in groups:
            members = self._db.execute(
                "SELECT seq, state, terminal_ms FROM jobs WHERE group_id = ?", (group_id,)
            ).fetchall()
            # A group still waiting for a member (or just finished) keeps all of them.
            if all(
                member["state"] in _TERMINAL_VALUES
                and member["terminal_ms"] is not None
                and member["terminal_ms"] < grace_cutoff
                for member in members
            ):
                doomed.extend(member["seq"] for member in members)
                gone_groups.append(group_id)
        for start in range(0, len(doomed), 500):
            chunk = doomed[start : start + 500]
            self._db.execute(
                f"DELETE FROM jobs WHERE seq IN ({', '.join('?' * len(chunk))})", chunk
            )
        for group_id in gone_groups:
            self._db.execute("DELETE FROM groups WHERE group_id = ?", (group_id,))
        return len(rows), len(doomed)

    def advance(self, capture_id: str, to: JobState, allowed: Collection[JobState]) -> bool:
        """Moves a job to a non-terminal state if it is in one of `allowed`; False if not."""
        with self._lock:
            cursor = self._db.execute(
                f"UPDATE jobs SET state = ? WHERE capture_id = ? AND state IN "
                f"({', '.join('?' * len(allowed))})",
                (to.value, capture_id, *(state.value for state in allowed)),
            )
            return cursor.rowcount == 1

    def finish(self, job: Job) -> bool:
        """Commits a job's terminal state, outcome and result if it is not terminal yet."""
        with self._lock:
            cursor = self._db.execute(
                "UPDATE jobs SET state = ?, terminal_ms = ?, error_code = ?, error_message = ?, "
                f"result = ? WHERE capture_id = ? AND state IN ({', '.join('?' * 5)})",
                (
                    job.state.value,
                    job.terminal_ms,
                    job.error_code,
                    job.error_message,
                    None if job.result is None else _dump(job.result),
                    job.capture_id,
                    *(state.value for state in NON_TERMINAL),
                ),
            )
            finished = cursor.rowcount == 1
            self._terminal += finished
            return finished

    def _select(self, where: str, args: tuple[Any, ...]) -> list[Job]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM jobs WHERE {where} ORDER BY seq", args
            ).fetchall()
        return [_job(row) for row in rows]

    def get(self, capture_id: str) -> Job | None:
        """One job by its captureId."""
        found = self._select("capture_id = ?", (capture_id,))
        return found[0] if found else None

    def by_request(self, camera: str, request_id: str) -> Job | None:
        """The commanded capture a camera accepted for a requestId."""
        found = self._select(
            "camera = ? AND request_id = ? AND group_id IS NULL", (camera, request_id)
        )
        return found[-1] if found else None

    def members(self, group_id: str) -> list[Job]:
        """A group's members, in request order."""
        return self._select("group_id = ?", (group_id,))

    def group(self, group_id: str) -> GroupRecord | None:
        """A group by its captureGroupId."""
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM groups WHERE group_id = ?", (group_id,)
            ).fetchone()
        return None if row is None else GroupRecord(**dict(row))

    def group_by_request(self, request_id: str) -> GroupRecord | None:
        """The group accepted for a requestId."""
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM groups WHERE request_id = ? ORDER BY accepted_ms DESC LIMIT 1",
                (request_id,),
            ).fetchone()
        return None if row is None else GroupRecord(**dict(row))

    def in_states(self, states: Collection[JobState], camera: str | None = None) -> list[Job]:
        """Every job in one of `states` (of one camera, when given), oldest first."""
        marks = ", ".join("?" * len(states))
        where = f"state IN ({marks})"
        args: tuple[Any, ...] = tuple(state.value for state in states)
        if camera is not None:
            where += " AND camera = ?"
            args += (camera,)
        return self._select(where, args)

    def counts(self, camera: str | None = None) -> Mapping[JobState, int]:
        """Non-terminal jobs per state."""
        where = f"state IN ({', '.join('?' * len(NON_TERMINAL))})"
        args: tuple[Any, ...] = tuple(state.value for state in NON_TERMINAL)
        if camera is not None:
            where += " AND camera = ?"
            args += (camera,)
        with self._lock:
            rows = self._db.execute(
                f"SELECT state, COUNT(*) FROM jobs WHERE {where} GROUP BY state", args
            ).fetchall()
        counted = {state: 0 for state in NON_TERMINAL}
        for state, count in rows:
            counted[JobState(state)] = count
        return counted
