"""The inbox's parts without a broker: field validators, cursors, the idempotency store."""

from __future__ import annotations

import contextlib
import math
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.servers import wait_until
from unskit.commands import (
    CURSOR,
    ID,
    INSTANCE,
    LIMIT,
    REASON,
    REQUEST_ID,
    BodySpec,
    Choice,
    IdempotencyStore,
    Integer,
    ListOf,
    Number,
    ObjectOf,
    Param,
    Text,
    Verb,
    single_instance,
)
from unskit.commands.idempotency import (
    CHECKPOINT_EVERY_COMMITS,
    ClaimKind,
    IdempotencyKey,
    arguments_hash,
)
from unskit.commands.paging import CursorBook
from unskit.commands.verbs import Kind, RequestIdRule
from unskit.errors import CommandError


def bad(field, value) -> str:
    with pytest.raises(CommandError) as raised:
        field.check(value, "f")
    assert raised.value.code == "BAD_ARGS"
    return raised.value.message


# -- the specification's limits, row by row ----------------------------------------------------

LIMITS = [
    # field, accepted values, refused values
    (REQUEST_ID, ["r", "x" * 256, "é" * 128], ["", "x" * 257, "é" * 129, "a\tb", "\x7f", 1]),
    (INSTANCE, ["a", "A-z_0.9", "x" * 128], ["", "x" * 129, "a b", "a/b", "é", None]),
    (LIMIT, [1, 100, 1000, 7.0], [0, 1001, -1, 1.5, True, "5", math.inf]),
    (CURSOR, ["c", "c" * 4096], ["", "c" * 4097, 5]),
    (ID, ["cap_1", "x" * 256], ["", "x" * 257, "a\nb"]),
    (REASON, ["", "x" * 1024], ["x" * 1025, 3]),
]


@pytest.mark.parametrize(("field", "accepted", "refused"), LIMITS)
def test_shared_limits(field, accepted, refused) -> None:
    for value in accepted:
        field.check(value, "f")
    for value in refused:
        assert "f" in bad(field, value)


def test_numbers_and_nested_types() -> None:
    assert "finite" in bad(Number(), math.nan)
    assert Integer(minimum=0).check(3.0, "f") == 3
    assert "one of" in bad(Choice(("a", "b")), "c")
    assert "f[1]" in bad(ListOf(Integer(), max_items=3), [1, "x"])
    assert "0 to 2 items, not 3" in bad(ListOf(Integer(), max_items=2), [1, 2, 3])
    nested = ObjectOf({"x": Param(Integer(), required=True)})
    assert "f.x" in bad(nested, {})
    assert "f.y" in bad(nested, {"x": 1, "y": 2})


def test_body_spec_fills_defaults_and_names_unknown_fields() -> None:
    spec = BodySpec({"limit": Param(LIMIT, default=100), "name": Param(Text(), required=True)})
    assert spec.check({"name": "n"}) == {"limit": 100, "name": "n"}
    with pytest.raises(CommandError, match="unknown field colour"):
        spec.check({"name": "n", "colour": 1})
    with pytest.raises(CommandError, match="missing required field name"):
        spec.check({})


def test_single_instance_rule() -> None:
    assert single_instance(["only"]) == "only"
    with pytest.raises(CommandError) as several:
        single_instance(["a", "b"])
    assert several.value.code == "BAD_ARGS"
    with pytest.raises(CommandError) as none:
        single_instance([])
    assert none.value.code == "NO_SUCH_INSTANCE"


def test_verb_declarations_are_checked() -> None:
    def handler(_):
        return {}

    with pytest.raises(ValueError, match="one topic token"):
        Verb("a/b", handler)
    with pytest.raises(ValueError, match="needs a requestId"):
        Verb("d", handler, kind=Kind.DEFERRED)
    with pytest.raises(ValueError, match="needs a reason"):
        Verb("x", handler, enabled=False)
    with pytest.raises(ValueError, match="request_id_needed"):
        Verb("c", handler, request_id=RequestIdRule.CONDITIONAL)


# -- cursors --------------------------------------------------------------------------------------


