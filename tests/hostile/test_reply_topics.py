"""Replies go only to reply topics, and no request makes a component log a traceback.

Every verb of echo, the camera-adapter, the file-egress and the ethernet-ip adapter gets
requests whose reply_to is a foreign UNS topic, a command topic, a reserved class, a
wildcard, an over-long or invalid topic, or none at all: nothing is published there, the
refusal is counted (LinkStats and the `messaging`/`repliesRefused` metric), one warning per
sender is logged, no traceback, and a valid request afterwards is still answered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.camera.conftest import CameraHarness, sim
from tests.hostile.conftest import Target
from tests.support.adapter import connected_client, framework_sections
from tests.support.logs import LogRecorder
from tests.support.mosquitto import Mosquitto
from tests.support.proto import envelope_classes
from tests.support.raw_mqtt import RawRecorder
from tests.support.servers import component_process, wait_until
from unskit import MessageBuilder
from unskit.envelope import Identity, Message
from unskit.messaging import MessagingClient, ReplyRefusal
from unskit.runtime.component import QUEUES_FAMILY
from unskit.topics import MAX_TOPIC_BYTES, TopicScope

#: What a reply topic the library mints looks like; anything else under lib/reply- is hostile.
MINTED = re.compile(r"lib/reply-[A-Za-z0-9_.-]{1,64}/[0-9a-f]{12}-\d+")
#: Raw envelopes the decoder refuses never reach a responder: counted as rejected instead.
REJECTED = "rejected"

Case = Callable[[Target], "str | bytes | None"]

CASES: dict[str, tuple[Case, str]] = {
    "uns-data-topic": (
        lambda t: f"{t.runtime.topics.root}/gw/victim/data/temperature",
        ReplyRefusal.NOT_A_REPLY_TOPIC,
    ),
    "another-components-cmd-topic": (
        lambda t: f"{t.runtime.topics.root}/gw/camera-adapter/cam-1/cmd/sb/pause",
        ReplyRefusal.NOT_A_REPLY_TOPIC,
    ),
    "its-own-cmd-topic": (lambda t: t.verbs[0][1], ReplyRefusal.NOT_A_REPLY_TOPIC),
    **{
        f"reserved-{cls}": (
            lambda t, cls=cls: f"{t.runtime.topics.root}/gw/victim/{cls}/x",  # type: ignore[misc]
            ReplyRefusal.RESERVED,
        )
        for cls in ("state", "metric", "cfg", "log")
    },
    "plus-wildcard": (lambda t: f"{t.runtime.topics.root}/+/x", ReplyRefusal.WILDCARD),
    "hash-wildcard": (lambda t: "#", ReplyRefusal.WILDCARD),
    "wildcard-under-the-prefix": (lambda t: "lib/reply-a/#", ReplyRefusal.WILDCARD),
    "over-long": (lambda t: "lib/reply-" + "x" * MAX_TOPIC_BYTES, ReplyRefusal.TOO_LONG),
    # 65,536 bytes in 32,773 characters: only the UTF-8 length is over.
    "over-long-in-utf8": (lambda t: "lib/reply-" + "é" * 32_763, ReplyRefusal.TOO_LONG),
    "nul": (lambda t: "lib/reply-a\x00b", ReplyRefusal.INVALID),
    # Mosquitto drops a client that publishes to a topic holding a control character.
    "control-character": (lambda t: "lib/reply-\x1b[31m", ReplyRefusal.INVALID),
    "non-character": (lambda t: "lib/reply-\uffff", ReplyRefusal.INVALID),
    "bare-prefix": (lambda t: "lib/reply-", ReplyRefusal.NOT_A_REPLY_TOPIC),
    "no-reply-to": (lambda t: None, ReplyRefusal.MISSING),
    "empty-on-the-wire": (lambda t: b"", ReplyRefusal.MISSING),
    "invalid-utf8-on-the-wire": (lambda t: b"lib/reply-\xff\xfe", REJECTED),
}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def with_raw_reply_to(message: Message, reply_to: bytes) -> bytes:
    """The envelope with header.reply_to (field 6) set to these exact bytes, which the
    builder would refuse (empty) or could not hold (invalid UTF-8)."""
    envelope = envelope_classes().Envelope.FromString(message.to_bytes())
    header = envelope.header.SerializeToString() + b"\x32" + _varint(len(reply_to)) + reply_to
    envelope.ClearField("header")
    return b"\x0a" + _varint(len(header)) + header + envelope.SerializeToString()


def _correlation_id(payload: bytes) -> str | None:
    try:
        return Message.from_bytes(payload).correlation_id
    except ValueError:  # EnvelopeError: JSON metrics, raw bytes
        return None


def refusals(target: Target, reason: str) -> int:
    stats = target.runtime.get_messaging().stats()
    return stats.rejected if reason == REJECTED else stats.refused_replies.get(reason, 0)


def metric(target: Target, reason: str) -> float:
    counter = target.runtime.metrics.counter(
        "messaging", "repliesRefused", {"link": "local", "reason": reason}
    )
    return counter.total


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_reply_to_is_never_answered(
    target: Target,
    raw: RawRecorder,
    requester: MessagingClient,
    logs: LogRecorder,
    case: str,
) -> None:
    make_reply_to, reason = CASES[case]
    reply_to = make_reply_to(target)
    # One sender per case: each case gets its own once-a-minute warning.
    sender = Identity("site/device", "plant-1/hostile", "tester", case)
    refused, counted = refusals(target, reason), metric(target, reason)
    unanswerable = target.inbox.stats.unanswerable if target.inbox else 0
    start = len(raw)
    ours: set[bytes] = set()
    correlation_ids: set[str] = set()
    for _verb, topic in target.verbs:
        message = MessageBuilder("CommandRequest", "1.0").identity(sender).body({}).build()
        if isinstance(reply_to, bytes):
            payload = with_raw_reply_to(message, reply_to)
            raw.publish(topic, payload)
        else:
            request = message.make_request(reply_to) if reply_to else message
            payload = request.to_bytes()
            requester.publish(topic, request)
        ours.add(payload)
        correlation_ids.add(message.correlation_id)
    sent = len(target.verbs)
    wait_until(
        lambda: refusals(target, reason) == refused + sent, 20, f"{sent} refusals ({reason})"
    )
    # Still answering; and since the broker keeps one publisher's order, any publish the
    # refused requests made has reached the raw client once this reply has.
    assert target.valid()
    wait_until(
        lambda: any(MINTED.fullmatch(t) for t, _ in raw.since(start)),
        10,
        "the raw client to see the valid reply",
    )
    if reason != REJECTED:
        assert metric(target, reason) == counted + sent
    if target.inbox is not None:
        # Requests with no reply_to run (immediate verbs); the others do not, and none is
        # answered. Bytes that are no envelope never reach the inbox.
        reached = 0 if reason == REJECTED else sent
        assert target.inbox.stats.unanswerable == unanswerable + reached
    # Nothing answers these requests, wherever it goes: no message carries their
    # correlation id but the requests themselves (which may be on the hostile topic, when it
    # is the component's own cmd topic).
    published = [(t, p) for t, p in raw.since(start) if p not in ours]
    answers = [t for t, p in published if _correlation_id(p) in correlation_ids]
    assert answers == []
    assert [t for t, _ in published if t.startswith("lib/reply-") and not MINTED.fullmatch(t)] == []
    if isinstance(reply_to, str) and reply_to not in {topic for _, topic in target.verbs}:
        assert [t for t, _ in published if t == reply_to] == []
    assert logs.tracebacks() == []
    assert [r.getMessage() for r in logs.records if "link down" in r.getMessage()] == []
    warned = logs.warnings("not answering")
    if reason in (ReplyRefusal.MISSING, REJECTED):
        assert warned == []  # a fire-and-forget request is legitimate; rejects log apart
    else:
        assert len(warned) == 1, warned  # once per sender per minute, not once per request
        assert repr(f"plant-1/hostile/tester/{case}") in warned[0]


def test_echo_cannot_be_made_to_pause_the_camera(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> None:
    """The issue's reproduction: a request to echo whose reply_to is the camera-adapter's
    cmd/sb/pause made echo publish there, and the camera paused."""
    harness = CameraHarness(broker, tmp_path)
    try:
        rig = harness.start({"cameras": [sim("cam-1")]})
        pause = rig.client.topic("pause", "cam-1")
        document = {"component": {}, **framework_sections(broker.plain_port, tmp_path)}
        document["topic"] = rig.document["topic"]
        config = tmp_path / "echo.json"
        config.write_text(json.dumps(document))
        echo_topic = TopicScope(document["topic"]["root"], "gw", "echo").topic("cmd", "sb", "echo")
        log_path = tmp_path / "echo.log"
        client = connected_client(broker.plain_port, request_timeout_s=5)
        try:
            with component_process("echo", log_path, "-c", str(config), "-t", "gw") as echo:

                def echoes() -> bool:
                    try:
                        request = MessageBuilder("Echo", "1").body({"n": 1}).build()
                        return (
                            client.request(echo_topic, request, timeout_secs=0.5).get(1) is not None
                        )
                    except Exception:
                        return False

                wait_until(echoes, 20, "echo to answer")
                hostile = MessageBuilder("Echo", "1").body({}).build().make_request(pause)
                client.publish(echo_topic, hostile)
                wait_until(
                    lambda: b"not answering" in log_path.read_bytes() or rig.seen.on(pause),
                    20,
                    "echo to refuse (or, before the fix, to publish on the camera's pause topic)",
                )
                assert rig.seen.on(pause) == [], "echo published onto the camera's command topic"
                assert rig.call("status", instance="cam-1")["paused"] is False
                assert echoes(), "echo still answers"
                assert echo.poll() is None
        finally:
            client.close(1)
        output = log_path.read_text()
        assert "Traceback" not in output
        assert output.count("not answering") == 1
    finally:
        harness.close()


#: The queue-depth gauges each component reports besides the runtime's own.
OWN_QUEUES = {"camera-adapter": {"camera.captures"}, "file-egress": {"egress.files"}}


def test_each_component_reports_its_queue_depths(target: Target) -> None:
    depths = {
        m.dimensions["queue"]: m.value
        for m in target.runtime.metrics.collect(reset_interval=False)
        if (m.family, m.name) == (QUEUES_FAMILY, "depth")
    }
    expected = {"messaging.local", *OWN_QUEUES.get(target.name, set())}
    if target.inbox is not None:
        expected.add("commands.inbox")
    assert set(depths) == expected
    assert all(isinstance(value, int) and value >= 0 for value in depths.values())
