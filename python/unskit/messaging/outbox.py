"""Store-and-forward for the northbound link: a durable outbox and the thread replaying it.

`Outbox` keeps every northbound publish in SQLite (WAL) until the broker acknowledged it:
an append is committed before `publish_northbound` returns, so a SIGKILL loses nothing that
was published (synchronous=NORMAL; FULL, with commands.durableSync, survives a power cut).
It is bounded by bytes and age; what the bound removes or refuses is counted.

`Forwarder` is the single thread sending the outbox while the link is up, in two lanes: the
backlog (what was stored while the link was down, or before this start) is replayed in
sequence order at most `replay_messages_per_second`; live publishes (stored after the link came
up) go out beside it at once, in sequence order. At most `max_in_flight` are unacknowledged;
an entry is deleted when paho reports its PUBACK (QoS 1), PUBCOMP (QoS 2) or, for QoS 0, once
paho took it. Entries not acknowledged before a restart are sent again: QoS 1's documented
duplicates.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from unskit.config.messaging import OverflowPolicy, StoreAndForwardConfig
from unskit.errors import MessagingError, PublishError
from unskit.messaging.transport import QoS

__all__ = ["AckingTransport", "Forwarder", "Outbox", "OutboxStatus"]

_log = logging.getLogger(__name__)

# Rows read per query and deleted per statement (SQLite's default bound on host parameters
# is 32,766; a smaller batch keeps each statement short).
BATCH = 500
# How often expiry runs while the forwarder has nothing else to do.
EXPIRY_INTERVAL_S = 1.0
# Pace burst: at most this many seconds' worth of messages go out back to back.
PACE_BURST_S = 0.05
LOG_EVERY = 1_000
LINK_DOWN_WAIT_S = 0.1
# After an unexpected error in the replay loop, before trying again.
ERROR_WAIT_S = 1.0
MAX_PAYLOAD_BYTES = 268_435_455

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


class AckingTransport(Protocol):
    """What the forwarder needs from the link: tracked publishes and their acknowledgements."""

    def is_connected(self) -> bool:
        """Whether the link is up now."""
        ...

    def publish_tracked(self, topic: str, payload: bytes, qos: QoS) -> int | None:
        """Sends (or, QoS 1/2, queues) one publish and returns its packet id; None when a
        QoS 0 publish was dropped because the link is down."""
        ...

    def on_acknowledged(self, callback: Callable[[int], None] | None) -> None:
        """Calls `callback(packet_id)` from the network thread when a QoS 1/2 publish is
        acknowledged (and when a QoS 0 one was written)."""
        ...


class Forwarder:
    """The replay thread: while the link is up, sends live publishes at once and the backlog
    at the pace beside them, each lane in order, within the in-flight window, and deletes
    what the broker acknowledged."""

    def __init__(self, outbox: Outbox, transport: AckingTransport) -> None:
        self.outbox = outbox
        self._transport = transport
        config = outbox.config
        self._window = config.max_in_flight
        self._pace = config.replay_messages_per_second
        self._cond = threading.Condition()
        # packet id -> (seq, link epoch it was sent in)
        self._in_flight: dict[int, tuple[int, int]] = {}
        # Acknowledgements that arrived before publish_tracked returned their packet id.
        self._early: set[int] = set()
        # QoS 0 packet ids already settled, whose write callback is still to come.
        self._settled_qos0: set[int] = set()
        self._acked: list[int] = []
        # Two lanes, so live data never waits behind a backlog (docs/decisions.md). The
        # backlog: ranges [after, through] of sequence numbers still to send, in order,
        # `after` moving up as entries go out. Live: every entry above `_live`, the last
        # live seq handed to the link. Only the replay thread changes either.
        self._backlog: deque[list[int]] = deque()
        self._live = 0
        # The newest seq when the link last came up (or at start): what is stored up to it
        # and not yet sent joins the backlog, applied by the replay thread.
        self._rebase: int | None = outbox.last_seq
        self._epoch = 0
        # In-flight entries sent before the last reconnect: paho sends them again first, and
        # nothing newer goes out until they are acknowledged, so order holds across a flap.
        self._stale = 0
        self._connected = transport.is_connected()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.sent = 0

    def start(self) -> Forwarder:
        """Hooks the acknowledgements and starts the replay thread."""
        self._transport.on_acknowledged(self._on_ack)
        self._thread = threading.Thread(
            target=self._run, name="unskit-outbox-forwarder", daemon=True
        )
        self._thread.start()
        return self

    def publish(self, topic: str, payload: bytes, qos: QoS) -> None:
        """Stores the publish (durably, before returning) and wakes the replay thread;
        raises ValueError, as paho would, for a topic no broker accepts."""
        # Checked here: once stored, an entry paho refuses could only be dropped.
        if not topic or "+" in topic or "#" in topic or "\0" in topic:
            raise ValueError(f"publish topic {topic!r} is empty or has a wildcard or NUL")
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise ValueError(f"payload of {len(payload)} bytes is over MQTT's limit")
        self.outbox.append(topic, payload, qos)
        with self._cond:
            self._cond.notify()

    def link_changed(self, up: bool) -> None:
        """The link went up or down (from the transport's thread)."""
        with self._cond:
            self._connected = up
            if up:
                self._epoch += 1
                self._stale = len(self._in_flight)
                # Stored while the link was down: the backlog. Published from now on: live.
                self._rebase = self.outbox.last_seq
            self._cond.notify()

    def in_flight(self) -> int:
        """Entries sent and not yet acknowledged."""
        with self._cond:
            return len(self._in_flight)

    # -- network thread -----------------------------------------------------------------

    def _on_ack(self, packet_id: int) -> None:
        with self._cond:
            entry = self._in_flight.pop(packet_id, None)
            if entry is None:
                if packet_id in self._settled_qos0:
                    self._settled_qos0.discard(packet_id)
                else:
                    self._early.add(packet_id)
                return
            self._settle_locked(entry)

    def _settle_locked(self, entry: tuple[int, int]) -> None:
        seq, epoch = entry
        self._acked.append(seq)
        if epoch < self._epoch and self._stale:
            self._stale -= 1
        self._cond.notify()

    # -- replay thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self._replay()
                return
            except Exception:  # the replay must outlive a failed query or a bug
                _log.exception("messaging northbound: outbox replay failed; resuming")
            with self._cond:
                if self._stop:
                    return
                self._cond.wait(ERROR_WAIT_S)
                if self._stop:
                    return

    def _replay(self) -> None:
        pace = self._pace
        cap = max(1.0, pace * PACE_BURST_S)
        tokens = cap
        refilled = time.monotonic()
        next_expiry = 0.0
        while True:
            now = time.monotonic()
            if now >= next_expiry:
                next_expiry = now + EXPIRY_INTERVAL_S
                try:
                    self.outbox.expire()
                except sqlite3.Error:
                    _log.exception("messaging northbound: outbox expiry failed")
            if pace:
                tokens = min(cap, tokens + (now - refilled) * pace)
                refilled = now
            with self._cond:
                acked, self._acked = self._acked, []
                if not acked:
                    if self._stop:
                        return
                    self._rebase_locked()
                    free = self._free_locked()
                    live = free > 0 and self.outbox.last_seq > self._live
                    replay = free > 0 and bool(self._backlog) and (not pace or tokens >= 1)
                    if not live and not replay:
                        wait = next_expiry - now
                        if free and self._backlog:  # the backlog waits for the pace
                            wait = min(wait, (1 - tokens) / pace)
                        # A live publish, an acknowledgement or a link change wakes it.
                        self._cond.wait(max(0.0, wait))
                        continue
            if acked:
                self._delete(acked)
                continue
            blocked = False
            if live:  # first: a live publish never waits for the backlog's pace
                sent, blocked = self._send_live(free)
                free -= sent
            if replay and free > 0 and not blocked:
                sent, blocked = self._send_backlog(min(free, int(tokens)) if pace else free)
                tokens -= sent
            if blocked:
                # paho dropped a QoS 0 publish or refused one: the link is going down (its
                # callback is on the way) or paho's queue is full; wait rather than spin.
                with self._cond:
                    if self._connected and not self._stop:
                        self._cond.wait(LINK_DOWN_WAIT_S)

    def _rebase_locked(self) -> None:
        newest, self._rebase = self._rebase, None
        if newest is None or newest <= self._live:
            return
        backlog = self._backlog
        if backlog and backlog[-1][1] == self._live:
            backlog[-1][1] = newest
        else:
            backlog.append([self._live, newest])
        self._live = newest

    def _free_locked(self) -> int:
        if self._stop or not self._connected or self._stale:
            return 0
        return max(0, self._window - len(self._in_flight))

    def _send_live(self, limit: int) -> tuple[int, bool]:
        newest = self.outbox.last_seq
        rows = self.outbox.read(self._live, min(limit, BATCH))
        if not rows:
            # Everything after the cursor was dropped or expired before it was sent.
            self._live = max(self._live, newest)
            return 0, False
        return self._send(rows, backlog=False)

    def _send_backlog(self, limit: int) -> tuple[int, bool]:
        after, through = self._backlog[0]
        rows = self.outbox.read(after, min(limit, BATCH), through)
        if not rows:  # the rest of this range was dropped or expired before it was sent
            self._backlog.popleft()
            return 0, False
        return self._send(rows, backlog=True)

    def _advance(self, seq: int, backlog: bool) -> None:
        if not backlog:
            self._live = seq
            return
        span = self._backlog[0]
        span[0] = seq
        if seq >= span[1]:
            self._backlog.popleft()

    def _send(self, rows: list[tuple[int, str, bytes, int]], backlog: bool) -> tuple[int, bool]:
        sent = 0
        blocked = False
        for seq, topic, payload, qos in rows:
            try:
                packet_id = self._transport.publish_tracked(topic, payload, QoS(qos))
            except ValueError as error:
                # A topic or payload paho refuses (stored by an older version): it can never
                # be sent, so it is dropped, counted, rather than block the rest.
                _log.error(
                    "messaging northbound: outbox entry %d to %r dropped: %s", seq, topic, error
                )
                self.outbox.delete([seq], dropped=True)
                self._advance(seq, backlog)
                continue
            except MessagingError as error:
                # Refused for now (paho's queue, a closing transport): sent again later.
                _log.warning("messaging northbound: outbox entry %d not sent yet: %s", seq, error)
                blocked = True
                break
            if packet_id is None:  # QoS 0 while the link went down: try again once it is up
                blocked = True
                break
            with self._cond:
                self._advance(seq, backlog)
                if qos == QoS.AT_MOST_ONCE:
                    if packet_id in self._early:
                        self._early.discard(packet_id)
                    else:
                        self._settled_qos0.add(packet_id)
                    self._acked.append(seq)
                elif packet_id in self._early:
                    self._early.discard(packet_id)
                    self._acked.append(seq)
                else:
                    self._in_flight[packet_id] = (seq, self._epoch)
            sent += 1
        self.sent += sent
        return sent, blocked

    def _delete(self, seqs: list[int]) -> None:
        try:
            self.outbox.delete(seqs)
        except sqlite3.Error:
            # Left stored: sent again after a restart (a duplicate, never a loss).
            _log.exception("messaging northbound: deleting %d delivered entries failed", len(seqs))

    def close(self, timeout: float) -> None:
        """Stops the replay thread; entries not acknowledged stay stored."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def flush_acknowledged(self) -> None:
        """Deletes what was acknowledged since the thread stopped (call before closing the
        outbox, after the transport closed)."""
        if self._thread is not None:
            self._transport.on_acknowledged(None)
        with self._cond:
            acked, self._acked = self._acked, []
        if acked:
            self._delete(acked)