def test_cursor_pages_and_bounds() -> None:
    book = CursorBook(max_snapshots=2)
    first = book.first("owner", range(25), 10, {"total": 25})
    assert first.items == list(range(10))
    assert first.next_cursor is not None
    assert len(first.next_cursor) <= 64, "a small, bounded cursor"
    second = book.next("owner", first.next_cursor, 10)
    assert second.items == list(range(10, 20))
    third = book.next("owner", second.next_cursor, 10)
    assert third.items == list(range(20, 25))
    assert third.next_cursor is None
    assert third.extra == {"total": 25}
    assert len(book) == 0, "the last page releases the snapshot"
    # At most max_snapshots are kept: the oldest is evicted and its cursor expires.
    cursors = [book.first("owner", range(5), 1, {}).next_cursor for _ in range(3)]
    assert len(book) == 2
    with pytest.raises(CommandError, match="expired"):
        book.next("owner", cursors[0], 1)


def test_cursor_refusals() -> None:
    book = CursorBook()
    cursor = book.first("owner", range(5), 1, {}).next_cursor
    assert cursor is not None
    with pytest.raises(CommandError, match="another verb"):
        book.next("someone else", cursor, 1)
    with pytest.raises(CommandError, match="not one this component issued"):
        CursorBook().next("owner", cursor, 1)
    with pytest.raises(CommandError, match="not one this component issued"):
        book.next("owner", "%%%", 1)
    expired = CursorBook(ttl_seconds=0)
    stale = expired.first("owner", range(5), 1, {}).next_cursor
    assert stale is not None
    with pytest.raises(CommandError, match="expired"):
        expired.next("owner", stale, 1)


# -- the idempotency store ------------------------------------------------------------------------

KEY = IdempotencyKey("camera-adapter", "cam-1", "req-1")


def test_claim_lifecycle(tmp_path) -> None:
    store = IdempotencyStore(tmp_path / "idem.sqlite3")
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


def test_pending_claims_of_an_earlier_run_are_unknown(tmp_path) -> None:
    path = tmp_path / "idem.sqlite3"
    digest = arguments_hash("capture", {})
    first = IdempotencyStore(path)
    assert first.claim(KEY, digest).kind is ClaimKind.NEW
    first.close()
    second = IdempotencyStore(path)
    assert second.claim(KEY, digest).kind is ClaimKind.UNKNOWN
    assert second.claim(KEY, arguments_hash("capture", {"x": 1})).kind is ClaimKind.CONFLICT


def test_forget_lets_a_retry_run_again(tmp_path) -> None:
    store = IdempotencyStore(tmp_path / "idem.sqlite3")
    digest = arguments_hash("v", {})
    assert store.claim(KEY, digest).kind is ClaimKind.NEW
    store.forget(KEY, {"errorCode": "QUEUE_FULL", "errorMessage": "full"})
    assert store.claim(KEY, digest).kind is ClaimKind.NEW


def test_retention_and_record_bound(tmp_path) -> None:
    path = tmp_path / "idem.sqlite3"
    store = IdempotencyStore(path, max_records=100)
    for i in range(150):
        key = IdempotencyKey("c", "", f"r{i}")
        store.claim(key, "h")
        store.complete(key, {"i": i})
    assert store.count() == 150
    assert store.prune() == 50
    assert store.count() == 100
    # The oldest went first.
    assert store.claim(IdempotencyKey("c", "", "r149"), "h").kind is ClaimKind.REPLAY
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE idempotency SET updated_ms = 0 WHERE request_id = 'r120'")
    reopened = IdempotencyStore(path, retention_seconds=3600)
    assert reopened.count() == 99, "records older than the retention are pruned at open"


def test_the_store_is_safe_across_threads(tmp_path) -> None:
    store = IdempotencyStore(tmp_path / "idem.sqlite3")
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


def test_concurrent_claims_of_many_keys_run_each_once_and_every_duplicate_gets_the_outcome(
    tmp_path,
) -> None:
    # Duplicates share one waiter, made by the first of them; four threads per key claim at
    # once, so some land before, some after each complete(); each ends with a replay.
    store = IdempotencyStore(tmp_path / "idem.sqlite3")
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


def test_a_new_store_file_has_small_pages_and_an_old_one_keeps_its_own(tmp_path) -> None:
    from unskit.commands import idempotency

    def page_size(path: Path) -> int:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return int(db.execute("PRAGMA page_size").fetchone()[0])

    new = tmp_path / "new.sqlite3"
    IdempotencyStore(new).close()
    assert page_size(new) == idempotency.PAGE_SIZE == 1024
    old = tmp_path / "old.sqlite3"
    with contextlib.closing(sqlite3.connect(old)) as db:
        db.execute("PRAGMA page_size=4096")
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(idempotency._SCHEMA)
        db.execute(
            "INSERT INTO idempotency VALUES ('c', '', 'r1', 'h', 'b', 'done', '{\"i\": 1}', 1, ?)",
            (int(time.time() * 1000),),
        )
        db.commit()
    store = IdempotencyStore(old)
    try:
        replay = store.claim(IdempotencyKey("c", "", "r1"), "h")
        assert (replay.kind, replay.outcome) == (ClaimKind.REPLAY, {"i": 1})
        assert store.claim(IdempotencyKey("c", "", "r2"), "h").kind is ClaimKind.NEW
    finally:
        store.close()
    assert page_size(old) == 4096


