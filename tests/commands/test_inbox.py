"""The inbox over a real Mosquitto: addressing, scope, strict bodies, idempotency, deferred
replies, paging, describe, reload-config and the stopping and draining answers."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from tests.commands.conftest import Sample
from tests.support.servers import wait_until
from unskit.commands import CommandClient, ErrorCode, reply_body
from unskit.envelope import Message, MessageBuilder
from unskit.errors import CommandError


def outcome(
    client: CommandClient,
    verb: str,
    body: dict[str, Any] | None = None,
    instance: str | None = None,
) -> tuple[str, dict[str, Any] | None]:
    """("OK", body) or (errorCode, None)."""
    try:
        return "OK", client.call(verb, body, instance=instance, timeout=10)
    except CommandError as error:
        return error.code, None


# -- addressing: one row per rule of the specification ------------------------------------------

ADDRESSING = [
    # verb, topic instance, body instance, configured instances, expected code, answered instance
    pytest.param("ping", None, None, 2, "OK", None, id="component-scope-unaddressed"),
    pytest.param("ping", "cam-1", None, 2, "BAD_ARGS", None, id="component-scope-topic-instance"),
    pytest.param("ping", None, "cam-1", 2, "BAD_ARGS", None, id="component-scope-body-instance"),
    pytest.param("pause", "cam-1", None, 2, "OK", "cam-1", id="instance-scope-topic"),
    pytest.param("pause", None, "cam-2", 2, "OK", "cam-2", id="instance-scope-body"),
    pytest.param("pause", "cam-1", "cam-1", 2, "OK", "cam-1", id="instance-scope-both-equal"),
    pytest.param("pause", "cam-1", "cam-2", 2, "BAD_ARGS", None, id="instance-scope-mismatch"),
    pytest.param("pause", "cam-9", None, 2, "NO_SUCH_INSTANCE", None, id="unknown-topic-instance"),
    pytest.param("pause", None, "cam-9", 2, "NO_SUCH_INSTANCE", None, id="unknown-body-instance"),
    pytest.param("pause", None, None, 2, "BAD_ARGS", None, id="omitted-with-several"),
    pytest.param("pause", None, None, 1, "OK", "cam-1", id="omitted-with-exactly-one"),
    pytest.param("pause", None, None, 0, "NO_SUCH_INSTANCE", None, id="omitted-with-none"),
    pytest.param("pause", "bad token", None, 2, "BAD_ARGS", None, id="topic-token-not-a-token"),
    pytest.param("pause", None, "x" * 129, 2, "BAD_ARGS", None, id="body-instance-too-long"),
    pytest.param("pause", None, 7, 2, "BAD_ARGS", None, id="body-instance-not-a-string"),
    pytest.param("status", None, None, 2, "OK", None, id="both-scope-whole-component"),
    pytest.param("status", "cam-1", None, 2, "OK", "cam-1", id="both-scope-topic-narrows"),
    pytest.param("status", None, "cam-2", 2, "OK", "cam-2", id="both-scope-body-narrows"),
    pytest.param("status", "cam-9", None, 2, "NO_SUCH_INSTANCE", None, id="both-scope-unknown"),
    pytest.param("status", "cam-1", "cam-2", 2, "BAD_ARGS", None, id="both-scope-mismatch"),
    # The mismatch is checked first: before the scope rule and the instance lookup.
    pytest.param("ping", "cam-1", "cam-2", 2, "BAD_ARGS", None, id="mismatch-before-scope"),
    pytest.param("pause", "cam-9", "cam-1", 2, "BAD_ARGS", None, id="mismatch-before-lookup"),
]


@pytest.mark.parametrize(
    ("verb", "topic_instance", "body_instance", "count", "code", "answered"), ADDRESSING
)
def test_addressing_rules(
    start_sample, verb, topic_instance, body_instance, count, code, answered
) -> None:
    sample: Sample = start_sample(instances=["cam-1", "cam-2"][:count])
    body = {} if body_instance is None else {"instance": body_instance}
    got, reply = outcome(sample.client, verb, body, instance=topic_instance)
    assert got == code, reply
    if code == "OK" and answered is not None:
        assert reply is not None
        assert reply["instance"] == answered
    if code == "BAD_ARGS" and topic_instance and body_instance and topic_instance != body_instance:
        with pytest.raises(CommandError, match="differs"):
            sample.client.call(verb, body, instance=topic_instance, timeout=10)


def test_deferred_verbs_follow_the_addressing_rules_too(start_sample) -> None:
    sample = start_sample()
    assert outcome(sample.client, "job", {"requestId": "r1"}, instance="cam-9")[0] == (
        "NO_SUCH_INSTANCE"
    )
    code, reply = outcome(sample.client, "job", {"requestId": "r2"}, instance="cam-2")
    assert code == "OK"
    assert reply is not None
    assert reply["state"] == "SUCCEEDED"


# -- strict bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"requestId": "r", "value": 1, "colour": "red"}, "colour"),
        ({"requestId": "r"}, "value"),
        ({"requestId": "r", "value": "high"}, "value"),
        ({"requestId": "r", "value": True}, "value"),
        ({"requestId": "r", "value": 1001}, "value"),
        ({"requestId": "r", "value": -1}, "value"),
        ({"requestId": "r", "value": 1, "label": "x" * 65}, "label"),
        ({"requestId": "r", "value": 1, "metadata": [1]}, "metadata"),
        ({"requestId": "r", "value": 1, "metadata": {"k": "v" * 2000}}, "metadata"),
        ({"value": 1}, "requestId"),
        ({"requestId": "", "value": 1}, "requestId"),
        ({"requestId": "r" * 257, "value": 1}, "requestId"),
        ({"requestId": "a\nb", "value": 1}, "requestId"),
        ({"requestId": 5, "value": 1}, "requestId"),
    ],
)
def test_bad_bodies_name_the_field(start_sample, body, field) -> None:
    sample = start_sample()
    with pytest.raises(CommandError) as raised:
        sample.client.call("set-point", body, instance="cam-1", timeout=10)
    assert raised.value.code == "BAD_ARGS"
    assert field in raised.value.message


def test_read_only_verbs_take_no_request_id(start_sample) -> None:
    sample = start_sample()
    with pytest.raises(CommandError, match="unknown field requestId"):
        sample.client.call("status", {"requestId": "r"}, timeout=10)


def test_request_id_at_its_bounds_is_accepted(start_sample) -> None:
    sample = start_sample()
    reply = sample.client.call(
        "set-point", {"requestId": "é" * 128, "value": 0}, instance="cam-1", timeout=10
    )
    assert reply["value"] == 0


def test_conditional_request_id(start_sample) -> None:
    sample = start_sample()
    assert sample.client.call("reset", {"dryRun": True}, timeout=10)["dryRun"] is True
    with pytest.raises(CommandError, match="requestId"):
        sample.client.call("reset", {}, timeout=10)
    assert sample.client.call("reset", {"requestId": "r"}, timeout=10)["dryRun"] is False


# -- idempotency ----------------------------------------------------------------------------------


def test_retry_with_same_arguments_returns_the_original_outcome(start_sample) -> None:
    sample = start_sample()
    body = {"requestId": "set-1", "value": 12.5}
    first = sample.client.call("set-point", body, instance="cam-1", timeout=10)
    again = sample.client.call("set-point", body, instance="cam-1", timeout=10)
    assert again == first
    assert sample.app.executions["set-point/cam-1"] == 1
    # Addressing by the body rather than the topic is the same operation.
    by_body = sample.client.call("set-point", {**body, "instance": "cam-1"}, timeout=10)
    assert by_body == first


def test_same_request_id_with_other_arguments_conflicts(start_sample) -> None:
    sample = start_sample()
    sample.client.call("set-point", {"requestId": "set-2", "value": 1}, instance="cam-1")
    code, _ = outcome(sample.client, "set-point", {"requestId": "set-2", "value": 2}, "cam-1")
    assert code == "IDEMPOTENCY_CONFLICT"


def test_request_ids_are_scoped_per_instance(start_sample) -> None:
    sample = start_sample()
    body = {"requestId": "same", "value": 3}
    sample.client.call("set-point", body, instance="cam-1", timeout=10)
    sample.client.call("set-point", body, instance="cam-2", timeout=10)
    assert sample.app.executions == {"set-point/cam-1": 1, "set-point/cam-2": 1}


def test_one_namespace_per_scope_across_verbs(start_sample) -> None:
    sample = start_sample()
    sample.client.call("job-submit", {"requestId": "j1"}, instance="cam-1", timeout=10)
    # The deferred verb and its -submit sibling with the same arguments: still two operations.
    code, _ = outcome(sample.client, "job", {"requestId": "j1"}, "cam-1")
    assert code == "IDEMPOTENCY_CONFLICT"
    code, _ = outcome(sample.client, "set-point", {"requestId": "j1", "value": 1}, "cam-1")
    assert code == "IDEMPOTENCY_CONFLICT"


def test_a_refusal_of_the_moment_is_not_replayed(start_sample) -> None:
    sample = start_sample()
    sample.app.refusals_left = 1
    assert outcome(sample.client, "refuse", {"requestId": "q1"})[0] == "QUEUE_FULL"
    code, reply = outcome(sample.client, "refuse", {"requestId": "q1"})
    assert code == "OK"
    assert reply == {"accepted": True, "execution": 1}


def test_a_duplicate_of_a_held_deferred_request_gets_the_same_outcome(start_sample) -> None:
    sample = start_sample()
    body = {"requestId": "slow-1", "durationMs": 600_000}
    first = sample.client.send("job", body, instance="cam-1", timeout=10)
    wait_until(lambda: len(sample.app.jobs) == 1, 10, "the job to start")
    second = sample.client.send("job", body, instance="cam-1", timeout=10)
    inbox = sample.runtime.command_inbox()
    wait_until(lambda: inbox.held_requests == 2, 10, "both requests to be held")
    (job_id,) = sample.app.jobs
    sample.app.jobs[job_id].set_result({"jobId": job_id, "state": "SUCCEEDED"})
    assert reply_body(first.get(10)) == reply_body(second.get(10))
    assert sample.app.executions["job"] == 1
    assert inbox.held_requests == 0


def test_deferred_failure_is_the_reply_and_is_replayed(start_sample) -> None:
    sample = start_sample()
    body = {"requestId": "fail-1", "fail": True}
    assert outcome(sample.client, "job", body, "cam-1")[0] == "BACKEND_ERROR"
    assert outcome(sample.client, "job", body, "cam-1")[0] == "BACKEND_ERROR"
    assert sample.app.executions["job"] == 1


def test_the_inbox_serves_others_while_a_deferred_reply_is_held(start_sample) -> None:
    sample = start_sample()
    held = sample.client.send("job", {"requestId": "h", "durationMs": 600_000}, "cam-1", 10)
    wait_until(lambda: sample.runtime.command_inbox().held_requests == 1, 10, "the hold")
    for _ in range(20):
        assert sample.client.call("ping", timeout=10) == {"pong": True}
    assert not held.done()


def test_outcomes_survive_a_restart_and_lost_ones_are_unknown(start_sample) -> None:
    first = start_sample()
    done_body = {"requestId": "done-1", "value": 7}
    done = first.client.call("set-point", done_body, instance="cam-1", timeout=10)
    held = first.client.send("job", {"requestId": "lost-1", "durationMs": 600_000}, "cam-1", 10)
    wait_until(lambda: first.runtime.command_inbox().held_requests == 1, 10, "the hold")
    first.runtime.shutdown()
    assert reply_body_code(held.get(10)) == "COMPONENT_STOPPING"

    document = json.loads(first.config_path.read_text())
    second = start_sample(document=document)
    again = second.client.call("set-point", done_body, instance="cam-1", timeout=10)
    assert again == done
    assert "set-point/cam-1" not in second.app.executions
    code, _ = outcome(second.client, "job", {"requestId": "lost-1", "durationMs": 600_000}, "cam-1")
    assert code == "PREVIOUS_OUTCOME_UNKNOWN"
    code, _ = outcome(second.client, "job", {"requestId": "lost-1", "durationMs": 1}, "cam-1")
    assert code == "IDEMPOTENCY_CONFLICT"


def reply_body_code(reply: Message) -> str:
    try:
        reply_body(reply)
    except CommandError as error:
        return error.code
    return "OK"


# -- paging ---------------------------------------------------------------------------------------


def test_pages_come_from_the_first_pages_snapshot(start_sample) -> None:
    sample = start_sample()
    first = sample.client.call("list-items", {"limit": 100}, timeout=10)
    assert [item["index"] for item in first["items"]] == list(range(100))
    assert first["total"] == 250
    assert first["nextCursor"]
    generation = first["items"][0]["generation"]
    # Another first page in between takes a new snapshot; ours must not change.
    sample.client.call("list-items", {"limit": 10}, timeout=10)
    second = sample.client.call("list-items", {"limit": 100, "cursor": first["nextCursor"]})
    third = sample.client.call("list-items", {"limit": 100, "cursor": second["nextCursor"]})
    assert [item["index"] for item in second["items"]] == list(range(100, 200))
    assert [item["index"] for item in third["items"]] == list(range(200, 250))
    assert {item["generation"] for item in second["items"] + third["items"]} == {generation}
    assert third["nextCursor"] is None
    default = sample.client.call("list-items", timeout=10)
    assert len(default["items"]) == 100, "limit defaults to 100"


@pytest.mark.parametrize(
    "body",
    [
        {"limit": 0},
        {"limit": 1001},
        {"limit": 1.5},
        {"cursor": ""},
        {"cursor": "c" * 4097},
        {"cursor": "not-a-cursor"},
        {"cursor": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
    ],
)
def test_bad_paging_arguments(start_sample, body) -> None:
    sample = start_sample()
    assert outcome(sample.client, "list-items", body)[0] == "BAD_ARGS"


def test_an_altered_cursor_is_refused(start_sample) -> None:
    sample = start_sample()
    cursor = sample.client.call("list-items", {"limit": 10}, timeout=10)["nextCursor"]
    altered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
    with pytest.raises(CommandError, match="cursor"):
        sample.client.call("list-items", {"limit": 10, "cursor": altered}, timeout=10)


# -- describe, disabled and unknown verbs ---------------------------------------------------------


def test_describe_lists_every_verb(start_sample) -> None:
    sample = start_sample()
    described = sample.client.call("describe", timeout=10)
    verbs = {entry["verb"]: entry for entry in described["verbs"]}
    assert described["instances"] == ["cam-1", "cam-2"]
    names = {verb.full_name for verb in sample.app.verbs()}
    assert names | {"sb/describe", "sb/reload-config"} == set(verbs)
    job = verbs["sb/job"]
    assert (job["scope"], job["kind"], job["requestId"], job["enabled"]) == (
        "instance",
        "deferred",
        "required",
        True,
    )
    assert verbs["sb/status"]["scope"] == "both"
    assert verbs["sb/status"]["requestId"] == "none"
    assert verbs["sb/reset"]["requestId"] == "conditional"
    assert verbs["sb/discover"]["enabled"] is False
    assert "discovery is off" in verbs["sb/discover"]["reason"]
    assert verbs["sb/list-items"]["fields"]["limit"]["default"] == 100
    assert verbs["sb/reload-config"]["enabled"] is True
    narrowed = sample.client.call("describe", instance="cam-2", timeout=10)
    assert narrowed["instance"] == "cam-2"


def test_disabled_verb_answers_unsupported_capability(start_sample) -> None:
    sample = start_sample()
    with pytest.raises(CommandError) as raised:
        sample.client.call("discover", timeout=10)
    assert raised.value.code == "UNSUPPORTED_CAPABILITY"
    assert "discovery is off" in raised.value.message


def test_unknown_verb_is_bad_args(start_sample) -> None:
    sample = start_sample()
    with pytest.raises(CommandError, match="unknown verb sb/teleport") as raised:
        sample.client.call("teleport", timeout=10)
    assert raised.value.code == "BAD_ARGS"


def test_handler_bug_answers_backend_error_and_the_inbox_goes_on(start_sample) -> None:
    sample = start_sample()
    assert outcome(sample.client, "boom")[0] == "BACKEND_ERROR"
    assert sample.client.call("ping", timeout=10) == {"pong": True}


# -- reload-config, draining, stopping ------------------------------------------------------------


def test_reload_config_applies_and_reports(start_sample) -> None:
    sample = start_sample(instances=["cam-1", "cam-2", "cam-3"])
    sample.client.call("pause", instance="cam-3", timeout=10)
    sample.client.call("pause", instance="cam-1", timeout=10)
    events: list[Message] = []
    got_event = threading.Event()

    def on_event(_topic: str, message: Message) -> None:
        events.append(message)
        got_event.set()

    sample.client.messaging.subscribe(
        sample.runtime.topics.topic("evt", "info", "config-applied"), on_event
    )
    document = json.loads(sample.config_path.read_text())
    document["component"]["instances"] = [
        {"id": "cam-1", "gain": 2.0},
        {"id": "cam-3"},
        {"id": "cam-4"},
    ]
    sample.config_path.write_text(json.dumps(document))
    reply = sample.client.call("reload-config", {"requestId": "reload-1"}, timeout=10)
    assert reply == {
        "started": ["cam-4", "cam-1"],
        "stopped": ["cam-2"],
        "kept": ["cam-3"],
        "skipped": [],
    }
    assert got_event.wait(10)
    assert events[0].body["context"] == reply
    assert sample.client.call("status", instance="cam-3", timeout=10)["paused"] is True
    assert sample.client.call("status", instance="cam-1", timeout=10)["paused"] is False
    assert outcome(sample.client, "status", instance="cam-2")[0] == "NO_SUCH_INSTANCE"


def test_reload_config_rejects_an_invalid_candidate_and_keeps_running(start_sample) -> None:
    sample = start_sample()
    document = json.loads(sample.config_path.read_text())
    document["component"]["instances"] = [{"name": "no id"}]
    sample.config_path.write_text(json.dumps(document))
    with pytest.raises(CommandError, match=r"\$\.component\.instances\[0\]") as raised:
        sample.client.call("reload-config", {"requestId": "reload-bad"}, timeout=10)
    assert raised.value.code == "BAD_ARGS"
    assert sample.client.call("status", timeout=10)["instances"] == ["cam-1", "cam-2"]


def test_every_verb_answers_device_unavailable_while_a_reload_drains(start_sample) -> None:
    sample = start_sample()
    sample.app.reconfigure_release.clear()
    reload = sample.client.send("reload-config", {"requestId": "reload-slow"}, timeout=10)
    assert sample.app.reconfigure_entered.wait(10)
    for verb, body in [("ping", {}), ("status", {}), ("describe", {})]:
        assert outcome(sample.client, verb, body)[0] == "DEVICE_UNAVAILABLE"
    sample.app.reconfigure_release.set()
    assert "kept" in reply_body(reload.get(10))
    assert sample.client.call("ping", timeout=10) == {"pong": True}


def test_component_stopping(start_sample) -> None:
    sample = start_sample()
    sample.runtime.command_inbox().stop_accepting()
    assert outcome(sample.client, "ping")[0] == "COMPONENT_STOPPING"


# -- bad input ------------------------------------------------------------------------------------


def test_garbage_and_foreign_payloads_are_dropped_and_counted(start_sample) -> None:
    sample = start_sample()
    topic = sample.client.topic("ping")
    component_messaging = sample.runtime.get_messaging()
    before = component_messaging.stats().rejected
    raw = sample.client.messaging
    raw.publish_raw(topic, {"verb": "ping", "foreign": True})
    raw.publish_raw(sample.client.topic("pause", "cam-1"), {"not": "an envelope"})
    wait_until(lambda: component_messaging.stats().rejected >= before + 2, 10, "the rejects")
    assert sample.client.call("ping", timeout=10) == {"pong": True}


@pytest.mark.parametrize(
    "payload",
    ["plain text", "[1, 2, 3]", "42", b"\x00\x01binary"],
    ids=["text", "list", "n", "bin"],
)
def test_bodies_that_are_not_objects_are_bad_args(start_sample, payload) -> None:
    sample = start_sample()
    request = MessageBuilder("CommandRequest", "1.0").body(payload).build()
    reply = sample.client.messaging.request(sample.client.topic("ping"), request, 10).get()
    assert reply.body["errorCode"] == "BAD_ARGS"
    assert "object" in reply.body["errorMessage"]


def test_a_huge_body_is_bad_args(start_sample) -> None:
    sample = start_sample()
    body = {"requestId": "big", "value": 1, "label": "x" * 70_000}
    with pytest.raises(CommandError, match="bound") as raised:
        sample.client.call("set-point", body, instance="cam-1", timeout=10)
    assert raised.value.code == "BAD_ARGS"


def test_requests_without_reply_to(start_sample) -> None:
    sample = start_sample()
    messaging = sample.client.messaging
    inbox = sample.runtime.command_inbox()
    # An immediate verb runs; nobody can be told.
    messaging.publish(
        sample.client.topic("pause", "cam-2"),
        MessageBuilder("CommandRequest", "1.0").body({}).build(),
    )
    wait_until(lambda: "cam-2" in sample.app.paused, 10, "the pause to run")
    # A deferred verb is refused before it runs: its outcome could reach nobody.
    messaging.publish(
        sample.client.topic("job", "cam-1"),
        MessageBuilder("CommandRequest", "1.0").body({"requestId": "nobody"}).build(),
    )
    wait_until(lambda: inbox.stats.failed.get("REPLY_REQUIRED") == 1, 10, "the refusal")
    assert "job" not in sample.app.executions
    assert inbox.stats.unanswerable == 2


def test_error_codes_are_the_specifications() -> None:
    assert {code.value for code in ErrorCode} >= {
        "BAD_ARGS",
        "NO_SUCH_INSTANCE",
        "DEVICE_UNAVAILABLE",
        "IDEMPOTENCY_CONFLICT",
        "PREVIOUS_OUTCOME_UNKNOWN",
        "COMPONENT_STOPPING",
    }
    # The specification's 26, and STALE_FRAME (camera capture freshness, beyond the spec).
    assert len(ErrorCode) == 27
    assert ErrorCode.STALE_FRAME.value == "STALE_FRAME"
