"""The idempotency store: claims, outcomes and removals in memory and in its journal, which
survives a killed process, a torn last write and a second opener; an earlier version's
SQLite store moves into it."""

from __future__ import annotations

import contextlib
import logging
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from unskit._core.journal import read as read_journal
from unskit.commands import IdempotencyStore, idempotency
from unskit.commands.idempotency import (
    COMPACT_SLACK,
    ClaimKind,
    IdempotencyKey,
    arguments_hash,
    journaled_states,
)
from unskit.errors import JournalError

KEY = IdempotencyKey("camera-adapter", "cam-1", "req-1")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "commands.journal"


def run(store: IdempotencyStore, request_id: str, outcome: dict, scope: str = "") -> None:
    key = IdempotencyKey("c", scope, request_id)
    assert store.claim(key, "h").kind is ClaimKind.NEW
    store.complete(key, outcome)


def test_claim_lifecycle(path) -> None:
    store = IdempotencyStore(path)
    digest = arguments_hash("capture", {"profile": "default"})
    assert store.claim(KEY, digest).kind is ClaimKind.NEW
    duplicate = store.claim(KEY, digest)
    assert duplicate.kind is ClaimKind.IN_FLIGHT
    assert duplicate.waiter is not None
    assert store.claim(KEY, arguments_hash("capture", {"profile": "other"})).kind is (
        ClaimKind.CONFLICT
    )
    store.complete(KEY, {"captureId": "cap_1"})
    assert duplicate.waiter.result(1) == {"captureId": "cap_1"}
    replay = store.claim(KEY, digest)
    assert replay.kind is ClaimKind.REPLAY
    assert replay.outcome == {"captureId": "cap_1"}
    store.close()
    reopened = IdempotencyStore(path)
    assert reopened.claim(KEY, digest).outcome == {"captureId": "cap_1"}
    reopened.close()


def test_pending_claims_of_an_earlier_run_are_unknown(path) -> None:
    digest = arguments_hash("capture", {})
    first = IdempotencyStore(path)
    assert first.claim(KEY, digest).kind is ClaimKind.NEW
    first.close()
    second = IdempotencyStore(path)
    assert second.claim(KEY, digest).kind is ClaimKind.UNKNOWN
    assert second.claim(KEY, arguments_hash("capture", {"x": 1})).kind is ClaimKind.CONFLICT
    second.close()


def test_forget_lets_a_retry_run_again_also_after_a_restart(path) -> None:
    store = IdempotencyStore(path)
    digest = arguments_hash("v", {})
    assert store.claim(KEY, digest).kind is ClaimKind.NEW
    duplicate = store.claim(KEY, digest)
    refusal = {"errorCode": "QUEUE_FULL", "errorMessage": "full"}
    store.forget(KEY, refusal)
    assert duplicate.waiter is not None
    assert duplicate.waiter.result(1) == refusal
    assert store.claim(KEY, digest).kind is ClaimKind.NEW
    store.forget(KEY, refusal)
    store.close()
    reopened = IdempotencyStore(path)
    assert reopened.claim(KEY, digest).kind is ClaimKind.NEW, "the removal was journaled"
    reopened.close()


def test_retention_and_record_bound(path, monkeypatch) -> None:
    store = IdempotencyStore(path, max_records=100)
    for i in range(150):
        run(store, f"r{i}", {"i": i})
    assert store.count() == 150
    assert store.prune() == 50
    assert store.count() == 100
    # The oldest went first.
    assert store.claim(IdempotencyKey("c", "", "r49"), "h").kind is ClaimKind.NEW
    assert store.claim(IdempotencyKey("c", "", "r149"), "h").kind is ClaimKind.REPLAY
    store.close()
    later = idempotency._now_ms() + 2 * 3600 * 1000
    monkeypatch.setattr(idempotency, "_now_ms", lambda: later)
    reopened = IdempotencyStore(path, retention_seconds=3600)
    assert reopened.count() == 0, "records older than the retention are pruned at open"
    reopened.close()


def test_a_completed_outcome_moves_its_record_to_the_back_of_the_age_order(path) -> None:
    store = IdempotencyStore(path, max_records=2)
    old = IdempotencyKey("c", "", "old")
    assert store.claim(old, "h").kind is ClaimKind.NEW
    run(store, "middle", {"m": 1})
    store.complete(old, {"o": 1})  # now the most recent change
    run(store, "new", {"n": 1})
    assert store.prune() == 1
    assert store.claim(old, "h").outcome == {"o": 1}
    assert store.claim(IdempotencyKey("c", "", "middle"), "h").kind is ClaimKind.NEW
    store.close()


