"""Our Rust codec against the official protobuf runtime and protoc, from the same .proto."""

from __future__ import annotations

import subprocess

import pytest
from google.protobuf import json_format

from tests.envelope import samples
from tests.support.proto import (
    ENVELOPE_PROTO,
    PROTO_DIR,
    envelope_classes,
    envelope_classes_before_sample_status,
    protoc,
    value_from_python,
)
from unskit import Message

MESSAGES = {m.header.name: m for m in samples.every_kind()}


@pytest.fixture(scope="module")
def pb():
    return envelope_classes()


def theirs(pb, message: Message):
    """The same content as `message`, built field by field with protobuf's classes."""
    env = pb.Envelope()
    h = message.header
    env.header.name, env.header.version = h.name, h.version
    env.header.timestamp_ms, env.header.uuid = h.timestamp_ms, h.uuid
    env.header.correlation_id = h.correlation_id or ""
    env.header.reply_to = h.reply_to or ""
    if (identity := message.identity) is not None:
        env.identity.hier, env.identity.path = identity.hier, identity.path
        env.identity.component = identity.component
        env.identity.instance = identity.instance or ""
    env.tags.update(message.tags)
    env.content_type = message.content_type or ""
    env.content_encoding = message.content_encoding or ""
    env.schema = message.schema or ""
    if message.body_case == "structured":
        env.structured.CopyFrom(value_from_python(pb, message.body))
    elif message.body_case == "opaque":
        env.opaque = message.opaque_body
    elif message.body_case == "southbound_signal_update":
        body = message.body
        update = env.southbound_signal_update
        update.signal.id = body["signal"]["id"]
        update.signal.name = body["signal"].get("name", "")
        for s in body["samples"]:
            sample = update.samples.add()
            sample.value.CopyFrom(value_from_python(pb, s["value"]))
            sample.quality = (
                pb.Sample.DESCRIPTOR.fields_by_name["quality"]
                .enum_type.values_by_name["QUALITY_" + s["quality"]]
                .number
            )
            sample.source_timestamp_ms = s["source_timestamp_ms"]
            sample.server_timestamp_ms = s["server_timestamp_ms"]
            if "status" in s:  # absent from the projection when empty, as on the wire
                sample.status = s["status"]
    return env


@pytest.mark.parametrize("name", MESSAGES)
def test_protobuf_parses_our_bytes_to_the_same_content(pb, name):
    ours = MESSAGES[name]
    parsed = pb.Envelope.FromString(ours.to_bytes())
    assert parsed == theirs(pb, ours)
    assert parsed.WhichOneof("body") == ours.body_case


@pytest.mark.parametrize("name", MESSAGES)
def test_our_bytes_equal_protobufs_deterministic_serialisation(pb, name):
    ours = MESSAGES[name]
    assert ours.to_bytes() == theirs(pb, ours).SerializeToString(deterministic=True)


@pytest.mark.parametrize("name", MESSAGES)
def test_we_parse_protobufs_bytes_to_the_same_content(pb, name):
    ours = MESSAGES[name]
    # Non-deterministic serialisation: map entries may come in any order, we must not care.
    decoded = Message.from_bytes(theirs(pb, ours).SerializeToString())
    assert decoded == ours
    assert decoded.to_dict() == ours.to_dict()


def _update(samples_: list[dict[str, object]]) -> Message:
    return samples.builder("signal-update").signal_update("T", samples_).build()


@pytest.mark.integration
def test_a_sample_status_round_trips_through_protobuf(pb):
    ours = _update([{"value": 1, "quality": "BAD", "status": "BadUserAccessDenied"}])
    parsed = pb.Envelope.FromString(ours.to_bytes())
    assert parsed.southbound_signal_update.samples[0].status == "BadUserAccessDenied"
    parsed.southbound_signal_update.samples[0].status = "BadNodeIdUnknown"
    back = Message.from_bytes(parsed.SerializeToString())
    assert back.body["samples"][0]["status"] == "BadNodeIdUnknown"
    assert back.body["samples"][0]["quality"] == "BAD"


@pytest.mark.integration
def test_a_sample_without_status_encodes_as_the_schema_before_status_did():
    old = envelope_classes_before_sample_status()
    assert "status" not in old.Sample.DESCRIPTOR.fields_by_name
    plain = [{"value": 21.5, "quality": "GOOD", "source_timestamp_ms": 1, "server_timestamp_ms": 2}]
    ours = _update(plain)
    assert ours.to_bytes() == theirs(old, ours).SerializeToString(deterministic=True)
    # An empty status is absence: not a byte more on the wire.
    assert _update([{**plain[0], "status": ""}]).to_bytes() == ours.to_bytes()


