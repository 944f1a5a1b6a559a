"""The northbound outbox's store on its own (no broker): durable appends in order, bounds by
bytes (dropOldest, refuseNewest) and age, deletes, and what a reopen finds; and the
forwarder's two lanes against an in-memory acknowledging link."""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from unskit.config.messaging import OverflowPolicy, StoreAndForwardConfig
from unskit.errors import MessagingError, PublishError
from unskit.messaging import QoS
from unskit.messaging.outbox import Forwarder, Outbox

TOPIC = "t/x"
ENTRY = len(TOPIC) + 100  # bytes one 100-byte payload counts


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, clock: Clock | None = None, **options: object) -> Outbox:
    config = StoreAndForwardConfig(path=tmp_path / "state" / "outbox.sqlite3", **options)  # type: ignore[arg-type]
    return Outbox(config, clock=clock or Clock())


def payload(i: int) -> bytes:
    return f"{i:04d}".encode().ljust(100, b".")


def test_appends_are_read_back_in_order_and_deleted(tmp_path: Path) -> None:
    outbox = make(tmp_path)
    seqs = [outbox.append(TOPIC, payload(i), QoS.AT_LEAST_ONCE) for i in range(10)]
    assert seqs == sorted(seqs)
    rows = outbox.read(0, 100)
    assert [r[2] for r in rows] == [payload(i) for i in range(10)]
    assert [r[3] for r in rows] == [1] * 10
    assert [r[0] for r in outbox.read(seqs[4], 3)] == seqs[5:8]
    assert outbox.delete([*seqs[:4], 999_999]) == 4
    status = outbox.status()
    assert (status.entries, status.bytes, status.delivered) == (6, 6 * ENTRY, 4)
    outbox.close()


def test_a_reopened_outbox_keeps_its_entries_and_never_reuses_a_sequence(tmp_path: Path) -> None:
    outbox = make(tmp_path)
    first = [outbox.append(TOPIC, payload(i), QoS.AT_LEAST_ONCE) for i in range(3)]
    outbox.close()
    again = make(tmp_path)
    assert again.status().entries == 3
    assert [r[0] for r in again.read(0, 10)] == first
    again.delete(first)
    # Emptied, a new entry still sorts after every sequence handed out before.
    assert again.append(TOPIC, payload(9), QoS.AT_LEAST_ONCE) > first[-1]
    again.close()


