"""The northbound outbox's SQLite store: `Outbox` appends every northbound publish durably
(WAL, one INSERT per publish), reads the entries in sequence order and deletes the delivered
ones, bounded by bytes (dropOldest or refuseNewest) and by age; `OutboxStatus` is its depth
and what its bounds removed. The replay thread that sends it, `Forwarder`, is in `outbox.py`."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from unskit.config.messaging import OverflowPolicy, StoreAndForwardConfig
from unskit.errors import MessagingError, PublishError
from unskit.messaging.transport import QoS

__all__ = ["Outbox", "OutboxStatus"]

# The logger keeps the name it had before this module was split out of outbox.py.
_log = logging.getLogger("unskit.messaging.outbox")

# Rows read per query and deleted per statement (SQLite's default bound on host parameters
# is 32,766; a smaller batch keeps each statement short).
BATCH = 500
LOG_EVERY = 1_000

_INSERT = "INSERT INTO outbox (topic, payload, qos, enqueued_ms, size) VALUES (?, ?, ?, ?, ?)"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    size INTEGER NOT NULL
)
"""


@dataclass(frozen=True)
class OutboxStatus:
    """The outbox's depth and what its bounds removed, since this process opened it."""

    entries: int
    bytes: int
    #: Age of the oldest stored entry in seconds (0 when empty).
    oldest_age_s: float
    #: Removed to make room (dropOldest).
    dropped: int
    #: Publishes refused because the outbox was full (refuseNewest, or larger than maxBytes).
    refused: int
    #: Removed for being older than maxAgeSeconds.
    expired: int
    #: Entries acknowledged by the broker (or, QoS 0, handed to the link) and deleted.
    delivered: int
    max_bytes: int

    @property
    def lost(self) -> int:
        """Dropped, refused and expired together."""
        return self.dropped + self.refused + self.expired


