"""A burst the inbox's queue cannot hold: every request the queue refuses is answered
RESOURCE_LIMIT at once (issue 18: 428 of 2,000 describes went unanswered), and the inbox
serves normally afterwards."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from tests.support.adapter import connected_client, inbox_answers
from tests.support.logs import recording_logs
from tests.support.servers import wait_until
from unskit.commands import CommandClient
from unskit.commands.idempotency import IdempotencyStore
from unskit.commands.inbox import CommandInbox
from unskit.commands.verbs import CommandContext, Verb
from unskit.envelope import MessageBuilder
from unskit.messaging.requests import RequestFuture
from unskit.topics import TopicScope

pytestmark = pytest.mark.integration

BURST = 2_000
QUEUE = 8
# Every reply, busy or not, well inside the callers' own timeout.
REPLY_WITHIN_S = 30.0


def test_a_burst_beyond_the_queue_is_answered_busy_not_dropped(broker, tmp_path) -> None:
    responder = connected_client(broker.plain_port)
    caller = connected_client(broker.plain_port, request_timeout_s=REPLY_WITHIN_S + 30)
    topics = TopicScope(f"t{uuid.uuid4().hex[:8]}", "gw", "busy")
    outcomes: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()

    def count(verb: str, outcome: str) -> None:
        with lock:
            outcomes[(verb, outcome)] += 1

    inbox = CommandInbox(
        responder,
        topics,
        store=IdempotencyStore(tmp_path / "ids.sqlite"),
        max_concurrency=1,
        max_queued=QUEUE,
        on_outcome=count,
    )
    entered, release = threading.Event(), threading.Event()

    def hold(_context: CommandContext) -> Mapping[str, Any]:
        # Keeps the one worker busy, so the burst overflows whatever the machine's speed.
        entered.set()
        release.wait(REPLY_WITHIN_S)
        return {"held": True}

    inbox.register(Verb("hold", hold))
    client = CommandClient.for_scope(caller, topics)
    futures: list[RequestFuture] = []
    try:
        with recording_logs() as logs:
            inbox.start()
            wait_until(lambda: inbox_answers(client), 10, "the inbox")
            held = caller.request(
                client.topic("hold"), MessageBuilder("CommandRequest", "1.0").body({}).build()
            )
            assert entered.wait(10), "the hold verb did not start"
            started = time.monotonic()
            for _ in range(BURST):
                request = MessageBuilder("CommandRequest", "1.0").body({}).build()
                futures.append(caller.request(client.topic("describe"), request))
            # The refused ones are answered while the worker is still held.
            wait_until(
                lambda: sum(f.done() for f in futures) >= BURST - QUEUE,
                REPLY_WITHIN_S,
                "the busy replies",
            )
            release.set()
            codes: Counter[str] = Counter()
            for future in futures:
                body = future.get(max(0.1, started + REPLY_WITHIN_S - time.monotonic())).body
                codes[body.get("errorCode") or "OK"] += 1
            assert held.get(10).body == {"held": True}
            # Still healthy: a normal request is served.
            assert client.call("describe", timeout=10)["component"] == "busy"
        assert codes == {"OK": QUEUE, "RESOURCE_LIMIT": BURST - QUEUE}
        assert inbox.stats.busy == BURST - QUEUE
        assert outcomes[("describe", "RESOURCE_LIMIT")] == BURST - QUEUE
        assert logs.tracebacks() == []
        # One rate-limited line for the drops, not one per request.
        assert 1 <= len(logs.warnings("queue of 8 full")) <= 2
    finally:
        release.set()
        inbox.close()
        caller.close(1)
        responder.close(1)
