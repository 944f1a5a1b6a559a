"""Durable egress progress in SQLite (WAL): files, per-destination deliveries, uploaded parts.

Every state change is committed before it is acted on or announced, so after a crash each
destination resumes where it stopped and nothing verified is sent again."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from unskit.egress.records import (
    DELIVERY_COLUMNS,
    FILE_COLUMNS,
    DeliveryRecord,
    DeliveryState,
    FileRecord,
    FileState,
    Part,
    delivery_record,
    file_record,
)

__all__ = ["DeliveryRecord", "DeliveryState", "EgressState", "FileRecord", "FileState", "Part"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    instance TEXT NOT NULL,
    rel TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    state TEXT NOT NULL,
    discovered_at REAL NOT NULL,
    completed_at REAL
);
CREATE INDEX IF NOT EXISTS files_by_path ON files (instance, rel, state);
CREATE TABLE IF NOT EXISTS deliveries (
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    dest TEXT NOT NULL,
    state TEXT NOT NULL,
    offset INTEGER NOT NULL DEFAULT 0,
    upload_id TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    next_at REAL NOT NULL DEFAULT 0,
    bytes_sent INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (file_id, dest)
);
CREATE TABLE IF NOT EXISTS parts (
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    dest TEXT NOT NULL,
    number INTEGER NOT NULL,
    etag TEXT NOT NULL,
    checksum BLOB NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (file_id, dest, number)
);
"""


