"""Bad input gets a clear error: never a crash, never a synthetic message."""

from __future__ import annotations

import json

import pytest

from tests.envelope import samples
from tests.support.proto import envelope_classes
from unskit import EnvelopeError, Message, MessageBuilder
from unskit.envelope import MAX_SAMPLE_STATUS_BYTES


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff" * 16,
        b"hello world",
        b"\x0a\xff",  # a length-delimited field longer than the input
        b"\x0a\x05\x0a\x03abc",  # truncated header
        b"\x0a\x02\x0a\xff",  # bad nested length
        b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # varint over 10 bytes
        bytes(range(256)),
    ],
)
def test_arbitrary_bytes_are_refused(data):
    with pytest.raises(EnvelopeError, match="envelope"):
        Message.from_bytes(data)


@pytest.mark.parametrize(
    "document",
    [
        {"header": {"name": "r", "version": "1", "uuid": "u"}, "body": {"a": 1}},
        [1, 2, 3],
        "a string",
        {},
        None,
        42,
    ],
)
def test_foreign_json_is_refused(document):
    with pytest.raises(EnvelopeError):
        Message.from_bytes(json.dumps(document).encode())


def test_invalid_utf8_in_a_string_field_is_refused():
    # header { name: <0xff> }
    with pytest.raises(EnvelopeError, match="malformed envelope"):
        Message.from_bytes(b"\x0a\x03\x0a\x01\xff")


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda env: env.ClearField("header"), "header is missing"),
        (lambda env: setattr(env.header, "name", ""), "header.name is empty"),
        (lambda env: setattr(env.header, "version", ""), "header.version is empty"),
        (lambda env: setattr(env.header, "uuid", ""), "header.uuid is empty"),
        (lambda env: setattr(env.header, "timestamp_ms", -1), "timestamp_ms -1 is outside"),
        (
            lambda env: setattr(env.header, "timestamp_ms", 253_402_300_800_000),
            "is outside",
        ),
        (lambda env: env.tags.update({"": "x"}), "empty key"),
        (lambda env: setattr(env, "opaque", bytes(65537)), "65537 bytes exceeds"),
    ],
)
@pytest.mark.integration
def test_well_formed_protobuf_that_breaks_an_envelope_rule_is_refused(mutate, rule):
    pb = envelope_classes()
    env = pb.Envelope.FromString(samples.structured().to_bytes())
    mutate(env)
    with pytest.raises(EnvelopeError, match=rule):
        Message.from_bytes(env.SerializeToString())


@pytest.mark.integration
def test_nesting_deeper_than_the_bound_is_refused_on_build_and_decode():
    deep: object = "leaf"
    for _ in range(33):
        deep = [deep]
    with pytest.raises(EnvelopeError, match="nests deeper than 32 levels"):
        MessageBuilder("r", "1").body(deep)
    with pytest.raises(EnvelopeError, match="nests deeper"):
        MessageBuilder("r", "1").body(json.dumps(deep))
    # Written by protobuf itself, then refused by us on decode.
    pb = envelope_classes()
    env = pb.Envelope.FromString(MessageBuilder("r", "1").uuid("u").build().to_bytes())
    value = env.structured
    for _ in range(33):
        value = value.list_value.values.add()
    value.string_value = "leaf"
    with pytest.raises(EnvelopeError, match="nests deeper"):
        Message.from_bytes(env.SerializeToString())


@pytest.mark.integration
def test_nesting_at_the_bound_round_trips_through_protobuf():
    deep: object = "leaf"
    for _ in range(32):
        deep = {"k": deep}
    message = MessageBuilder("r", "1").body(deep).build()
    parsed = envelope_classes().Envelope.FromString(message.to_bytes())
    assert Message.from_bytes(parsed.SerializeToString()) == message


def test_a_cycle_is_refused_not_a_crash():
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(EnvelopeError, match="nests deeper"):
        MessageBuilder("r", "1").body(cyclic)