def test_the_journal_is_compacted_and_keeps_every_live_record(path) -> None:
    store = IdempotencyStore(path, max_records=100)
    for i in range(3 * COMPACT_SLACK):
        run(store, f"r{i}", {"i": i})
    # Two journal records per request, pruned to 100 live every 1000 claims: compactions
    # keep the file near the live records, never the whole history.
    assert store.journal_records <= 2 * store.count() + COMPACT_SLACK
    assert len(read_journal(path)) == store.journal_records
    live = store.count()
    store.close()
    reopened = IdempotencyStore(path, max_records=100)
    assert reopened.count() == live
    last = f"r{3 * COMPACT_SLACK - 1}"
    assert reopened.claim(IdempotencyKey("c", "", last), "h").outcome == {
        "i": 3 * COMPACT_SLACK - 1
    }
    reopened.close()


def test_a_torn_last_write_is_cut_off_and_the_records_before_it_kept(path, caplog) -> None:
    store = IdempotencyStore(path)
    run(store, "kept", {"k": 1})
    store.close()
    whole = path.stat().st_size
    with path.open("ab") as file:
        file.write(b"\x40\x00\x00\x00\x01\x02\x03\x04half a rec")  # a frame cut short
    with caplog.at_level(logging.WARNING, logger="unskit.commands.idempotency"):
        reopened = IdempotencyStore(path)
    assert "18 bytes of an unfinished write" in caplog.text
    assert path.stat().st_size == whole
    assert reopened.claim(IdempotencyKey("c", "", "kept"), "h").outcome == {"k": 1}
    run(reopened, "after", {"a": 1})
    reopened.close()
    assert journaled_states(path) == {
        IdempotencyKey("c", "", "kept"): "done",
        IdempotencyKey("c", "", "after"): "done",
    }


def test_a_second_opener_is_refused_until_the_first_closes(path) -> None:
    store = IdempotencyStore(path)
    with pytest.raises(JournalError, match="in use"):
        IdempotencyStore(path)
    store.close()
    IdempotencyStore(path).close()


def test_a_file_that_is_not_a_journal_is_refused_by_name(path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + bytes(100))
    with pytest.raises(JournalError, match="does not start as an unskit journal"):
        IdempotencyStore(path)
    assert path.read_bytes().startswith(b"SQLite format 3"), "nothing was overwritten"


def test_a_record_that_is_not_an_idempotency_record_is_refused_with_its_place(path) -> None:
    from unskit._core.journal import Journal

    journal, _, _ = Journal.open(path)
    journal.append(b'["put","c","","r1","h","b",true,"{}",1,1]')
    journal.append(b'["sideways"]')
    journal.close()
    with pytest.raises(JournalError, match="record 2 is not an idempotency record"):
        IdempotencyStore(path)


def test_durable_sync_journals_the_same_records(path) -> None:
    store = IdempotencyStore(path, synchronous_full=True)
    run(store, "r1", {"i": 1})
    store.close()
    assert journaled_states(path) == {IdempotencyKey("c", "", "r1"): "done"}


def test_an_earlier_versions_sqlite_store_moves_into_the_journal(path, caplog) -> None:
    legacy = path.with_suffix(".sqlite3")
    with contextlib.closing(sqlite3.connect(legacy)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(
            """
            CREATE TABLE idempotency (
                component TEXT NOT NULL, scope TEXT NOT NULL, request_id TEXT NOT NULL,
                args_hash TEXT NOT NULL, boot_id TEXT NOT NULL, state TEXT NOT NULL,
                outcome TEXT, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,
                PRIMARY KEY (component, scope, request_id)) WITHOUT ROWID;
            """
        )
        now = idempotency._now_ms()
        db.executemany(
            "INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                ("c", "", "done-1", "h", "old-boot", "done", '{"i": 1}', now, now),
                ("c", "cam-1", "lost-1", "h", "old-boot", "pending", None, now, now),
            ],
        )
        db.commit()
    with caplog.at_level(logging.INFO, logger="unskit.commands.idempotency"):
        store = IdempotencyStore(path)
    assert "moved 2 records" in caplog.text
    assert not legacy.exists()
    assert not Path(f"{legacy}-wal").exists()
    assert store.claim(IdempotencyKey("c", "", "done-1"), "h").outcome == {"i": 1}
    assert store.claim(IdempotencyKey("c", "cam-1", "lost-1"), "h").kind is ClaimKind.UNKNOWN
    store.close()
    assert journaled_states(path) == {
        IdempotencyKey("c", "", "done-1"): "done",
        IdempotencyKey("c", "cam-1", "lost-1"): "pending",
    }