class EgressState:
    """The progress store; thread-safe (one connection behind a lock, WAL journal)."""

    def __init__(self, path: Path, *, synchronous_full: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash; FULL also survives power loss.
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous_full else 'NORMAL'}")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Closes the database."""
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _all(self, sql: str, args: Iterable[object] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return list(self._db.execute(sql, tuple(args)).fetchall())

    def _files(self, where: str, args: Iterable[object]) -> list[FileRecord]:
        rows = self._all(f"SELECT {FILE_COLUMNS} FROM files WHERE {where}", args)
        return [file_record(row) for row in rows]

    def _deliveries(self, where: str, args: Iterable[object]) -> list[DeliveryRecord]:
        rows = self._all(f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE {where}", args)
        return [delivery_record(row) for row in rows]

    # -- files --------------------------------------------------------------------------

    def active_files(self, instance: str) -> list[FileRecord]:
        """Files not yet completed, oldest first."""
        return self._files("instance = ? AND state = 'active' ORDER BY id", (instance,))

    def find_active(self, instance: str, rel: str) -> FileRecord | None:
        """The active record of a source path, if any."""
        found = self._files("instance = ? AND rel = ? AND state = 'active'", (instance, rel))
        return found[0] if found else None

    def files_by_rel(self, instance: str, rels: Iterable[str]) -> list[FileRecord]:
        """The newest record of each of these relative paths (any state)."""
        found: list[FileRecord] = []
        for rel in rels:
            found.extend(
                self._files("instance = ? AND rel = ? ORDER BY id DESC LIMIT 1", (instance, rel))
            )
        return found

    def file(self, file_id: int) -> FileRecord | None:
        """A file record by id."""
        found = self._files("id = ?", (file_id,))
        return found[0] if found else None

    def add_file(
        self, instance: str, rel: str, size: int, mtime_ns: int, destinations: Iterable[str]
    ) -> int:
        """Queues a settled source file with one pending delivery per destination."""
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO files (instance, rel, size, mtime_ns, state, discovered_at) "
                "VALUES (?, ?, ?, ?, 'active', ?)",
                (instance, rel, size, mtime_ns, time.time()),
            )
            file_id = int(cursor.lastrowid or 0)
            db.executemany(
                "INSERT INTO deliveries (file_id, dest, state) VALUES (?, ?, 'pending')",
                [(file_id, dest) for dest in destinations],
            )
        return file_id

    def ensure_destinations(self, file_id: int, destinations: Iterable[str]) -> None:
        """Adds a pending delivery for each destination a file has none for (one added
        to the configuration since the file was queued)."""
        with self._tx() as db:
            db.executemany(
                "INSERT OR IGNORE INTO deliveries (file_id, dest, state) VALUES (?, ?, 'pending')",
                [(file_id, dest) for dest in destinations],
            )

    def restart_file(
        self, file_id: int, size: int, mtime_ns: int, not_before: float = 0.0
    ) -> list[DeliveryRecord]:
        """The source changed: every delivery starts over. Returns the deliveries as they
        were, so their partial remote state can be discarded."""
        with self._tx() as db:
            before = [
                delivery_record(row)
                for row in db.execute(
                    f"SELECT {DELIVERY_COLUMNS} FROM deliveries WHERE file_id = ?", (file_id,)
                )
            ]
            db.execute(
                "UPDATE files SET size = ?, mtime_ns = ? WHERE id = ?", (size, mtime_ns, file_id)
            )
            db.execute(
                "UPDATE deliveries SET state = 'pending', offset = 0, upload_id = NULL, "
                "next_at = ?, last_error = NULL WHERE file_id = ?",
                (not_before, file_id),
            )
            db.execute("DELETE FROM parts WHERE file_id = ?", (file_id,))
        return before

    def finish_file(self, file_id: int, state: FileState) -> None:
        """Marks a file completed (delivered everywhere, then deleted or archived) or vanished."""
        with self._tx() as db:
            db.execute(
                "UPDATE files SET state = ?, completed_at = ? WHERE id = ?",
                (state.value, time.time(), file_id),
            )
            db.execute("DELETE FROM parts WHERE file_id = ?", (file_id,))

    def prune(self, older_than_s: float) -> int:
        """Forgets finished file records older than this; returns how many."""
        with self._tx() as db:
            cursor = db.execute(
                "DELETE FROM files WHERE state != 'active' AND completed_at < ?",
                (time.time() - older_than_s,),
            )
            return int(cursor.rowcount)

    def counts(self, instance: str) -> dict[str, int]:
        """Files by state for an instance."""
        rows = self._all(
            "SELECT state, COUNT(*) FROM files WHERE instance = ? GROUP BY state", (instance,)
        )
        return {str(state): int(count) for state, count in rows}  # type: ignore[call-overload]

    # -- deliveries -----------------------------------------------------------------------

    def deliveries(self, file_id: int) -> list[DeliveryRecord]:
        """Every delivery of one file."""
        return self._deliveries("file_id = ? ORDER BY dest", (file_id,))

    def delivery(self, file_id: int, dest: str) -> DeliveryRecord | None:
        """One delivery."""
        found = self._deliveries("file_id = ? AND dest = ?", (file_id, dest))
        return found[0] if found else None

    def next_due(
        self, instance: str, dest: str, now: float, exclude: Collection[int] = ()
    ) -> tuple[tuple[FileRecord, DeliveryRecord] | None, float | None]:
        """The oldest file due for this destination (other than the `exclude` file ids, in
        flight already), else when the next one falls due."""
        columns = ", ".join(f"f.{c.strip()}" for c in FILE_COLUMNS.split(","))
        delivery_columns = ", ".join(f"d.{c.strip()}" for c in DELIVERY_COLUMNS.split(","))
        where = (
            "FROM files f JOIN deliveries d ON d.file_id = f.id WHERE f.instance = ? "
            "AND f.state = 'active' AND d.dest = ? AND d.state = 'pending'"
        )
        excluded = tuple(exclude)
        if excluded:
            where += f" AND f.id NOT IN ({', '.join('?' * len(excluded))})"
        rows = self._all(
            f"SELECT {columns}, {delivery_columns} {where} AND d.next_at <= ? "
            "ORDER BY f.id LIMIT 1",
            (instance, dest, *excluded, now),
        )
        if rows:
            return (file_record(rows[0][:7]), delivery_record(rows[0][7:])), None
        later = self._all(f"SELECT MIN(d.next_at) {where}", (instance, dest, *excluded))
        value = later[0][0] if later else None
        return None, None if value is None else float(value)  # type: ignore[arg-type]

    def save_offset(self, file_id: int, dest: str, offset: int, sent: int) -> None:
        """Records how far a streamed transfer got (bytes durably at the destination)."""
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET offset = ?, bytes_sent = ? WHERE file_id = ? AND dest = ?",
                (offset, sent, file_id, dest),
            )

    def save_upload(self, file_id: int, dest: str, upload_id: str | None) -> None:
        """Records (or clears) the multipart upload a delivery resumes into."""
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET upload_id = ? WHERE file_id = ? AND dest = ?",
                (upload_id, file_id, dest),
            )
            if upload_id is None:
                db.execute("DELETE FROM parts WHERE file_id = ? AND dest = ?", (file_id, dest))

    def save_part(self, file_id: int, dest: str, part: Part, sent: int) -> None:
        """Records one uploaded part."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO parts (file_id, dest, number, etag, checksum, size) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (file_id, dest, part.number, part.etag, part.checksum, part.size),
            )
            db.execute(
                "UPDATE deliveries SET bytes_sent = ? WHERE file_id = ? AND dest = ?",
                (sent, file_id, dest),
            )

    def forget_part(self, file_id: int, dest: str, number: int) -> None:
        """Drops one part record (it is not at the destination as recorded)."""
        with self._tx() as db:
            db.execute(
                "DELETE FROM parts WHERE file_id = ? AND dest = ? AND number = ?",
                (file_id, dest, number),
            )

    def parts(self, file_id: int, dest: str) -> dict[int, Part]:
        """The recorded parts of a delivery by part number."""
        rows = self._all(
            "SELECT number, etag, checksum, size FROM parts WHERE file_id = ? AND dest = ?",
            (file_id, dest),
        )
        return {
            int(n): Part(int(n), str(e), bytes(c), int(s))  # type: ignore[call-overload]
            for n, e, c, s in rows
        }

    def reset_delivery(self, file_id: int, dest: str) -> None:
        """Starts one delivery over from nothing (a failed verification)."""
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET offset = 0, upload_id = NULL WHERE file_id = ? AND dest = ?",
                (file_id, dest),
            )
            db.execute("DELETE FROM parts WHERE file_id = ? AND dest = ?", (file_id, dest))

    def mark_verified(self, file_id: int, dest: str) -> None:
        """The destination holds a verified copy."""
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET state = 'verified', last_error = NULL "
                "WHERE file_id = ? AND dest = ?",
                (file_id, dest),
            )
            db.execute("DELETE FROM parts WHERE file_id = ? AND dest = ?", (file_id, dest))

    def mark_failed_attempt(
        self, file_id: int, dest: str, error: str, next_at: float, *, permanent: bool
    ) -> int:
        """Counts a failed attempt; returns the attempt count."""
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET attempts = attempts + 1, last_error = ?, next_at = ?, "
                "state = ? WHERE file_id = ? AND dest = ?",
                (error, next_at, "failed" if permanent else "pending", file_id, dest),
            )
            row = db.execute(
                "SELECT attempts FROM deliveries WHERE file_id = ? AND dest = ?", (file_id, dest)
            ).fetchone()
        return int(row[0]) if row else 0

    def retry_failed(self, instance: str, rel: str | None = None) -> list[str]:
        """Puts permanently failed deliveries back in the queue; returns their file paths."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT f.id, f.rel FROM files f JOIN deliveries d ON d.file_id = f.id "
                "WHERE f.instance = ? AND f.state = 'active' AND d.state = 'failed'"
                + (" AND f.rel = ?" if rel is not None else ""),
                (instance, rel) if rel is not None else (instance,),
            ).fetchall()
            ids = sorted({int(row[0]) for row in rows})
            db.executemany(
                "UPDATE deliveries SET state = 'pending', attempts = 0, next_at = 0 "
                "WHERE file_id = ? AND state = 'failed'",
                [(i,) for i in ids],
            )
        return sorted({str(row[1]) for row in rows})
