"""Property tests of the parsers that read what others send or write (issue 18, fuzzing):
paging cursors, UNS topics, `$secret` references, redaction and whole configuration
documents. Each either accepts its input or refuses it with the project's error for that
kind; nothing else escapes, and a tampered cursor is never trusted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from unskit.commands.paging import CursorBook
from unskit.config.loader import resolve_config
from unskit.config.platform import Platform
from unskit.config.secrets import REDACTED, SecretRef, redact
from unskit.errors import CommandError, ConfigError
from unskit.topics import topic_class, topic_matches_filter, uns_topic

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)
tokens = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)


def refusal(call: Callable[[], object]) -> CommandError | ConfigError | None:
    """The project error `call` refused with, or None when it accepted."""
    try:
        call()
    except (CommandError, ConfigError) as error:
        return error
    return None


# -- paging cursors -------------------------------------------------------------------------


@given(position=st.integers(0, 63), flip=st.integers(1, 255))
def test_a_tampered_cursor_is_refused_never_trusted(position: int, flip: int) -> None:
    book = CursorBook()
    cursor = book.first("owner", range(100), 10, {})
    assert cursor.next_cursor is not None
    raw = bytearray(cursor.next_cursor.encode())
    at = position % len(raw)
    raw[at] = (raw[at] + flip) % 128 or 1
    tampered = raw.decode()
    if tampered == cursor.next_cursor:
        return
    pages: list[list[Any]] = []
    error = refusal(lambda: pages.append(book.next("owner", tampered, 10).items))
    if error is not None:
        assert isinstance(error, CommandError)
        assert error.code == "BAD_ARGS"
    else:
        # An encoding that decodes to the same bytes (base64 padding bits) is the same cursor.
        assert pages == [list(range(10, 20))]


@given(text=st.text(max_size=80))
def test_any_text_as_a_cursor_is_bad_args(text: str) -> None:
    book = CursorBook()
    book.first("owner", range(5), 1, {})
    error = refusal(lambda: book.next("owner", text, 1))
    assert isinstance(error, CommandError), f"{text!r} was accepted as a cursor"
    assert error.code == "BAD_ARGS"


# -- topics -----------------------------------------------------------------------------------


@given(
    root=tokens,
    device=tokens,
    component=tokens,
    instance=st.none() | tokens,
    klass=st.sampled_from(["data", "evt", "state", "cmd", "app", "metrics"]),
    channel=st.lists(tokens, max_size=3),
)
def test_a_built_topic_knows_its_class_and_matches_its_filters(
    root: str, device: str, component: str, instance: str | None, klass: str, channel: list[str]
) -> None:
    topic = uns_topic(root, device, component, klass, *channel, instance=instance)
    assert topic.topic_class == klass
    head = 3 if instance is None else 4
    assert topic_class(topic, head) == klass
    assert topic_matches_filter("#", topic)
    assert topic_matches_filter(f"{root}/#", topic)
    assert topic_matches_filter("/".join(["+"] * len(topic.split("/"))), topic)


@given(topic=st.text(max_size=60), topic_filter=st.text(max_size=30))
def test_topic_functions_never_raise_on_any_text(topic: str, topic_filter: str) -> None:
    assert isinstance(topic_matches_filter(topic_filter, topic), bool)
    assert topic_class(topic) is None or isinstance(topic_class(topic), str)


@given(value=st.text(max_size=20))
def test_a_token_with_a_slash_or_wildcard_is_refused(value: str) -> None:
    try:
        topic = uns_topic("uns", "gw", "c", "data", value)
    except ValueError:
        return
    assert not any(ch in value for ch in "/+#"), topic


# -- $secret references and redaction ---------------------------------------------------------


@given(value=json_values)
def test_only_a_well_formed_secret_object_is_a_reference(value: Any) -> None:
    ref = SecretRef.parse(value)
    if ref is not None:
        assert SecretRef.parse(ref.to_json()) == ref
        assert ref.name


@given(document=json_values, name=st.text(min_size=1, max_size=10))
def test_redaction_never_shows_a_secret_reference(document: Any, name: str) -> None:
    wrapped = {"a": document, "password": "hunter2", "ref": {"$secret": name}}
    shown = redact(wrapped)
    assert shown["password"] == REDACTED
    assert shown["ref"] == REDACTED
    assert "hunter2" not in repr(shown)


# -- whole configuration documents ------------------------------------------------------------


@given(document=st.dictionaries(st.text(max_size=12), json_values, max_size=6))
def test_any_document_is_accepted_or_refused_with_json_paths(document: dict[str, Any]) -> None:
    error = refusal(
        lambda: resolve_config(
            document, thing="gw", platform=Platform.HOST, default_component="echo"
        )
    )
    if isinstance(error, ConfigError):
        assert error.issues
        assert all(issue.path.startswith("$") for issue in error.issues)


@given(port=json_values, host=json_values)
def test_a_broken_messaging_section_names_its_path(port: Any, host: Any) -> None:
    document = {"component": {}, "messaging": {"local": {"host": host, "port": port}}}
    error = refusal(
        lambda: resolve_config(
            document, thing="gw", platform=Platform.HOST, default_component="echo"
        )
    )
    if isinstance(error, ConfigError):
        assert any(issue.path.startswith("$.messaging.local") for issue in error.issues)
