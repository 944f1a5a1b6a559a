"""Replies go only to reply topics: the rule, its warning's rate limit, the configured extra
prefixes (messaging.replyTopicPrefixes), and reply() on a real broker."""

from __future__ import annotations

import logging

import pytest

from tests.messaging.conftest import broker_config
from tests.support.raw_mqtt import RawRecorder
from tests.support.servers import wait_until
from unskit import MessageBuilder
from unskit.config.model import MessagingConfig, build_config
from unskit.config.platform import Platform
from unskit.config.schema import validate_document
from unskit.envelope import Identity, Message
from unskit.messaging import MessagingClient, ReplyRefusal
from unskit.messaging.reply_to import RefusalLog, reply_refusal
from unskit.topics import MAX_TOPIC_BYTES

R = ReplyRefusal


@pytest.mark.parametrize(
    ("reply_to", "expected"),
    [
        ("lib/reply-0123abcd-7", None),
        ("lib/reply-a/b/state/x", None),  # not a UNS topic, so it has no reserved class
        ("lib/reply-" + "x" * (MAX_TOPIC_BYTES - 10), None),  # exactly the limit
        (None, R.MISSING),
        ("", R.EMPTY),
        ("lib/reply-", R.NOT_A_REPLY_TOPIC),  # the prefix alone names nobody
        ("lib/reply/x", R.NOT_A_REPLY_TOPIC),  # a slash, not the hyphen
        ("uns/gw/camera-adapter/cam-1/cmd/sb/pause", R.NOT_A_REPLY_TOPIC),
        ("uns/gw/c/data/temperature", R.NOT_A_REPLY_TOPIC),
        ("x", R.NOT_A_REPLY_TOPIC),
        ("uns/gw/c/state", R.RESERVED),
        ("uns/gw/c/i/metric/x", R.RESERVED),
        ("uns/gw/c/cfg/x", R.RESERVED),
        ("uns/gw/c/log/x", R.RESERVED),
        ("#", R.WILDCARD),
        ("lib/reply-+", R.WILDCARD),
        ("lib/reply-a/#", R.WILDCARD),
        ("uns/+/c/data/x", R.WILDCARD),
        ("lib/reply-" + "x" * (MAX_TOPIC_BYTES - 9), R.TOO_LONG),
        ("lib/reply-" + "é" * 32_763, R.TOO_LONG),  # 65,536 bytes in fewer characters
        ("lib/reply-" + "\U0001f600" * 16_382, R.TOO_LONG),  # 4-byte characters
        ("lib/reply-a\x00", R.INVALID),
        ("lib/reply-\x01", R.INVALID),
        ("lib/reply-\x1f", R.INVALID),
        ("lib/reply-\x7f", R.INVALID),
        ("lib/reply-\x9f", R.INVALID),
        ("lib/reply-\ud800", R.INVALID),  # a lone surrogate: no UTF-8 for it
        ("lib/reply-\ufdd0", R.INVALID),
        ("lib/reply-\ufffe", R.INVALID),
        ("lib/reply-\U0010ffff", R.INVALID),
        ("lib/reply-\u00a0é\U0001f600", None),  # printable non-ASCII is fine
    ],
)
def test_only_reply_topics_are_answered(reply_to, expected):
    assert reply_refusal(reply_to) is expected


@pytest.mark.parametrize(
    ("reply_to", "expected"),
    [
        ("legacy/replies/42", None),
        ("legacy/replies/", R.NOT_A_REPLY_TOPIC),
        ("legacy/replies/a/+", R.WILDCARD),
        ("legacy/replies/a/b/state/x", R.RESERVED),  # a reserved class, whatever the prefix
        ("legacy/other", R.NOT_A_REPLY_TOPIC),
        ("lib/reply-x", None),  # the library's own prefix is always a reply topic
    ],
)
def test_configured_prefixes_add_reply_topics(reply_to, expected):
    assert reply_refusal(reply_to, ("legacy/replies/",)) is expected


