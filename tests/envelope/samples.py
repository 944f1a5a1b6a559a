"""Messages every envelope test reuses: one of each body kind, fully stamped."""

from __future__ import annotations

from unskit import Identity, Message, MessageBuilder

IDENTITY = Identity(
    "enterprise/site/line/device", "acme/plant-1/line-4/gw-01", "ethernet-ip-adapter"
)
TAGS = {"costCenter": "cc-17", "owner": "maintenance", "asset": "press-3"}
JSON_BODY = {
    "temperature": 21.5,
    "pressure": 101325,
    "running": True,
    "mode": "auto",
    "alarms": [],
    "setpoints": [20.0, 22.5, 25],
    "operator": None,
    "batch": {"id": "B-1001", "qty": 250},
    "serial": "SN-00042",
    # An OPC UA UInt64 above Int64's range: the uint_value kind.
    "counter": 2**64 - 1,
    "raw": b"\x00\x01\xfe\xff",
}


class Stamp:
    """A configuration stand-in that satisfies EnvelopeStamp."""

    identity = IDENTITY
    tags = TAGS


def builder(name: str = "reading") -> MessageBuilder:
    return (
        MessageBuilder(name, "1", Stamp())
        .uuid("6f1c3a52-8f3e-4d0b-9a57-3f1d2c4b5a69")
        .timestamp_ms(1_795_319_248_123)
        .correlation_id("corr-1")
    )


def structured() -> Message:
    return builder().instance("plc-1").body(JSON_BODY).content_type("application/json").build()


def opaque(size: int = 4096) -> Message:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    return (
        builder("image")
        .body(payload)
        .content_type("image/jpeg")
        .content_encoding("identity")
        .schema("urn:unskit:image:1")
        .build()
    )


def signal_update() -> Message:
    return (
        builder("signal-update")
        .instance("plc-1")
        .signal_update(
            "Program:Main.Temperature",
            [
                {
                    "value": 21.5,
                    "quality": "GOOD",
                    "source_timestamp_ms": 1,
                    "server_timestamp_ms": 2,
                },
                {"value": [1, 2, 3], "quality": "BAD", "status": "BadNodeIdUnknown"},
                {"value": None, "quality": "UNCERTAIN", "server_timestamp_ms": 5},
            ],
            name="temperature",
        )
        .build()
    )


def every_kind() -> list[Message]:
    bare = MessageBuilder("bare", "2").uuid("u-1").timestamp_ms(0).build()
    return [structured(), opaque(), signal_update(), bare]
