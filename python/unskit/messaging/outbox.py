"""Store-and-forward for the northbound link: a durable outbox and the thread replaying it.

`Outbox` (in `outbox_store.py`, re-exported here) keeps every northbound publish in SQLite
(WAL) until the broker acknowledged it: an append is committed before `publish_northbound`
returns, so a SIGKILL loses nothing that was published (synchronous=NORMAL; FULL, with
commands.durableSync, survives a power cut). It is bounded by bytes and age; what the bound
removes or refuses is counted.

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
from collections.abc import Callable
from typing import Protocol

from unskit.errors import MessagingError
from unskit.messaging.outbox_store import BATCH, Outbox, OutboxStatus
from unskit.messaging.outbox_store import LOG_EVERY as LOG_EVERY
from unskit.messaging.transport import QoS

__all__ = ["AckingTransport", "Forwarder", "Outbox", "OutboxStatus"]

_log = logging.getLogger(__name__)

# How often expiry runs while the forwarder has nothing else to do.
EXPIRY_INTERVAL_S = 1.0
# Pace burst: at most this many seconds' worth of messages go out back to back.
PACE_BURST_S = 0.05
LINK_DOWN_WAIT_S = 0.1
# After an unexpected error in the replay loop, before trying again.
ERROR_WAIT_S = 1.0
MAX_PAYLOAD_BYTES = 268_435_455


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
