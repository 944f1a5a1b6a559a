"""Requests that wait for the inbox: the ones a persistent session kept while the component
was down are handled in order once its verbs are registered, and a request past its deadline
(its sender's, carried in the lib-deadline-ms tag; without one, header timestamp +
messaging.requestTimeoutSeconds) is refused unrun with DEVICE_UNAVAILABLE.
Real Mosquitto, the sample component run in-process twice on one broker session."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.commands.conftest import Sample, sample_document
from tests.commands.sample_component import SampleComponent
from tests.support.adapter import connected_client, inbox_answers
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from unskit.commands import CommandClient, ErrorCode, reply_body
from unskit.commands.client import REQUEST_NAME
from unskit.config import ConfigLoader
from unskit.envelope import MessageBuilder
from unskit.errors import CommandError
from unskit.messaging import MessagingClient, RequestFuture
from unskit.messaging.requests import DEADLINE_TAG
from unskit.runtime.component import Runtime

MINUTE_MS = 60_000


def stamped(
    client: CommandClient,
    verb: str,
    body: dict[str, Any],
    age_ms: int,
    instance: str | None = "cam-1",
    sender_deadline: str | None = None,
) -> RequestFuture:
    """Sends a request whose header says it was built `age_ms` ago, carrying `sender_deadline`
    as its deadline tag (sent without a deadline of its own, so the tag is the one given)."""
    request = (
        MessageBuilder(REQUEST_NAME, "1.0")
        .timestamp_ms(int(time.time() * 1000) - age_ms)
        .body(body)
        .build()
    )
    if sender_deadline is not None:
        request.inject_tag(DEADLINE_TAG, sender_deadline)
    return client.messaging.request(client.topic(verb, instance), request, timeout_secs=0)


def code_of(future: RequestFuture) -> str:
    try:
        reply_body(future.get(30))
    except CommandError as error:
        return error.code
    return "OK"


@pytest.fixture
def component(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[tuple[Callable[[], tuple[Runtime, SampleComponent]], CommandClient]]:
    """Starts the sample component (one instance, one worker) on one broker session: each
    call is a new process run of the same component; and a client of it."""
    document = sample_document(broker.plain_port, tmp_path / "state", ["cam-1"])
    document["messaging"]["local"]["clientId"] = f"sample-{uuid.uuid4().hex[:8]}"
    # One handler at a time: the order of handling is the order of the replies.
    document["commands"]["maxConcurrency"] = 1
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(document))
    runtimes: list[Runtime] = []

    def start() -> tuple[Runtime, SampleComponent]:
        loader = ConfigLoader(
            path, thing="gw", component_schema=SampleComponent.schema, default_component="sample"
        )
        runtime, app = Runtime(loader.load()), SampleComponent()
        runtimes.append(runtime)
        runtime.start(app, loader)
        return runtime, app

    messaging: MessagingClient = connected_client(broker.plain_port, request_timeout_s=60)
    client = CommandClient(messaging, "sample", "gw", root=document["topic"]["root"])
    yield start, client
    messaging.close(1)
    for runtime in runtimes:
        runtime.shutdown()


def test_requests_kept_by_the_session_are_answered_in_order_and_expired_ones_refused(
    component,
) -> None:
    start, client = component
    first, _ = start()
    wait_until(lambda: inbox_answers(client), 10, "the first run's inbox")
    first.shutdown()

    # While the component is down: five set-points, a deferred job, and two requests
    # whose deadline passed before the component is back.
    set_points = [
        client.send("set-point", {"requestId": f"r-{i}", "value": i}, instance="cam-1", timeout=60)
        for i in range(1, 6)
    ]
    job = client.send("job", {"requestId": "job-1"}, instance="cam-1", timeout=60)
    late = stamped(client, "set-point", {"requestId": "late", "value": 9}, age_ms=10 * MINUTE_MS)
    late_ping = stamped(client, "ping", {}, age_ms=10 * MINUTE_MS, instance=None)
    # A request from a sender whose clock runs ahead is not refused.
    ahead = stamped(client, "ping", {}, age_ms=-MINUTE_MS, instance=None)

    _, app = start()
    everything = [*set_points, job, late, late_ping, ahead]
    wait_until(lambda: all(f.done() for f in everything), 20, "every kept request answered")
    replies = [reply_body(f.get(0)) for f in set_points]
    assert [r["value"] for r in replies] == [1, 2, 3, 4, 5]
    assert [r["execution"] for r in replies] == [1, 2, 3, 4, 5], "handled in arrival order"
    assert reply_body(job.get(0))["state"] == "SUCCEEDED"
    assert reply_body(ahead.get(0)) == {"pong": True}
    for expired in (late, late_ping):
        with pytest.raises(CommandError) as refused:
            reply_body(expired.get(0))
        assert refused.value.code == ErrorCode.DEVICE_UNAVAILABLE
        assert "deadline of 30 s" in refused.value.message
    # The expired set-point never ran and nothing was recorded for it: a retry runs it.
    assert app.executions == {"set-point/cam-1": 5, "job": 1}
    retry = client.call("set-point", {"requestId": "late", "value": 9}, instance="cam-1")
    assert retry["execution"] == 6


DEADLINES = [
    # requestTimeoutSeconds, age of the request in ms, expected outcome
    pytest.param(30, 0, "OK", id="fresh"),
    pytest.param(30, 25_000, "OK", id="within-the-deadline"),
    pytest.param(30, 35_000, "DEVICE_UNAVAILABLE", id="past-the-deadline"),
    pytest.param(30, -MINUTE_MS, "OK", id="stamped-in-the-future"),
    pytest.param(5, 10_000, "DEVICE_UNAVAILABLE", id="a-shorter-deadline"),
    pytest.param(0, 24 * 60 * MINUTE_MS, "OK", id="deadline-disabled"),
]


@pytest.mark.parametrize(("timeout_s", "age_ms", "expected"), DEADLINES)
def test_the_deadline_applies_to_every_request(
    start_sample, broker, tmp_path, timeout_s, age_ms, expected
) -> None:
    document = sample_document(broker.plain_port, tmp_path / "state", ["cam-1"])
    document["messaging"]["requestTimeoutSeconds"] = timeout_s
    sample: Sample = start_sample(document=document)
    future = stamped(sample.client, "set-point", {"requestId": "r", "value": 1}, age_ms)
    assert code_of(future) == expected
    assert sample.app.executions.get("set-point/cam-1", 0) == (1 if expected == "OK" else 0)


def _in(seconds: float) -> str:
    return str(int((time.time() + seconds) * 1000))


# (component's requestTimeoutSeconds, age by the header, the sender's deadline tag, outcome)
SENDER_DEADLINES = [
    pytest.param(30, 35_000, lambda: _in(60), "OK", id="sender-waits-longer-than-the-default"),
    pytest.param(30, 0, lambda: _in(-1), "DEVICE_UNAVAILABLE", id="sender-gave-up"),
    pytest.param(0, 0, lambda: _in(-1), "DEVICE_UNAVAILABLE", id="sender-gave-up-default-off"),
    pytest.param(30, 35_000, lambda: "soon", "DEVICE_UNAVAILABLE", id="malformed-tag-default"),
    pytest.param(30, 0, lambda: "-5", "OK", id="negative-tag-ignored"),
    pytest.param(30, 0, lambda: "9" * 40, "OK", id="huge-tag-ignored"),
]


@pytest.mark.parametrize(("timeout_s", "age_ms", "tag", "expected"), SENDER_DEADLINES)
def test_the_senders_own_deadline_wins(
    start_sample, broker, tmp_path, timeout_s, age_ms, tag, expected
) -> None:
    document = sample_document(broker.plain_port, tmp_path / "state", ["cam-1"])
    document["messaging"]["requestTimeoutSeconds"] = timeout_s
    sample: Sample = start_sample(document=document)
    body = {"requestId": "r", "value": 1}
    future = stamped(sample.client, "set-point", body, age_ms, sender_deadline=tag())
    assert code_of(future) == expected
    assert sample.app.executions.get("set-point/cam-1", 0) == (1 if expected == "OK" else 0)


def test_a_request_carries_its_senders_deadline(broker) -> None:
    messaging = connected_client(broker.plain_port, request_timeout_s=60)
    seen: list[dict[str, str]] = []
    try:
        topic = f"t-{uuid.uuid4().hex[:8]}/cmd/sb/ping"
        messaging.subscribe(topic, lambda _t, message: seen.append(message.tags))
        before = time.time()
        messaging.request(topic, MessageBuilder("Ping", "1").build(), timeout_secs=45)
        messaging.request(topic, MessageBuilder("Ping", "1").build(), timeout_secs=0)
        wait_until(lambda: len(seen) == 2, 10, "both requests")
    finally:
        messaging.close(1)
    tagged = [tags for tags in seen if DEADLINE_TAG in tags]
    assert len(tagged) == 1  # a request without a deadline carries none
    deadline_s = int(tagged[0][DEADLINE_TAG]) / 1000
    assert before + 45 - 1 <= deadline_s <= time.time() + 45