@pytest.mark.integration
def test_a_reader_of_the_schema_before_status_reads_the_rest_and_keeps_it():
    old = envelope_classes_before_sample_status()
    ours = _update([{"value": [1, 2], "quality": "BAD", "status": "BadTimeout"}, {"value": 3}])
    parsed = old.Envelope.FromString(ours.to_bytes())
    first, second = parsed.southbound_signal_update.samples
    assert list(first.value.list_value.values) == [
        value_from_python(old, 1),
        value_from_python(old, 2),
    ]
    assert first.quality == 3  # QUALITY_BAD
    assert second.value.int_value == 3
    # The unknown field is kept and written back where it was.
    assert parsed.SerializeToString(deterministic=True) == ours.to_bytes()


def test_tags_and_map_keys_are_sorted_whatever_order_they_were_given_in(pb):
    forward = samples.builder().body({"a": 1, "b": 2, "c": 3}).build()
    backward = samples.builder().body({"c": 3, "b": 2, "a": 1}).build()
    assert forward.to_bytes() == backward.to_bytes()
    assert list(Message.from_bytes(backward.to_bytes()).body) == ["a", "b", "c"]


def test_message_to_dict_of_protobuf_agrees_with_our_projection(pb):
    ours = MESSAGES["reading"]
    projected = json_format.MessageToDict(
        pb.Envelope.FromString(ours.to_bytes()), preserving_proto_field_name=True
    )
    assert projected["header"]["name"] == ours.to_dict()["header"]["name"]
    assert int(projected["header"]["timestamp_ms"]) == ours.header.timestamp_ms
    assert projected["identity"] == ours.to_dict()["identity"]
    assert projected["tags"] == ours.to_dict()["tags"]


@pytest.mark.parametrize("name", MESSAGES)
@pytest.mark.integration
def test_protoc_decode_reads_what_we_write(name):
    ours = MESSAGES[name]
    result = subprocess.run(
        [protoc(), f"-I{PROTO_DIR}", "--decode=unskit.v1.Envelope", ENVELOPE_PROTO],
        input=ours.to_bytes(),
        capture_output=True,
        check=True,
    )
    text = result.stdout.decode()
    assert f'name: "{ours.header.name}"' in text
    assert f'uuid: "{ours.header.uuid}"' in text
    # proto3 leaves a zero timestamp off the wire, so protoc shows no line for it.
    assert (f"timestamp_ms: {ours.header.timestamp_ms}" in text) == (ours.header.timestamp_ms != 0)
    if ours.body_case is not None:
        assert f"{ours.body_case} {{" in text or f"{ours.body_case}: " in text


@pytest.mark.integration
def test_protoc_refuses_what_we_refuse():
    garbage = b"\x0a\xff"
    result = subprocess.run(
        [protoc(), f"-I{PROTO_DIR}", "--decode=unskit.v1.Envelope", ENVELOPE_PROTO],
        input=garbage,
        capture_output=True,
    )
    assert result.returncode != 0
    with pytest.raises(ValueError, match="malformed envelope"):
        Message.from_bytes(garbage)


#: Integers at the edges of the two integer kinds: int_value (sint64) up to 2^63-1,
#: uint_value (uint64) from 2^63 to 2^64-1.
EDGE_INTEGERS = [-(2**63), -1, 0, 2**63 - 1, 2**63, 2**64 - 1]


@pytest.mark.parametrize("number", EDGE_INTEGERS)
@pytest.mark.integration
def test_every_64_bit_integer_is_exact_through_protobuf_both_ways(pb, number):
    ours = _update([{"value": number, "quality": "GOOD"}])
    parsed = pb.Envelope.FromString(ours.to_bytes())
    value = parsed.southbound_signal_update.samples[0].value
    kind = "uint_value" if number > 2**63 - 1 else "int_value"
    assert value.WhichOneof("kind") == kind
    assert getattr(value, kind) == number
    # Theirs back to ours: the same integer, and the same bytes.
    written = parsed.SerializeToString(deterministic=True)
    assert written == ours.to_bytes()
    assert Message.from_bytes(written).body["samples"][0]["value"] == number


@pytest.mark.integration
def test_a_uint_value_below_2_to_the_63_from_another_writer_reads_as_the_same_integer(pb):
    env = theirs(pb, _update([{"value": 0}]))
    env.southbound_signal_update.samples[0].value.uint_value = 42
    decoded = Message.from_bytes(env.SerializeToString())
    assert decoded.body["samples"][0]["value"] == 42
    assert type(decoded.body["samples"][0]["value"]) is int


@pytest.mark.integration
def test_protoc_decode_shows_the_exact_unsigned_integer():
    ours = samples.builder().body({"counter": 2**64 - 1, "signed": -(2**63)}).build()
    result = subprocess.run(
        [protoc(), f"-I{PROTO_DIR}", "--decode=unskit.v1.Envelope", ENVELOPE_PROTO],
        input=ours.to_bytes(),
        capture_output=True,
        check=True,
    )
    text = result.stdout.decode()
    assert "uint_value: 18446744073709551615" in text
    assert "int_value: -9223372036854775808" in text
    assert json_format.MessageToDict(
        envelope_classes().Envelope.FromString(ours.to_bytes()), preserving_proto_field_name=True
    )["structured"]["map_value"]["fields"]["counter"] == {"uint_value": "18446744073709551615"}