@pytest.mark.parametrize(
    ("payload", "error", "where"),
    [
        ({"a": object()}, TypeError, "body.a has type object"),
        ({"a": [1, {1, 2}]}, TypeError, r"body.a\[1\] has type set"),
        ({1: "x"}, TypeError, "body has a key of type int"),
        ({"a": {"b": 2**64}}, EnvelopeError, "body.a.b is an integer outside the 64-bit range"),
        ([-(2**63) - 1], EnvelopeError, r"body\[0\] is an integer outside the 64-bit range"),
        (1 + 2j, TypeError, "body has type complex"),
    ],
)
def test_wrong_types_given_to_the_builder_name_the_path(payload, error, where):
    with pytest.raises(error, match=where):
        MessageBuilder("r", "1").body(payload)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: MessageBuilder("", "1"), ValueError, "name"),
        (lambda: MessageBuilder("r", ""), ValueError, "version"),
        (lambda: MessageBuilder(1, "1"), ValueError, "name"),  # type: ignore[arg-type]
        (lambda: MessageBuilder("r", "1").uuid(""), ValueError, "uuid"),
        (lambda: MessageBuilder("r", "1").uuid(5), TypeError, "uuid"),  # type: ignore[arg-type]
        (lambda: MessageBuilder("r", "1").timestamp_ms("now"), TypeError, "timestamp_ms"),  # type: ignore[arg-type]
        (lambda: MessageBuilder("r", "1").timestamp_ms(True), TypeError, "timestamp_ms"),
        (lambda: MessageBuilder("r", "1").timestamp_ms(-5).build(), EnvelopeError, "timestamp_ms"),
        (lambda: MessageBuilder("r", "1").identity("gw"), TypeError, "Identity"),  # type: ignore[arg-type]
        (lambda: MessageBuilder("r", "1").instance(""), ValueError, "instance"),
        (lambda: MessageBuilder("r", "1").signal_update("", []), ValueError, "signal_id"),
        (
            lambda: MessageBuilder("r", "1").signal_update("T", [{"value": 1, "qualty": "GOOD"}]),
            ValueError,
            "samples\\[0\\] has unknown key 'qualty'",
        ),
        (
            lambda: MessageBuilder("r", "1").signal_update("T", [{"quality": "GOOD"}]),
            ValueError,
            "samples\\[0\\] has no 'value'",
        ),
        (
            lambda: MessageBuilder("r", "1").signal_update("T", [{"value": 1, "quality": "OK"}]),
            ValueError,
            "samples\\[0\\].quality 'OK'|samples\\[0\\].quality \"OK\"",
        ),
        (
            lambda: MessageBuilder("r", "1").signal_update("T", [{"value": 1, "status": 5}]),
            TypeError,
            "samples\\[0\\].status must be a str",
        ),
        (
            lambda: MessageBuilder("r", "1").signal_update(
                "T", [{"value": 1}, {"value": 2, "status": None}]
            ),
            TypeError,
            "samples\\[1\\].status must be a str",
        ),
        (
            lambda: MessageBuilder("r", "1").signal_update("T", [[1, "GOOD"]]),
            TypeError,
            "samples\\[0\\] must be a mapping",
        ),
        (lambda: Message.from_bytes("text"), TypeError, "bytes, bytearray or memoryview"),  # type: ignore[arg-type]
    ],
)
def test_builder_argument_errors_are_clear(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_sample_status_is_bounded_in_utf8_bytes_on_build():
    at_bound = "\u00e9" * (MAX_SAMPLE_STATUS_BYTES // 2)  # two bytes each
    message = MessageBuilder("r", "1").signal_update("T", [{"value": 1, "status": at_bound}])
    assert message.build().body["samples"][0]["status"] == at_bound
    with pytest.raises(EnvelopeError, match=r"samples\[1\]\.status of 129 bytes exceeds the 128"):
        MessageBuilder("r", "1").signal_update(
            "T", [{"value": 1}, {"value": 2, "status": at_bound + "x"}]
        )


@pytest.mark.integration
def test_a_sample_status_over_the_bound_written_by_protobuf_is_refused_on_decode():
    pb = envelope_classes()
    env = pb.Envelope.FromString(samples.signal_update().to_bytes())
    env.southbound_signal_update.samples[0].status = "B" * (MAX_SAMPLE_STATUS_BYTES + 1)
    with pytest.raises(EnvelopeError, match=r"body\.samples\[0\]\.status of 129 bytes"):
        Message.from_bytes(env.SerializeToString())
    env.southbound_signal_update.samples[0].status = "B" * MAX_SAMPLE_STATUS_BYTES
    decoded = Message.from_bytes(env.SerializeToString())
    assert decoded.body["samples"][0]["status"] == "B" * MAX_SAMPLE_STATUS_BYTES


def test_envelope_error_is_a_value_error_and_an_unskit_error():
    from unskit import UnskitError

    with pytest.raises(ValueError, match="malformed envelope") as caught:
        Message.from_bytes(b"junk")
    assert isinstance(caught.value, EnvelopeError)
    assert isinstance(caught.value, UnskitError)