def test_the_database_is_in_wal_mode(tmp_path: Path) -> None:
    outbox = make(tmp_path)
    outbox.append(TOPIC, payload(0), QoS.AT_LEAST_ONCE)
    with sqlite3.connect(tmp_path / "state" / "outbox.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # Committed before append returned: another connection sees it.
        assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 1
    outbox.close()


def test_drop_oldest_makes_room_and_counts(tmp_path: Path) -> None:
    outbox = make(tmp_path, max_bytes=10 * ENTRY)
    for i in range(14):
        outbox.append(TOPIC, payload(i), QoS.AT_LEAST_ONCE)
    status = outbox.status()
    assert (status.entries, status.bytes, status.dropped, status.refused) == (10, 10 * ENTRY, 4, 0)
    assert [r[2] for r in outbox.read(0, 100)] == [payload(i) for i in range(4, 14)]
    outbox.close()


def test_refuse_newest_raises_and_counts(tmp_path: Path) -> None:
    outbox = make(tmp_path, max_bytes=10 * ENTRY, overflow=OverflowPolicy.REFUSE_NEWEST)
    for i in range(10):
        outbox.append(TOPIC, payload(i), QoS.AT_LEAST_ONCE)
    for i in range(3):
        with pytest.raises(PublishError, match="outbox is full"):
            outbox.append(TOPIC, payload(10 + i), QoS.AT_LEAST_ONCE)
    status = outbox.status()
    assert (status.entries, status.dropped, status.refused) == (10, 0, 3)
    assert [r[2] for r in outbox.read(0, 100)] == [payload(i) for i in range(10)]
    outbox.delete([r[0] for r in outbox.read(0, 1)])
    outbox.append(TOPIC, payload(99), QoS.AT_LEAST_ONCE)  # room again
    outbox.close()


def test_an_entry_larger_than_the_bound_is_refused_under_either_policy(tmp_path: Path) -> None:
    outbox = make(tmp_path, max_bytes=2 * ENTRY)
    outbox.append(TOPIC, payload(0), QoS.AT_LEAST_ONCE)
    with pytest.raises(PublishError):
        outbox.append(TOPIC, b"x" * (3 * ENTRY), QoS.AT_LEAST_ONCE)
    status = outbox.status()
    assert (status.entries, status.dropped, status.refused) == (1, 0, 1)
    outbox.close()


def test_entries_older_than_max_age_expire(tmp_path: Path) -> None:
    clock = Clock()
    outbox = make(tmp_path, clock, max_age_seconds=60)
    for i in range(3):
        outbox.append(TOPIC, payload(i), QoS.AT_LEAST_ONCE)
    clock.now += 30
    for i in range(3, 5):
        outbox.append(TOPIC, payload(i), QoS.AT_MOST_ONCE)
    assert outbox.expire() == 0
    assert outbox.status().oldest_age_s == pytest.approx(30)
    clock.now += 31  # the first three are 61 s old, the last two 31 s
    assert outbox.expire() == 3
    status = outbox.status()
    assert (status.entries, status.expired, status.bytes) == (2, 3, 2 * ENTRY)
    assert status.oldest_age_s == pytest.approx(31)
    assert [r[2] for r in outbox.read(0, 10)] == [payload(3), payload(4)]
    outbox.close()


def test_max_age_zero_keeps_entries(tmp_path: Path) -> None:
    clock = Clock()
    outbox = make(tmp_path, clock, max_age_seconds=0)
    outbox.append(TOPIC, payload(0), QoS.AT_LEAST_ONCE)
    clock.now += 10 * 365 * 86400
    assert outbox.expire() == 0
    assert outbox.status().entries == 1
    outbox.close()


def test_a_closed_outbox_refuses_appends(tmp_path: Path) -> None:
    outbox = make(tmp_path)
    outbox.close()
    with pytest.raises(PublishError, match="closed"):
        outbox.append(TOPIC, payload(0), QoS.AT_LEAST_ONCE)
    assert outbox.delete([1]) == 0


def test_a_file_that_is_no_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state" / "outbox.sqlite3"
    path.parent.mkdir()
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(MessagingError, match=r"storeAndForward.*not a usable outbox"):
        Outbox(StoreAndForwardConfig(path=path))


def test_an_entry_that_cannot_be_sent_is_counted_as_dropped(tmp_path: Path) -> None:
    outbox = make(tmp_path)
    seq = outbox.append(TOPIC, payload(0), QoS.AT_LEAST_ONCE)
    assert outbox.delete([seq], dropped=True) == 1
    status = outbox.status()
    assert (status.entries, status.dropped, status.delivered) == (0, 1, 0)
    outbox.close()


def test_read_stops_at_through(tmp_path: Path) -> None:
    outbox = make(tmp_path)
    seqs = [outbox.append(TOPIC, payload(i), QoS.AT_LEAST_ONCE) for i in range(6)]
    assert [r[0] for r in outbox.read(seqs[1], 100, seqs[3])] == seqs[2:4]
    assert outbox.read(seqs[3], 100, seqs[3]) == []
    outbox.close()


class AckingLink:
    """An in-memory acknowledging link: records what is sent and acknowledges it at once,
    as a broker's PUBACK may arrive before paho's publish returned."""

    def __init__(self) -> None:
        self.connected = False
        self.sent: list[bytes] = []
        self.changed = threading.Condition()
        self._ids = itertools.count(1)
        self._ack: Callable[[int], None] | None = None

    def is_connected(self) -> bool:
        return self.connected

    def publish_tracked(self, topic: str, payload: bytes, qos: QoS) -> int | None:
        packet_id = next(self._ids)
        with self.changed:
            self.sent.append(payload)
            self.changed.notify_all()
        if self._ack is not None:
            self._ack(packet_id)
        return packet_id

    def on_acknowledged(self, callback: Callable[[int], None] | None) -> None:
        self._ack = callback

    def wait_sent(self, count: int, timeout: float) -> list[bytes]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.sent) >= count, timeout), (
                f"{count} sent within {timeout} s; sent {len(self.sent)}"
            )
            return list(self.sent)


