"""The inbox and a reply_to that is no reply topic: for every verb the request is not run, not
answered, counted, and never makes a traceback; a request without reply_to still runs; an
outcome the envelope cannot carry is answered as an error."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import pytest

from tests.support.adapter import connected_client, inbox_answers
from tests.support.logs import recording_logs
from tests.support.servers import wait_until
from unskit.commands import CommandClient
from unskit.commands.idempotency import IdempotencyStore
from unskit.commands.inbox import CommandInbox
from unskit.commands.verbs import CommandContext, Kind, RequestIdRule, Scope, Verb
from unskit.envelope import MessageBuilder
from unskit.errors import CommandError
from unskit.topics import TopicScope

HOSTILE = {
    "foreign-cmd-topic": "uns/gw/camera-adapter/cam-1/cmd/sb/pause",
    "reserved": "uns/gw/victim/state/x",
    "wildcard": "lib/reply-#",
    "over-long": "lib/reply-" + "x" * 70_000,
    "control-character": "lib/reply-\x07",
}


@pytest.mark.parametrize("reply_to", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_refused_reply_to_runs_no_verb(start_sample, reply_to) -> None:
    sample = start_sample()
    inbox = sample.runtime.command_inbox()
    messaging = sample.client.messaging
    topics = []
    for verb in inbox.verbs():
        instance = None if verb.scope is Scope.COMPONENT else "cam-1"
        topics.append(sample.client.topic(verb.name, instance))
    body = {"requestId": "r-1", "value": 1, "durationMs": 0}
    requests, unanswerable = inbox.stats.requests, inbox.stats.unanswerable
    with recording_logs() as logs:
        for topic in topics:
            request = MessageBuilder("CommandRequest", "1.0").body(body).build()
            messaging.publish(topic, request.make_request(reply_to))
        wait_until(
            lambda: inbox.stats.unanswerable == unanswerable + len(topics), 10, "the refusals"
        )
        assert sample.client.call("ping", timeout=10) == {"pong": True}
    assert inbox.stats.requests == requests + len(topics) + 1
    # Nothing ran: no pause, no job, no set-point, no reset.
    assert sample.app.paused == set()
    assert sample.app.executions == {}
    assert inbox.stats.failed.get("BAD_ARGS", 0) >= len(topics)
    assert logs.tracebacks() == []
    assert len(logs.warnings("not answering")) == 1


def test_a_request_without_reply_to_still_runs_and_is_counted(start_sample) -> None:
    sample = start_sample()
    messaging = sample.runtime.get_messaging()
    missing = messaging.stats().refused_replies.get("missing", 0)
    sample.client.messaging.publish(
        sample.client.topic("pause", "cam-1"),
        MessageBuilder("CommandRequest", "1.0").body({}).build(),
    )
    wait_until(lambda: "cam-1" in sample.app.paused, 10, "the fire-and-forget pause")
    wait_until(
        lambda: messaging.stats().refused_replies.get("missing", 0) == missing + 1,
        10,
        "the unsent reply to be counted",
    )


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def test_an_outcome_beyond_the_envelope_limits_is_answered_as_an_error(broker, tmp_path) -> None:
    """A verb whose outcome nests deeper than the envelope allows (immediate or deferred) is
    answered BACKEND_ERROR, not left unanswered with a traceback."""
    responder = connected_client(broker.plain_port)
    caller = connected_client(broker.plain_port, request_timeout_s=10)
    topics = TopicScope(f"t{uuid.uuid4().hex[:8]}", "gw", "deep")
    inbox = CommandInbox(responder, topics, store=IdempotencyStore(tmp_path / "ids.sqlite"))

    def later(_context: CommandContext) -> Future[Mapping[str, Any]]:
        future: Future[Mapping[str, Any]] = Future()
        threading.Timer(0.05, lambda: future.set_result(deep(40))).start()
        return future

    inbox.register(Verb("now", lambda _context: deep(40)))
    inbox.register(Verb("later", later, kind=Kind.DEFERRED, request_id=RequestIdRule.REQUIRED))
    client = CommandClient.for_scope(caller, topics)
    try:
        with recording_logs() as logs:
            inbox.start()
            wait_until(lambda: inbox_answers(client), 10, "the inbox")
            for verb, body in (("now", {}), ("later", {"requestId": "r-1"})):
                with pytest.raises(CommandError) as raised:
                    client.call(verb, body, timeout=10)
                assert raised.value.code == "BACKEND_ERROR"
        assert logs.tracebacks() == []
        assert len(logs.warnings("does not fit an envelope")) == 2
    finally:
        inbox.close()
        caller.close(1)
        responder.close(1)
