"""Malformed requests on the inbox of a running component (issue 18 item 4), the rows the
other inbox tests do not cover: each is answered with its spec error code, or (bytes no
envelope decoder accepts) dropped and counted with one warning; never a traceback, and the
inbox answers a valid request afterwards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.commands.conftest import Sample, sample_document
from tests.support.logs import recording_logs
from tests.support.proto import envelope_classes, value_from_python
from tests.support.raw_mqtt import RawRecorder
from tests.support.servers import wait_until
from unskit.commands.inbox import UNKNOWN_VERB_LABEL
from unskit.envelope import Message, MessageBuilder
from unskit.runtime.component import QUEUES_FAMILY

REPLY_TO = "lib/reply-hostile-requests"
MARK = b"MARKMARK"


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def request(body: object = None, content_type: str | None = None) -> Message:
    builder = MessageBuilder("CommandRequest", "1.0").body({} if body is None else body)
    if content_type is not None:
        builder.content_type(content_type)
    return builder.build().make_request(REPLY_TO)


def truncated() -> bytes:
    whole = request({"note": "x" * 64}).to_bytes()
    return whole[: len(whole) // 2]


def invalid_utf8() -> bytes:
    # Same length, so every length prefix stays right: only the string is broken.
    whole = request({"note": MARK.decode()}).to_bytes()
    assert whole.count(MARK) == 1
    return whole.replace(MARK, b"\xff\xfe\xfd\xfcMARK")


def nested_beyond_the_envelope() -> bytes:
    # The builder refuses this depth, so it is made with plain protobuf, as a foreign
    # client would.
    classes = envelope_classes()
    envelope = classes.Envelope.FromString(request().to_bytes())
    envelope.structured.CopyFrom(value_from_python(classes, deep(40)))
    return bytes(envelope.SerializeToString())


#: Bytes no envelope decoder accepts: dropped before the inbox, counted as rejected.
REJECTED: dict[str, Callable[[], bytes]] = {
    "truncated": truncated,
    "invalid-utf8-in-the-body": invalid_utf8,
    "nested-beyond-the-envelope": nested_beyond_the_envelope,
    "not-an-envelope-text": lambda: b"sb/ping please",
}

#: Envelopes that decode: answered with the spec's code (or OK for the control rows).
ANSWERED: dict[str, tuple[Callable[[], Message], str]] = {
    "object-declared-image-jpeg": (lambda: request({}, "image/jpeg"), "BAD_ARGS"),
    "object-declared-text-plain": (lambda: request({}, "text/plain"), "BAD_ARGS"),
    "opaque-declared-octet-stream": (
        lambda: request(b"\x00\x01", "application/octet-stream"),
        "BAD_ARGS",
    ),
    "object-declared-json-with-charset": (
        lambda: request({}, "application/json; charset=utf-8"),
        "OK",
    ),
    "object-declared-vendor-json": (lambda: request({}, "application/vnd.acme+json"), "OK"),
    "nested-within-the-envelope": (lambda: request(deep(31)), "BAD_ARGS"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_bytes_that_are_no_envelope_are_dropped_and_counted(start_sample, broker, case) -> None:
    sample: Sample = start_sample()
    messaging = sample.runtime.get_messaging()
    inbox = sample.runtime.command_inbox()
    raw = RawRecorder(broker.plain_port)
    try:
        rejected, requests = messaging.stats().rejected, inbox.stats.requests
        with recording_logs() as logs:
            raw.publish(sample.client.topic("ping"), REJECTED[case]())
            wait_until(lambda: messaging.stats().rejected == rejected + 1, 10, "the reject")
            assert sample.client.call("ping", timeout=10) == {"pong": True}
        # Only the valid ping reached the inbox.
        assert inbox.stats.requests == requests + 1
        assert logs.tracebacks() == []
        assert len(logs.warnings("rejected")) <= 1
    finally:
        raw.close()


@pytest.mark.parametrize("case", sorted(ANSWERED))
def test_malformed_envelopes_get_the_spec_code(start_sample, case) -> None:
    sample: Sample = start_sample()
    make, code = ANSWERED[case]
    with recording_logs() as logs:
        reply = sample.client.messaging.request(sample.client.topic("ping"), make(), 10).get()
        assert (reply.body.get("errorCode") or "OK") == code, reply.body
        assert sample.client.call("ping", timeout=10) == {"pong": True}
    if code == "BAD_ARGS" and "declared" in case:
        assert "content type" in reply.body["errorMessage"]
    assert logs.tracebacks() == []


def test_body_bounds_are_configurable_and_named(start_sample, broker, tmp_path) -> None:
    document = sample_document(broker.plain_port, tmp_path / "state", ["cam-1"])
    document["commands"] |= {"maxBodyBytes": 1024, "maxBodyDepth": 4}
    sample: Sample = start_sample(document=document)

    def refusal(body: dict[str, Any]) -> str:
        reply = sample.client.messaging.request(sample.client.topic("ping"), request(body), 10)
        answer = reply.get().body
        assert answer.get("errorCode") == "BAD_ARGS", answer
        return str(answer["errorMessage"])

    assert "(commands.maxBodyBytes)" in refusal({"note": "x" * 1100})
    assert (
        refusal(deep(4))
        == "a nests 4 levels, so the body 5; the bound is 4 (commands.maxBodyDepth)"
    )
    # Within both bounds the body is judged field by field as before.
    assert "maxBody" not in refusal(deep(3))
    assert sample.client.call("ping", timeout=10) == {"pong": True}


def test_unknown_verbs_share_one_metric_label(start_sample) -> None:
    sample: Sample = start_sample()
    names = [f"no-such-verb-{i}" for i in range(25)]
    for name in names:
        reply = sample.client.messaging.request(sample.client.topic(name), request(), 10).get()
        assert reply.body.get("errorCode") == "BAD_ARGS"
    assert sample.client.call("ping", timeout=10) == {"pong": True}
    labels = {
        m.dimensions["verb"]: m.total
        for m in sample.runtime.metrics.collect(reset_interval=False)
        if (m.family, m.name) == ("commands", "replies")
    }
    # The sender chose the names: they are counted together, never one series each.
    assert not any(name in labels for name in names)
    assert labels[UNKNOWN_VERB_LABEL] == len(names)
    assert labels["ping"] >= 1


def test_queue_depths_are_gauges(start_sample) -> None:
    sample: Sample = start_sample()

    def depths() -> dict[str, object]:
        return {
            m.dimensions["queue"]: m.value
            for m in sample.runtime.metrics.collect(reset_interval=False)
            if (m.family, m.name) == (QUEUES_FAMILY, "depth")
        }

    assert set(depths()) == {"commands.inbox", "messaging.local"}
    # Idle once start-up's own publishes are acknowledged: nothing waits for a worker or
    # for the broker.
    wait_until(lambda: set(depths().values()) == {0}, 10, "empty queues")