def test_an_unreadable_earlier_store_is_an_error_naming_it(path) -> None:
    legacy = path.with_suffix(".sqlite3")
    legacy.write_bytes(b"not a database at all" * 100)
    with pytest.raises(JournalError, match=r"commands\.sqlite3: the earlier idempotency store"):
        IdempotencyStore(path)
    assert legacy.exists(), "kept for the operator"


def test_the_store_is_safe_across_threads(path) -> None:
    store = IdempotencyStore(path)
    kinds: list[ClaimKind] = []
    lock = threading.Lock()

    def claim() -> None:
        kind = store.claim(KEY, "same").kind
        with lock:
            kinds.append(kind)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(kind.value for kind in kinds) == ["in-flight"] * 7 + ["new"]
    store.close()


def test_concurrent_claims_of_many_keys_run_each_once_and_every_duplicate_gets_the_outcome(
    path,
) -> None:
    # Duplicates share one waiter, made by the first of them; four threads per key claim at
    # once, so some land before, some after each complete(); each ends with a replay.
    store = IdempotencyStore(path)
    keys = [IdempotencyKey("c", "cam-1", f"r{i}") for i in range(6)]
    claims: dict[IdempotencyKey, list] = {key: [] for key in keys}
    lock = threading.Lock()
    start = threading.Barrier(24)
    errors: list[BaseException] = []

    def claimer(key: IdempotencyKey) -> None:
        try:
            start.wait(10)
            while True:
                claim = store.claim(key, "h")
                with lock:
                    claims[key].append(claim)
                if claim.kind is ClaimKind.NEW:
                    store.complete(key, {"ran": key.request_id})
                elif claim.kind is ClaimKind.IN_FLIGHT:
                    claim.waiter.result(10)  # then claims again, and must find the outcome
                else:
                    return
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(keys[i % 6],)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    store.close()
    assert not errors
    assert not any(thread.is_alive() for thread in threads)
    for key in keys:
        kinds = [claim.kind for claim in claims[key]]
        assert kinds.count(ClaimKind.NEW) == 1, kinds
        assert set(kinds) <= {ClaimKind.NEW, ClaimKind.IN_FLIGHT, ClaimKind.REPLAY}
        waiters = {id(c.waiter) for c in claims[key] if c.kind is ClaimKind.IN_FLIGHT}
        assert len(waiters) <= 1, "duplicates of one claim wait on one future"
        for claim in claims[key]:
            if claim.kind is ClaimKind.IN_FLIGHT:
                assert claim.waiter.result(5) == {"ran": key.request_id}
            elif claim.kind is ClaimKind.REPLAY:
                assert claim.outcome == {"ran": key.request_id}


_KILLED_WRITER = """
import sys
from unskit.commands.idempotency import IdempotencyKey, IdempotencyStore
store = IdempotencyStore(sys.argv[1])
for i in range(200):
    key = IdempotencyKey("c", "", f"r{i}")
    store.claim(key, "h")
    store.complete(key, {"i": i})
store.claim(IdempotencyKey("c", "", "pending"), "h")
print("written", flush=True)
sys.stdin.read()
"""


@pytest.mark.integration
def test_every_record_survives_sigkill(path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"written\n"
        with pytest.raises(JournalError, match="in use"):
            IdempotencyStore(path)  # the writer still holds it
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    store = IdempotencyStore(path)
    try:
        replay = store.claim(IdempotencyKey("c", "", "r199"), "h")
        assert replay.kind is ClaimKind.REPLAY
        assert replay.outcome == {"i": 199}
        assert store.claim(IdempotencyKey("c", "", "pending"), "h").kind is ClaimKind.UNKNOWN
        assert store.count() == 201
    finally:
        store.close()


_FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from unskit.commands.idempotency import IdempotencyKey, IdempotencyStore
path = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
store = IdempotencyStore(path)
store.claim(IdempotencyKey("c", "", "before"), "h")
# Room for part of the next record only, as on a disk that fills mid-write.
room = path.stat().st_size + 20
resource.setrlimit(resource.RLIMIT_FSIZE, (room, resource.RLIM_INFINITY))
try:
    store.claim(IdempotencyKey("c", "", "refused"), "h" * 200)
except OSError as error:
    print("refused:", error.errno, flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
assert store.count() == 1, "a refused claim is not held in memory either"
store.claim(IdempotencyKey("c", "", "after"), "h")
store.close()
"""


@pytest.mark.integration
def test_a_write_the_disk_refuses_midway_leaves_no_part_record_to_hide_later_ones(path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: 27"), done.stdout  # EFBIG, after a partial write
    assert journaled_states(path) == {
        IdempotencyKey("c", "", "before"): "pending",
        IdempotencyKey("c", "", "after"): "pending",
    }
