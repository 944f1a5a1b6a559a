"""Envelope: ours (Rust codec behind Message/MessageBuilder) beside protobuf's upb runtime
with classes built from the same .proto and `json_format.MessageToDict`, doing the same API
work: stamping uuid, correlation id and timestamp, identity and tags from configuration."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.internal import api_implementation
from tests.envelope.samples import IDENTITY, JSON_BODY, TAGS
from tests.support.proto import envelope_classes, value_from_python

from unskit import Message, MessageBuilder

# A typical reading: about ten fields of JSON (the test sample without its bytes field).
TYPICAL_BODY = {**{k: v for k, v in JSON_BODY.items() if k != "raw"}, "cycle": 1843}
OPAQUE_BODY = bytes(range(256)) * 16  # 4 KiB
PB = envelope_classes()
TARGETS = {"decode_to_dict": 3.0, "build_encode": 2.0}


class Stamp:
    identity = IDENTITY
    tags = TAGS


STAMP = Stamp()


def ours_build(body: Any) -> Callable[[], bytes]:
    def run() -> bytes:
        return MessageBuilder("reading", "1", STAMP).instance("plc-1").body(body).build().to_bytes()

    return run


def anchor_build(body: Any) -> Callable[[], bytes]:
    def run() -> bytes:
        env = PB.Envelope()
        header = env.header
        header.name, header.version = "reading", "1"
        header.timestamp_ms = time.time_ns() // 1_000_000
        header.uuid = str(uuid.uuid4())
        header.correlation_id = str(uuid.uuid4())
        identity = env.identity
        identity.hier, identity.path = STAMP.identity.hier, STAMP.identity.path
        identity.component, identity.instance = STAMP.identity.component, "plc-1"
        env.tags.update(STAMP.tags)
        if isinstance(body, bytes):
            env.opaque = body
        else:
            env.structured.CopyFrom(value_from_python(PB, body))
        return env.SerializeToString()

    return run


BODIES = {"typical": TYPICAL_BODY, "opaque_4k": OPAQUE_BODY}
WIRE = {name: ours_build(body)() for name, body in BODIES.items()}

CASES: dict[str, dict[str, Callable[[str], Callable[[], Any]]]] = {
    "build_encode": {
        "ours": lambda body: ours_build(BODIES[body]),
        "anchor": lambda body: anchor_build(BODIES[body]),
    },
    "decode": {
        "ours": lambda body: lambda: Message.from_bytes(WIRE[body]),
        "anchor": lambda body: lambda: PB.Envelope.FromString(WIRE[body]),
    },
    "decode_to_dict": {
        "ours": lambda body: lambda: Message.from_bytes(WIRE[body]).to_dict(),
        "anchor": lambda body: (
            lambda: json_format.MessageToDict(
                PB.Envelope.FromString(WIRE[body]), preserving_proto_field_name=True
            )
        ),
    },
}

_measured: dict[tuple[str, str], dict[str, float]] = {}


@pytest.mark.parametrize("impl", ["ours", "anchor"])
@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("case", list(CASES))
def test_envelope(benchmark, ratio, case: str, body: str, impl: str) -> None:
    assert api_implementation.Type() == "upb", "the anchor must be protobuf's upb runtime"
    benchmark.group = f"envelope {case} {body}"
    benchmark(CASES[case][impl](body))
    results = _measured.setdefault((case, body), {})
    results[impl] = benchmark.stats.stats.ops
    if len(results) == 2:
        row = ratio(
            f"envelope.{case}.{body}",
            results["ours"],
            "protobuf-upb" + ("+MessageToDict" if case == "decode_to_dict" else ""),
            results["anchor"],
            target=TARGETS.get(case) if body == "typical" else None,
        )
        print(f"\n{row['name']}: ours/anchor = {row['ratio']}x")