def request(sender: str | None, reply_to: str = "uns/gw/c/data/x") -> Message:
    builder = MessageBuilder("Req", "1")
    if sender is not None:
        builder.identity(Identity("site/device", "plant-1/gw", "tester", sender))
    return builder.build().make_request(reply_to)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_is_logged_once_per_sender_per_minute(caplog):
    logger = logging.getLogger("test.refusals")
    clock = Clock()
    log = RefusalLog(logger, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="test.refusals"):
        for _ in range(5):
            log.refused("local", request("a"), R.NOT_A_REPLY_TOPIC)
        log.refused("local", request("b"), R.WILDCARD)
        clock.now += 59.9
        log.refused("local", request("a"), R.NOT_A_REPLY_TOPIC)
        assert len(caplog.records) == 2
        clock.now += 0.1
        log.refused("local", request("a"), R.NOT_A_REPLY_TOPIC)
    first, second, third = (r.getMessage() for r in caplog.records)
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in caplog.records)
    assert "'plant-1/gw/tester/a'" in first
    assert "not a reply topic" in first
    assert "'uns/gw/c/data/x'" in first
    assert "'plant-1/gw/tester/b'" in second
    assert "wildcard" in second
    assert "5 more from 'plant-1/gw/tester/a' in the last minute not logged" in third


def test_a_request_without_reply_to_is_logged_at_debug_only(caplog):
    log = RefusalLog(logging.getLogger("test.refusals"), clock=Clock())
    with caplog.at_level(logging.DEBUG, logger="test.refusals"):
        log.refused("local", MessageBuilder("Req", "1").build(), R.MISSING)
        # ... and does not use up the sender's warning for a hostile reply_to.
        log.refused("local", request(None), R.NOT_A_REPLY_TOPIC)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.WARNING]
    assert "from an anonymous sender: the request carries no reply_to" in caplog.messages[0]


