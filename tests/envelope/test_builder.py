"""MessageBuilder: every stamping rule of the specification, one test each."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.envelope import samples
from unskit import EnvelopeError, Identity, Message, MessageBuilder


def test_builder_stamps_uuid_correlation_id_and_timestamp():
    before = int(time.time() * 1000)
    message = MessageBuilder("reading", "1").build()
    after = int(time.time() * 1000)
    header = message.header
    assert uuid.UUID(header.uuid).version == 4
    assert header.correlation_id is not None
    assert uuid.UUID(header.correlation_id).version == 4
    assert header.correlation_id != header.uuid
    assert before <= header.timestamp_ms <= after


def test_each_build_gets_a_fresh_uuid():
    builder = MessageBuilder("reading", "1")
    assert builder.build().header.uuid != builder.build().header.uuid


def test_explicit_uuid_and_timestamp_setters_are_deterministic():
    message = MessageBuilder("r", "1").uuid("id-1").timestamp_ms(1_000).build()
    assert (message.header.uuid, message.header.timestamp_ms) == ("id-1", 1_000)
    assert message.header.timestamp == "1970-01-01T00:00:01.000Z"
    twin = MessageBuilder("r", "1").uuid("id-1").timestamp_ms(1_000).correlation_id("c").build()
    again = MessageBuilder("r", "1").uuid("id-1").timestamp_ms(1_000).correlation_id("c").build()
    assert twin.to_bytes() == again.to_bytes()


def test_building_without_configuration_yields_no_identity_and_no_tags():
    message = MessageBuilder("r", "1").build()
    assert message.identity is None
    assert message.tags == {}
    assert "identity" not in message.to_dict()


def test_configuration_stamps_tags_and_identity():
    message = MessageBuilder("r", "1", samples.Stamp()).build()
    assert message.identity == samples.IDENTITY
    assert message.tags == samples.TAGS
    assert message.identity is not None
    assert message.identity.instance is None


def test_instance_token_scopes_the_configured_identity():
    message = MessageBuilder("r", "1", samples.Stamp()).instance("plc-1").build()
    assert message.identity == samples.IDENTITY.with_instance("plc-1")
    assert message.to_dict()["identity"]["instance"] == "plc-1"


def test_identity_override_beats_the_configured_identity():
    other = Identity("device", "gw-02", "camera")
    message = MessageBuilder("r", "1", samples.Stamp()).identity(other).build()
    assert message.identity == other
    assert message.tags == samples.TAGS


def test_instance_token_applies_to_the_override_too():
    other = Identity("device", "gw-02", "camera")
    message = MessageBuilder("r", "1").identity(other).instance("cam-1").build()
    assert message.identity == Identity("device", "gw-02", "camera", "cam-1")


def test_instance_token_without_any_identity_is_refused():
    with pytest.raises(ValueError, match="instance token needs an identity"):
        MessageBuilder("r", "1").instance("plc-1").build()


def test_identity_device_is_the_last_hierarchy_value():
    assert samples.IDENTITY.device == "gw-01"
    assert Identity("device", "gw-9", "c").device == "gw-9"


def test_identity_refuses_mismatched_levels():
    with pytest.raises(ValueError, match="different numbers of levels"):
        Identity("site/device", "plant/line/gw", "c")


@pytest.mark.parametrize(
    ("payload", "body"),
    [
        ('{"a": 1, "b": [true, null]}', {"a": 1, "b": [True, None]}),
        ("[1, 2.5]", [1, 2.5]),
        ("42", 42),
        ('"quoted"', "quoted"),
        ("not json at all", "not json at all"),
        ("{broken", "{broken"),
        ("", ""),
        # Up to 2**64-1 an integer stays exact (uint_value); beyond it, a double.
        ("18446744073709551615", 18446744073709551615),
        ("-9223372036854775809", -9223372036854775809.0),
        ("18446744073709551616", 18446744073709551616.0),
    ],
)
def test_string_payload_is_parsed_as_json_when_it_parses(payload, body):
    message = MessageBuilder("r", "1").body(payload).build()
    assert message.body == body
    assert type(message.body) is type(body)
    assert message.body_case == "structured"


@pytest.mark.parametrize(
    "payload",
    [
        {"nested": {"deep": [1, {"x": b"\x00"}]}, "f": 1.5, "i": -7, "b": False, "n": None},
        [1, "two", 3.0, None, True, b"bytes", [], {}],
        ("tuple", "becomes", "list"),
        0,
        -(2**63),
        2**63 - 1,
        2**63,
        2**64 - 1,
        [-(2**63), 2**63, 2**64 - 1, {"u": 2**64 - 1}],
        1e308,
        True,
        None,
    ],
)
def test_python_objects_become_a_structured_value(payload):
    message = MessageBuilder("r", "1").body(payload).build()
    expected = list(payload) if isinstance(payload, tuple) else payload
    assert message.body == expected
    assert Message.from_bytes(message.to_bytes()).body == expected


@pytest.mark.parametrize("payload", [b"\x00\xff" * 10, bytearray(b"abc"), memoryview(b"xyz")])
def test_bytes_like_payload_becomes_an_opaque_body(payload):
    message = MessageBuilder("r", "1").body(payload).build()
    assert message.body_case == "opaque"
    assert message.is_binary_body
    assert message.binary_body == bytes(payload)
    assert message.opaque_body == bytes(payload)
    assert message.to_dict()["body"] == {
        "_libBinary": __import__("base64").b64encode(bytes(payload)).decode()
    }


def test_opaque_body_of_exactly_64_kib_is_accepted_and_one_more_byte_refused():
    assert len(MessageBuilder("r", "1").body(bytes(65536)).build().opaque_body) == 65536
    with pytest.raises(EnvelopeError, match="65537 bytes exceeds the 65536-byte bound"):
        MessageBuilder("r", "1").body(bytes(65537))


def test_signal_update_body_carries_samples():
    message = samples.signal_update()
    assert message.body_case == "southbound_signal_update"
    body = message.body
    assert body["signal"] == {"id": "Program:Main.Temperature", "name": "temperature"}
    assert body["samples"][0] == {
        "value": 21.5,
        "quality": "GOOD",
        "source_timestamp_ms": 1,
        "server_timestamp_ms": 2,
    }
    assert body["samples"][1]["quality"] == "BAD"
    assert body["samples"][1]["status"] == "BadNodeIdUnknown"
    assert body["samples"][2]["value"] is None
    assert message.to_dict()["body"]["samples"][1]["value"] == [1, 2, 3]


@pytest.mark.parametrize("status", [None, ""])
def test_a_sample_without_status_shows_no_status_key(status):
    sample: dict[str, object] = {"value": 1, "quality": "BAD"}
    if status is not None:
        sample["status"] = status
    message = MessageBuilder("r", "1").signal_update("T", [sample]).build()
    assert "status" not in message.body["samples"][0]
    assert "status" not in message.to_dict()["body"]["samples"][0]
    assert "status" not in json.loads(message.to_diagnostic_json())["body"]["samples"][0]


def test_a_sample_status_shows_in_every_view_and_survives_the_wire():
    sample = {"value": 1, "quality": "UNCERTAIN", "status": "UncertainLastUsableValue"}
    message = MessageBuilder("r", "1").signal_update("T", [sample]).build()
    decoded = Message.from_bytes(message.to_bytes())
    for view in (
        decoded.body,
        decoded.to_dict()["body"],
        json.loads(decoded.to_diagnostic_json())["body"],
    ):
        assert view["samples"][0]["status"] == "UncertainLastUsableValue"


def test_signal_sample_quality_defaults_to_good():
    message = MessageBuilder("r", "1").signal_update("T", [{"value": 1}]).build()
    assert message.body["samples"][0]["quality"] == "GOOD"
    assert message.body["signal"] == {"id": "T"}


def test_content_metadata_is_carried():
    message = samples.opaque()
    assert message.content_type == "image/jpeg"
    assert message.content_encoding == "identity"
    assert message.schema == "urn:unskit:image:1"
    assert samples.structured().content_encoding is None


def test_configuration_tags_may_be_any_mapping():
    from types import MappingProxyType

    class ReadOnlyStamp:
        identity = samples.IDENTITY
        tags = MappingProxyType({"b": "2", "a": "1"})

    assert MessageBuilder("r", "1", ReadOnlyStamp()).build().tags == {"a": "1", "b": "2"}


def test_tags_that_are_not_strings_are_refused():
    from types import MappingProxyType

    class BadStamp:
        identity = None
        tags = MappingProxyType({"a": 1})

    with pytest.raises(TypeError):
        MessageBuilder("r", "1", BadStamp()).build()