def _in_database_file(path: Path) -> int:
    """Records the database file holds without its WAL (a copy of the file alone is read)."""
    alone = path.with_name("alone.sqlite3")
    shutil.copyfile(path, alone)
    try:
        with contextlib.closing(sqlite3.connect(alone)) as db:
            return int(db.execute("SELECT count(*) FROM idempotency").fetchone()[0])
    except sqlite3.OperationalError:  # not even the table: everything is in the WAL
        return 0
    finally:
        alone.unlink()


def test_checkpoints_run_off_the_request_path(tmp_path) -> None:
    path = tmp_path / "idem.sqlite3"
    store = IdempotencyStore(path)
    # SQLite's automatic checkpoint (and its fsyncs) never runs inside a request's commit.
    assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    for i in range(CHECKPOINT_EVERY_COMMITS // 2 - 1):
        key = IdempotencyKey("c", "", f"r{i}")
        store.claim(key, "h")
        store.complete(key, {"i": i})
    assert store.checkpoints == 0
    assert _in_database_file(path) == 0  # all of it in the WAL so far
    key = IdempotencyKey("c", "", "last")
    store.claim(key, "h")
    store.complete(key, {"i": "last"})  # the commit that makes a checkpoint due
    wait_until(lambda: store.checkpoints == 1, 10, "the checkpointer to fold the WAL back")
    assert _in_database_file(path) == CHECKPOINT_EVERY_COMMITS // 2
    assert store.claim(key, "h").kind is ClaimKind.REPLAY
    checkpointer = store._checkpointer
    store.close()
    assert not checkpointer.is_alive()


_KILLED_WRITER = """
import sys
from unskit.commands import idempotency
from unskit.commands.idempotency import IdempotencyKey, IdempotencyStore
idempotency.CHECKPOINT_IDLE_SECS = 3600  # and fewer commits than make one due: all in the WAL
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
def test_records_only_in_the_wal_survive_sigkill(tmp_path) -> None:
    path = tmp_path / "idem.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"written\n"
        assert _in_database_file(path) == 0  # nothing was checkpointed before the kill
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


# -- the commands section of the configuration ----------------------------------------------------


def test_commands_section_is_validated_with_paths() -> None:
    from unskit.config.schema import validate_document

    document = {
        "component": {},
        "messaging": {"local": {"host": "127.0.0.1"}},
        "commands": {
            "maxConcurrency": 0,
            "cursorTtlSeconds": -1,
            "colour": 1,
            "maxBodyBytes": 70_000,
            "maxBodyDepth": 33,
        },
    }
    paths = {issue.path for issue in validate_document(document)}
    assert paths == {
        "$.commands.maxConcurrency",
        "$.commands.cursorTtlSeconds",
        "$.commands.colour",
        "$.commands.maxBodyBytes",
        "$.commands.maxBodyDepth",
    }


def test_body_bound_defaults_are_the_inbox_defaults() -> None:
    from unskit.commands import MAX_BODY_BYTES, MAX_BODY_DEPTH, MAX_FREE_FORM_DEPTH
    from unskit.config.model import CommandsConfig

    assert (CommandsConfig().max_body_bytes, CommandsConfig().max_body_depth) == (
        MAX_BODY_BYTES,
        MAX_BODY_DEPTH,
    )
    # A free-form field inside a body fits the default depth.
    assert MAX_FREE_FORM_DEPTH + 1 < MAX_BODY_DEPTH


def test_state_directory_defaults(monkeypatch, tmp_path) -> None:
    from unskit.config.model import CommandsConfig

    monkeypatch.setenv("UNSKIT_STATE_DIR", str(tmp_path / "state"))
    assert CommandsConfig().store_path("gw", "cam") == tmp_path / "state/gw/cam/commands.sqlite3"
    monkeypatch.delenv("UNSKIT_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert CommandsConfig().store_path("gw", "cam").parent == tmp_path / "xdg/unskit/gw/cam"
    explicit = CommandsConfig(state_dir=str(tmp_path / "mine"))
    assert explicit.store_path("gw", "cam").parent == tmp_path / "mine/gw/cam"
