"""The inbox and a reply_to that is no reply topic: for every verb the request is not run, not
answered, counted, and never makes a traceback; a request without reply_to still runs."""

from __future__ import annotations

import pytest

from tests.support.logs import recording_logs
from tests.support.servers import wait_until
from unskit.commands.verbs import Scope
from unskit.envelope import MessageBuilder

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
