"""Message accessors and the JSON projection."""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import uuid

import pytest

from tests.envelope import samples
from unskit import EnvelopeError, Message, MessageBuilder


def test_bytes_round_trip_keeps_everything():
    for message in samples.every_kind():
        decoded = Message.from_bytes(message.to_bytes())
        assert decoded == message
        assert decoded.to_bytes() == message.to_bytes()


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_from_bytes_takes_any_bytes_like(wrap):
    message = samples.structured()
    assert Message.from_bytes(wrap(message.to_bytes())) == message


def test_to_dict_projection_has_snake_case_header_and_rfc3339_timestamp():
    projected = samples.structured().to_dict()
    assert list(projected) == ["header", "identity", "tags", "body", "content_type"]
    assert projected["header"] == {
        "name": "reading",
        "version": "1",
        "timestamp_ms": 1_795_319_248_123,
        "timestamp": "2026-11-22T03:47:28.123Z",
        "uuid": "6f1c3a52-8f3e-4d0b-9a57-3f1d2c4b5a69",
        "correlation_id": "corr-1",
    }
    assert projected["identity"] == {
        "hier": "enterprise/site/line/device",
        "path": "acme/plant-1/line-4/gw-01",
        "component": "ethernet-ip-adapter",
        "instance": "plc-1",
    }
    assert projected["tags"] == samples.TAGS
    assert projected["body"]["raw"] == {"_libBinary": "AAH+/w=="}
    assert json.loads(json.dumps(projected)) == projected


def test_binary_accessors_return_the_original_bytes_while_projection_marks_them():
    message = samples.structured()
    assert message.body["raw"] == b"\x00\x01\xfe\xff"
    assert message.to_dict()["body"]["raw"] == {"_libBinary": "AAH+/w=="}


def test_diagnostic_json_replaces_bytes_with_length_and_sha256():
    message = samples.opaque(4096)
    diagnostic = json.loads(message.to_diagnostic_json())
    assert diagnostic["body"] == {
        "_libBinaryDigest": {
            "length": 4096,
            "sha256": hashlib.sha256(message.opaque_body).hexdigest(),
        }
    }
    assert diagnostic["header"] == message.to_dict()["header"]


def test_diagnostic_json_without_bytes_equals_the_projection():
    message = MessageBuilder("r", "1").body({"a": [1, 2.5, "x", None]}).build()
    assert json.loads(message.to_diagnostic_json()) == message.to_dict()


@pytest.mark.integration
def test_correlation_id_is_generated_lazily_and_kept_when_absent():
    from tests.support.proto import envelope_classes

    pb = envelope_classes()
    env = pb.Envelope()
    env.header.name, env.header.version, env.header.uuid = "r", "1", "u"
    message = Message.from_bytes(env.SerializeToString())
    assert message.header.correlation_id is None
    first = message.correlation_id
    assert uuid.UUID(first)
    assert message.correlation_id == first
    assert message.header.correlation_id == first


def test_set_correlation_id_and_inject_tag_change_the_message():
    message = samples.structured()
    message.set_correlation_id("c-9")
    message.inject_tag("shift", "night")
    decoded = Message.from_bytes(message.to_bytes())
    assert decoded.correlation_id == "c-9"
    assert decoded.tags == {**samples.TAGS, "shift": "night"}
    with pytest.raises(ValueError, match="tag key"):
        message.inject_tag("", "x")


def test_tags_accessor_returns_a_copy():
    message = samples.structured()
    message.tags["costCenter"] = "changed"
    assert message.tags == samples.TAGS


def test_make_request_sets_a_lib_reply_topic_on_a_copy():
    message = samples.structured()
    request = message.make_request()
    assert request.reply_to is not None
    assert request.reply_to.startswith("lib/reply-")
    assert "/" not in request.reply_to.removeprefix("lib/")
    assert message.reply_to is None
    assert request.correlation_id == message.correlation_id
    explicit = message.make_request("lib/reply-abc")
    assert explicit.header.reply_to == "lib/reply-abc"
    assert Message.from_bytes(explicit.to_bytes()).reply_to == "lib/reply-abc"


def test_opaque_body_raises_when_the_body_is_not_opaque():
    message = samples.structured()
    assert message.is_binary_body is False
    assert message.binary_body is None
    with pytest.raises(EnvelopeError, match="the body is structured, not opaque"):
        _ = message.opaque_body


def test_body_case_of_each_kind():
    cases = [m.body_case for m in samples.every_kind()]
    assert cases == ["structured", "opaque", "southbound_signal_update", None]
    bare = samples.every_kind()[-1]
    assert bare.body is None
    assert bare.to_dict()["body"] is None


def test_nan_and_infinity_survive_binary_and_project_as_null():
    message = MessageBuilder("r", "1").body({"nan": float("nan"), "inf": float("inf")}).build()
    decoded = Message.from_bytes(message.to_bytes()).body
    assert decoded["nan"] != decoded["nan"]
    assert decoded["inf"] == float("inf")
    assert message.to_dict()["body"] == {"inf": None, "nan": None}


def test_pickle_and_copy_round_trip():
    message = samples.signal_update()
    assert pickle.loads(pickle.dumps(message)) == message
    clone = copy.copy(message)
    clone.inject_tag("x", "y")
    assert message.tags == samples.TAGS


def test_repr_names_the_message_without_its_body():
    text = repr(samples.structured())
    assert "reading" in text
    assert "structured" in text
    assert "SN-00042" not in text


def test_messages_are_unhashable_but_identities_hash():
    with pytest.raises(TypeError):
        hash(samples.structured())
    assert hash(samples.IDENTITY) == hash(samples.IDENTITY.with_instance(None))