class Outbox:
    """The SQLite store: append, read in order, delete; bounded by bytes and age."""

    def __init__(
        self, config: StoreAndForwardConfig, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        path = config.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as error:
            raise MessagingError(
                f"messaging.northbound.storeAndForward: cannot open {str(path)!r}: {error}"
            ) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            sync = "FULL" if config.synchronous_full else "NORMAL"
            self._db.execute(f"PRAGMA synchronous={sync}")
            self._db.execute(_SCHEMA)
            count, total, oldest = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0), MIN(enqueued_ms) FROM outbox"
            ).fetchone()
        except sqlite3.Error as error:
            self._db.close()
            raise MessagingError(
                f"messaging.northbound.storeAndForward: {str(path)!r} is not a usable outbox: "
                f"{error}"
            ) from None
        self._entries: int = count
        self._bytes: int = total
        self._oldest_ms: int | None = oldest
        self._last_seq = self._max_seq()
        self._dropped = self._refused = self._expired = self._delivered = 0
        self._closed = False
        if count:
            _log.info(
                "messaging northbound: outbox %s holds %d messages (%d bytes) from before",
                path,
                count,
                total,
            )

    def _max_seq(self) -> int:
        row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM outbox").fetchone()
        return int(row[0])

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest entry ever appended (0 when none)."""
        return self._last_seq

    def append(self, topic: str, payload: bytes, qos: QoS) -> int:
        """Stores one publish durably and returns its sequence number; raises PublishError
        when the outbox is full and refuses (refuseNewest, or an entry above maxBytes)."""
        size = len(payload) + len(topic.encode())
        max_bytes = self.config.max_bytes
        with self._lock:
            self._require_open()
            if size > max_bytes or (
                self._bytes + size > max_bytes
                and self.config.overflow is OverflowPolicy.REFUSE_NEWEST
            ):
                self._refused += 1
                refused = self._refused
                if refused == 1 or refused % LOG_EVERY == 0:
                    _log.warning(
                        "messaging northbound: outbox full (%d of %d bytes); %d publishes "
                        "refused so far",
                        self._bytes,
                        max_bytes,
                        refused,
                    )
                raise PublishError(
                    f"messaging northbound: the outbox is full ({self._bytes} of {max_bytes} "
                    f"bytes, overflow {self.config.overflow.value}); {topic!r} was not stored"
                )
            now_ms = int(self._clock() * 1000)
            row = (topic, payload, int(qos), now_ms, size)
            if self._bytes + size <= max_bytes:
                # One statement, one transaction: committed (in the WAL) when it returns.
                seq = self._db.execute(_INSERT, row).lastrowid
            else:
                seq = self._drop_and_insert_locked(self._bytes + size - max_bytes, row)
            assert seq is not None
            self._entries += 1
            self._bytes += size
            if self._oldest_ms is None:
                self._oldest_ms = now_ms
            self._last_seq = seq
            return seq

    def _drop_and_insert_locked(
        self, needed: int, row: tuple[str, bytes, int, int, int]
    ) -> int | None:
        db = self._db
        freed = dropped = 0
        db.execute("BEGIN IMMEDIATE")
        try:
            while freed < needed:
                oldest = db.execute(
                    "SELECT seq, size FROM outbox ORDER BY seq LIMIT ?", (BATCH,)
                ).fetchall()
                if not oldest:
                    break
                last = oldest[-1][0]
                for seq, size in oldest:
                    freed += size
                    dropped += 1
                    if freed >= needed:
                        last = seq
                        break
                db.execute("DELETE FROM outbox WHERE seq <= ?", (last,))
            seq = db.execute(_INSERT, row).lastrowid
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        before = self._dropped
        self._entries -= dropped
        self._bytes -= freed
        self._dropped += dropped
        self._oldest_ms = self._oldest_locked()
        if before == 0 or before // LOG_EVERY != self._dropped // LOG_EVERY:
            _log.warning(
                "messaging northbound: outbox full (%d bytes); dropped the oldest, %d so far",
                self.config.max_bytes,
                self._dropped,
            )
        return seq

    def _oldest_locked(self) -> int | None:
        row = self._db.execute("SELECT enqueued_ms FROM outbox ORDER BY seq LIMIT 1").fetchone()
        return None if row is None else int(row[0])

    def read(
        self, after: int, limit: int, through: int | None = None
    ) -> list[tuple[int, str, bytes, int]]:
        """Up to `limit` entries with a sequence number above `after` (and at most `through`),
        in order."""
        with self._lock:
            self._require_open()
            return self._db.execute(
                "SELECT seq, topic, payload, qos FROM outbox WHERE seq > ? AND seq <= ? "
                "ORDER BY seq LIMIT ?",
                (after, self._last_seq if through is None else through, limit),
            ).fetchall()

    def delete(self, seqs: Iterable[int], *, dropped: bool = False) -> int:
        """Deletes delivered entries, or with `dropped` ones that cannot be sent (ones
        already gone are skipped); returns how many."""
        seqs = list(seqs)
        deleted = 0
        with self._lock:
            if self._closed:
                return 0
            for start in range(0, len(seqs), BATCH):
                chunk = seqs[start : start + BATCH]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"DELETE FROM outbox WHERE seq IN ({marks}) RETURNING size", chunk
                ).fetchall()
                deleted += len(rows)
                self._entries -= len(rows)
                self._bytes -= sum(r[0] for r in rows)
            if dropped:
                self._dropped += deleted
            else:
                self._delivered += deleted
            if deleted:
                self._oldest_ms = self._oldest_locked()
        return deleted

    def expire(self) -> int:
        """Deletes entries older than maxAgeSeconds (a prefix in sequence order); returns
        how many."""
        max_age = self.config.max_age_seconds
        if max_age <= 0:
            return 0
        cutoff = int((self._clock() - max_age) * 1000)
        with self._lock:
            if self._closed or self._oldest_ms is None or self._oldest_ms >= cutoff:
                return 0
            # Sequence order is enqueue order; a clock stepping back only delays expiry.
            rows = self._db.execute(
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE seq <= "
                "(SELECT COALESCE(MAX(seq), 0) FROM outbox WHERE enqueued_ms < ?)) "
                "RETURNING size",
                (cutoff,),
            ).fetchall()
            expired = len(rows)
            self._entries -= expired
            self._bytes -= sum(r[0] for r in rows)
            self._expired += expired
            self._oldest_ms = self._oldest_locked()
        if expired:
            _log.warning(
                "messaging northbound: %d outbox entries older than %g s expired (%d so far)",
                expired,
                max_age,
                self._expired,
            )
        return expired

    def status(self) -> OutboxStatus:
        """Depth and counters, for metrics and the overflow alarm."""
        with self._lock:
            oldest = self._oldest_ms
            age = 0.0 if oldest is None else max(0.0, self._clock() - oldest / 1000)
            return OutboxStatus(
                entries=self._entries,
                bytes=self._bytes,
                oldest_age_s=age,
                dropped=self._dropped,
                refused=self._refused,
                expired=self._expired,
                delivered=self._delivered,
                max_bytes=self.config.max_bytes,
            )

    def close(self) -> None:
        """Closes the database; what is stored stays for the next start."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def _require_open(self) -> None:
        if self._closed:
            raise PublishError("messaging northbound: the outbox is closed")
