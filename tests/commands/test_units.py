"""The inbox's parts without a broker: field validators, cursors, the commands configuration."""

from __future__ import annotations

import math

import pytest

from unskit.commands import (
    CURSOR,
    ID,
    INSTANCE,
    LIMIT,
    REASON,
    REQUEST_ID,
    BodySpec,
    Choice,
    Integer,
    ListOf,
    Number,
    ObjectOf,
    Param,
    Text,
    Verb,
    single_instance,
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
    assert CommandsConfig().store_path("gw", "cam") == tmp_path / "state/gw/cam/commands.journal"
    monkeypatch.delenv("UNSKIT_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert CommandsConfig().store_path("gw", "cam").parent == tmp_path / "xdg/unskit/gw/cam"
    explicit = CommandsConfig(state_dir=str(tmp_path / "mine"))
    assert explicit.store_path("gw", "cam").parent == tmp_path / "mine/gw/cam"