def test_live_publishes_go_out_beside_a_paced_backlog(tmp_path: Path) -> None:
    """Issue 36: stored while the link was down, the backlog replays at the pace; what is
    published once the link is back goes out at once, not behind it; each lane in order."""
    backlog = [payload(i) for i in range(6)]
    live = [payload(100 + i) for i in range(3)]
    outbox = make(tmp_path, replay_messages_per_second=2.0)
    link = AckingLink()
    forwarder = Forwarder(outbox, link).start()
    try:
        for body in backlog:
            forwarder.publish(TOPIC, body, QoS.AT_LEAST_ONCE)
        link.connected = True
        forwarder.link_changed(True)
        link.wait_sent(1, 5)  # the pace's first token: the backlog has begun
        for body in live:
            forwarder.publish(TOPIC, body, QoS.AT_LEAST_ONCE)
        # At 2 a second the backlog takes 2.5 s; the live three are out well before it.
        sent = link.wait_sent(1 + len(live), 1.0)
        assert [b for b in sent if b in live] == live
        assert sum(b in backlog for b in sent) < len(backlog)
        sent = link.wait_sent(len(backlog) + len(live), 10)
        assert sorted(sent) == sorted(backlog + live)  # each once
        assert [b for b in sent if b in backlog] == backlog  # the backlog in order
        assert sent.index(live[-1]) < sent.index(backlog[-1])
    finally:
        forwarder.close(5)
        forwarder.flush_acknowledged()
    assert outbox.status().entries == 0
    assert outbox.status().delivered == len(backlog) + len(live)
    outbox.close()


def test_what_a_restart_finds_is_backlog_and_a_new_publish_overtakes_it(tmp_path: Path) -> None:
    outbox = make(tmp_path)
    for i in range(4):
        outbox.append(TOPIC, payload(i), QoS.AT_LEAST_ONCE)
    outbox.close()
    again = make(tmp_path, replay_messages_per_second=2.0)
    link = AckingLink()
    link.connected = True  # up at start: no link change comes
    forwarder = Forwarder(again, link).start()
    try:
        link.wait_sent(1, 5)
        forwarder.publish(TOPIC, payload(50), QoS.AT_LEAST_ONCE)
        assert link.wait_sent(2, 1.0)[1] == payload(50)
        assert link.wait_sent(5, 10)[2:] == [payload(i) for i in range(1, 4)]
    finally:
        forwarder.close(5)
        forwarder.flush_acknowledged()
    again.close()


def test_a_second_outage_adds_what_it_stored_to_the_backlog(tmp_path: Path) -> None:
    """Stored during a second outage while the first backlog still drains: behind that
    backlog, in order, and a live publish after the return still goes first."""
    outbox = make(tmp_path, replay_messages_per_second=2.0)
    link = AckingLink()
    forwarder = Forwarder(outbox, link).start()
    try:
        for i in range(3):
            forwarder.publish(TOPIC, payload(i), QoS.AT_LEAST_ONCE)
        link.connected = True
        forwarder.link_changed(True)
        link.wait_sent(1, 5)
        link.connected = False
        forwarder.link_changed(False)
        for i in range(3, 5):
            forwarder.publish(TOPIC, payload(i), QoS.AT_LEAST_ONCE)
        link.connected = True
        forwarder.link_changed(True)
        forwarder.publish(TOPIC, payload(50), QoS.AT_LEAST_ONCE)
        sent = link.wait_sent(2, 1.0)
        assert payload(50) in sent
        sent = link.wait_sent(6, 10)
        assert [b for b in sent if b != payload(50)] == [payload(i) for i in range(5)]
    finally:
        forwarder.close(5)
        forwarder.flush_acknowledged()
    assert outbox.status().entries == 0
    outbox.close()