def test_forged_senders_cannot_grow_the_table_or_flood_the_log(caplog):
    clock = Clock()
    log = RefusalLog(logging.getLogger("test.refusals"), max_senders=3, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for i in range(100):
            log.refused("local", request(f"forged-{i}"), R.NOT_A_REPLY_TOPIC)
    # Three senders tracked, the rest share one line a minute.
    assert len(caplog.records) == 4
    assert len(log._senders) == 4
    clock.now += 60
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        log.refused("local", request("new"), R.NOT_A_REPLY_TOPIC)
    assert len(caplog.records) == 1  # the oldest sender's minute is over: its place is free
    assert len(log._senders) == 4


def test_a_sender_chosen_string_is_cut_short_in_the_log(caplog):
    log = RefusalLog(logging.getLogger("test.refusals"), clock=Clock())
    long = "lib/reply-\x1b[2J" + "x" * 70_000
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        log.refused("local", request("s" * 5000, long), R.TOO_LONG)
    (line,) = caplog.messages
    assert len(line) < 1000
    assert "\x1b" not in line  # escaped, so a log viewer shows it instead of obeying it
    assert "(70014 characters)" in line


def test_reply_topic_prefixes_configuration():
    document = {
        "component": {},
        "messaging": {
            "local": {"host": "127.0.0.1", "port": 1883},
            "replyTopicPrefixes": ["legacy/replies/"],
        },
    }
    assert validate_document(document) == []
    config = build_config(document, thing="gw", platform=Platform.HOST, component_token="c")
    assert config.messaging.reply_topic_prefixes == ("legacy/replies/",)
    del document["messaging"]["replyTopicPrefixes"]
    config = build_config(document, thing="gw", platform=Platform.HOST, component_token="c")
    assert config.messaging.reply_topic_prefixes == ()
    for bad in (["a/#"], ["a/+/"], [""], ["$SYS/"], ["a\x00"], "legacy/"):
        document["messaging"]["replyTopicPrefixes"] = bad
        issues = [str(issue) for issue in validate_document(document)]
        assert any(i.startswith("$.messaging.replyTopicPrefixes") for i in issues), bad


def start(
    port: int, prefixes: tuple[str, ...] = (), northbound: bool = False
) -> tuple[MessagingClient, list[tuple[str, ReplyRefusal]]]:
    config = MessagingConfig(
        local=broker_config(port),
        northbound=broker_config(port) if northbound else None,
        reply_topic_prefixes=prefixes,
    )
    refused: list[tuple[str, ReplyRefusal]] = []
    client = MessagingClient(
        config,
        persistent_session=False,
        on_reply_refused=lambda link, refusal: refused.append((link, refusal)),
    ).start()
    wait_until(client.connected, 10, "the client")
    return client, refused


def test_reply_publishes_only_under_a_reply_prefix(broker, topic_root):
    raw = RawRecorder(broker.plain_port)
    plain, _ = start(broker.plain_port)
    legacy, refused = start(broker.plain_port, ("legacy/replies/",), northbound=True)
    try:
        wait_until(legacy.northbound_connected, 10, "the northbound link")
        ok = f"legacy/replies/{topic_root}"
        foreign = f"{topic_root}/gw/camera-adapter/cam-1/cmd/sb/pause"
        assert plain.reply(request("a", ok), MessageBuilder("R", "1").build()) is False
        assert plain.reply(request("a", foreign), MessageBuilder("R", "1").build()) is False
        assert legacy.reply(request("a", foreign), MessageBuilder("R", "1").build()) is False
        assert legacy.reply_northbound(request("a", "#"), MessageBuilder("R", "1").build()) is False
        answer = MessageBuilder("R", "1").body({"ok": 1}).build()
        asked = request("a", ok)
        assert legacy.reply(asked, answer) is True
        wait_until(lambda: any(t == ok for t, _ in raw.since(0)), 10, "the reply")
        ((_, payload),) = [(t, p) for t, p in raw.since(0) if t.startswith(("legacy", topic_root))]
        assert Message.from_bytes(payload).correlation_id == asked.correlation_id
        assert plain.stats().refused_replies == {"not-a-reply-topic": 2}
        assert legacy.stats().refused_replies == {"not-a-reply-topic": 1}
        assert legacy.stats(northbound=True).refused_replies == {"wildcard": 1}
        assert refused == [("local", R.NOT_A_REPLY_TOPIC), ("northbound", R.WILDCARD)]
        assert plain.reply_refusal(request("a", ok)) is R.NOT_A_REPLY_TOPIC
        assert legacy.reply_refusal(request("a", ok)) is None
    finally:
        for client in (plain, legacy):
            client.close(2)
        raw.close()


class Recorder:
    """A transport that records what it is asked to do and never connects."""

    name = "local"

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def start(self, on_message: object, on_link: object) -> None:
        self.calls.append(("start", None))

    def publish(self, topic: str, payload: bytes, qos: object) -> None:
        self.calls.append(("publish", topic))

    def subscribe(self, topic_filters: object, qos: object) -> None:
        self.calls.append(("subscribe", topic_filters))

    def unsubscribe(self, topic_filters: object) -> None:
        self.calls.append(("unsubscribe", topic_filters))

    def is_connected(self) -> bool:
        return False

    def acknowledged(self, topic_filters: object) -> bool:
        return False

    def wait_acknowledged(self, topic_filters: object, timeout: float) -> bool:
        return False

    def publish_backlog(self) -> int:
        return 0

    def publish_failures(self) -> int:
        return 0

    endpoint = "nowhere:1883"
    failovers = 0
    small_messages_only = False

    @property
    def refused_subscriptions(self) -> dict[str, str]:
        return {}

    def within_failover_grace(self) -> bool:
        return False

    def close(self, timeout: float) -> None:
        self.calls.append(("close", None))


@pytest.mark.parametrize("northbound", [False, True])
@pytest.mark.parametrize(
    "reply_to", ["uns/gw/camera-adapter/cam-1/cmd/sb/pause", "lib/reply-", "lib/reply-#", "other/x"]
)
def test_a_request_with_a_reply_to_no_responder_answers_is_refused(reply_to: str, northbound: bool):
    local, north = Recorder(), Recorder()
    config = MessagingConfig(local=None, reply_topic_prefixes=("legacy/replies/",))
    client = MessagingClient(config, local=local, northbound=north)  # type: ignore[arg-type]
    request = client.request_northbound if northbound else client.request
    message = MessageBuilder("Q", "1").reply_to(reply_to).build()
    try:
        with pytest.raises(ValueError, match="responders answer only under") as refused:
            request("uns/gw/c/cmd/sb/go", message)
        assert local.calls == north.calls == [], "nothing subscribed or published"
    finally:
        client.close(0)
    assert repr(reply_to) in str(refused.value)
    assert "'lib/reply-', 'legacy/replies/'" in str(refused.value)


@pytest.mark.parametrize("reply_to", ["legacy/replies/a", "lib/reply-x"])
def test_a_request_with_a_reply_topic_of_its_own_is_sent(reply_to: str):
    local = Recorder()
    config = MessagingConfig(local=None, reply_topic_prefixes=("legacy/replies/",))
    client = MessagingClient(config, local=local)  # type: ignore[arg-type]
    try:
        message = MessageBuilder("Q", "1").reply_to(reply_to).build()
        future = client.request("uns/gw/c/cmd/sb/go", message, 0)
        assert future.reply_topic == reply_to
        assert ("subscribe", [reply_to]) in local.calls
        assert ("publish", "uns/gw/c/cmd/sb/go") in local.calls
    finally:
        client.close(0)
