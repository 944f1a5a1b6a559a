"""The change gate, scaling and channel tokens, row by row."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unskit.southbound.driver import Deadband, PublishMode, Quality, Reading, SignalSpec
from unskit.southbound.signals import SignalTable, channel_token, scale_value

NAN, INF = math.nan, math.inf


def spec(**settings) -> SignalSpec:
    return SignalSpec(id="Tag", name="tag", type=settings.pop("type", "REAL"), **settings)


def published(signal: SignalSpec, values, qualities=None) -> list:
    """The values the gate lets through, feeding `values` one poll at a time."""
    table = SignalTable([("g", signal)])
    out = []
    for i, value in enumerate(values):
        quality = qualities[i] if qualities else Quality.GOOD
        table.accept([Reading("Tag", value, quality)], i, float(i))
        state = table.by_id["Tag"]
        out.extend(sample["value"] for sample in table.take(state))
    return out


GATE = [
    # deadband, publish mode, fed values, published values
    ("none", 0, "onChange", [1.0, 1.0, 2.0, 2.0, 1.0], [1.0, 2.0, 1.0]),
    ("none", 0, "always", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),
    ("absolute", 0.5, "onChange", [10.0, 10.4, 10.5, 10.9, 11.0], [10.0, 10.5, 11.0]),
    ("absolute", 0.5, "always", [10.0, 10.1], [10.0, 10.1]),
    ("absolute", 0, "onChange", [1.0, 1.0, 1.5], [1.0, 1.5]),
    ("percent", 10, "onChange", [100.0, 109.0, 110.0, 115.0, 121.0], [100.0, 110.0, 121.0]),
    ("percent", 10, "onChange", [-100.0, -91.0, -89.0], [-100.0, -89.0]),
    ("percent", 10, "onChange", [0.0, 0.0, 0.001], [0.0, 0.001]),
    ("absolute", 1, "onChange", [1.0, NAN, NAN, 1.0], [1.0, NAN, 1.0]),
    ("absolute", 1, "onChange", [1.0, INF, INF, -INF, 5.0], [1.0, INF, -INF, 5.0]),
    ("none", 0, "onChange", [NAN, NAN], [NAN]),
]


@pytest.mark.parametrize(("kind", "threshold", "mode", "fed", "expected"), GATE)
def test_change_gate(kind, threshold, mode, fed, expected) -> None:
    signal = spec(deadband=Deadband(kind, threshold), publish_mode=PublishMode(mode))
    got = published(signal, fed)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a == b or (math.isnan(a) and math.isnan(b))


def test_arrays_publish_when_any_element_passes() -> None:
    signal = spec(array_count=3, deadband=Deadband("absolute", 1.0))
    fed = [[1.0, 2.0, 3.0], [1.5, 2.5, 3.5], [1.5, 2.5, 4.0], [1.5, 2.5]]
    assert published(signal, fed) == [[1.0, 2.0, 3.0], [1.5, 2.5, 4.0], [1.5, 2.5]]


def test_quality_changes_always_publish() -> None:
    signal = spec(deadband=Deadband("absolute", 100.0))
    qualities = [Quality.GOOD, Quality.BAD, Quality.BAD, Quality.GOOD]
    assert published(signal, [1.0, 1.0, 1.0, 1.0], qualities) == [1.0, 1.0, 1.0]


def test_booleans_ignore_the_deadband() -> None:
    signal = spec(type="BOOL", deadband=Deadband("absolute", 5.0))
    assert published(signal, [True, True, False, False, True]) == [True, False, True]


@pytest.mark.parametrize(
    ("settings", "raw", "scaled"),
    [
        ({"scale": 0.1, "offset": -5.0}, 100, 5.0),
        ({"scale": 2.0}, [1, 2, 3], [2.0, 4.0, 6.0]),
        ({"offset": 1.5}, 1, 2.5),
        ({}, 7, 7),
        ({"scale": 2.0, "type": "BOOL"}, True, True),
        ({"scale": 2.0}, None, None),
    ],
)
def test_scaling(settings, raw, scaled) -> None:
    assert scale_value(spec(**settings), raw) == pytest.approx(scaled)


def test_batch_windows_collect_samples() -> None:
    signal = spec(publish_mode=PublishMode.ALWAYS, batch_ms=100)
    table = SignalTable([("g", signal)])
    for i in range(5):
        table.accept([Reading("Tag", float(i))], i, i * 0.03)
    assert table.due(0.09) == []
    (state,) = table.due(0.1)
    assert [s["value"] for s in table.take(state)] == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    ("path", "token"),
    [
        ("Program:Main.Speed", "Program_Main.Speed"),
        ("ns=2;s=Line/4#temp", "ns_2_s_Line_4_temp"),
        ("Tag[3]", "Tag_3"),
        ("plain-name_1.x", "plain-name_1.x"),
        ("+/#", "_"),
    ],
)
def test_channel_tokens(path, token) -> None:
    assert channel_token(path) == token


SIGNALS = [
    SignalSpec("R", "r", "REAL", deadband=Deadband("absolute", 1.0)),
    SignalSpec("D", "d", "DINT"),
    SignalSpec("S", "s", "INT", scale=0.5, offset=2.0, deadband=Deadband("percent", 10.0)),
    SignalSpec("B", "b", "BOOL"),
    SignalSpec("A", "a", "REAL", array_count=2, deadband=Deadband("absolute", 1.0)),
    SignalSpec("P", "p", "LREAL", publish_mode=PublishMode.ALWAYS),
]
_VALUES = {
    "R": st.floats(-5, 5, allow_nan=False),
    "D": st.integers(-(2**31), 2**31 - 1) | st.integers(-3, 3),
    "S": st.integers(-40, 40),
    "B": st.booleans(),
    "A": st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=3),
    "P": st.floats(-1e300, 1e300, allow_nan=False),
}


@st.composite
def readings(draw: st.DrawFn) -> Reading:
    signal_id = draw(st.sampled_from([*_VALUES, "unknown"]))
    quality = draw(st.sampled_from(list(Quality)))
    if signal_id == "unknown" or (quality is Quality.BAD and draw(st.booleans())):
        return Reading(signal_id, None, quality)
    return Reading(signal_id, draw(_VALUES[signal_id]), quality)


def _outcome(polls: list[list[Reading]], *, one_by_one: bool) -> list[tuple]:
    """Every signal's last value, published value and quality, and queued samples."""
    table = SignalTable([("g", signal) for signal in SIGNALS])
    for i, poll in enumerate(polls):
        for chunk in ([r] for r in poll) if one_by_one else [poll]:
            table.accept(chunk, i, float(i))
    return [
        (s.spec.id, s.last_value, s.published_value, s.published_quality, table.take(s))
        for s in table.by_id.values()
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(readings(), max_size=12), max_size=8))
def test_a_poll_gated_in_one_batch_equals_its_readings_one_by_one(polls) -> None:
    # A poll may name a signal twice (a push source's queued changes): gated in order.
    assert _outcome(polls, one_by_one=False) == _outcome(polls, one_by_one=True)


def test_a_sample_carries_the_status_and_the_device_server_timestamp() -> None:
    table = SignalTable([("g", spec(publish_mode=PublishMode.ALWAYS))])
    table.accept(
        [
            Reading("Tag", None, Quality.BAD, 5, detail="BadNodeIdUnknown", server_timestamp_ms=7),
            Reading("Tag", 1.0, Quality.GOOD, 6),
        ],
        100,
        0.0,
    )
    bad, good = table.take(table.by_id["Tag"])
    assert bad["status"] == "BadNodeIdUnknown"
    assert bad["server_timestamp_ms"] == 7, "the device's own receive time"
    assert "status" not in good
    assert good["server_timestamp_ms"] == 100, "stamped by the adapter when the device has none"


def test_a_long_detail_is_cut_to_the_envelope_bound_on_a_character_boundary() -> None:
    from unskit.envelope import MAX_SAMPLE_STATUS_BYTES, MessageBuilder

    table = SignalTable([("g", spec())])
    table.accept([Reading("Tag", None, Quality.BAD, detail="é" * 100)], 1, 0.0)
    (sample,) = table.take(table.by_id["Tag"])
    assert sample["status"] == "é" * (MAX_SAMPLE_STATUS_BYTES // 2)
    message = MessageBuilder("SouthboundSignalUpdate", "1.0").signal_update("Tag", [sample])
    assert message.build().body["samples"][0]["status"] == sample["status"]


def test_touch_keeps_an_unchanged_signal_fresh_but_not_a_bad_one() -> None:
    table = SignalTable([("g", spec()), ("g", SignalSpec(id="Bad", name="bad", type="REAL"))])
    table.accept([Reading("Tag", 1.0), Reading("Bad", None, Quality.BAD)], 0, 0.0)
    assert {s.spec.id for s in table.stale(100.0, 60)} == {"Tag", "Bad"}
    table.touch(["Tag", "Bad", "Unknown"], 90.0)
    assert {s.spec.id for s in table.stale(100.0, 60)} == {"Bad"}, "BAD stays stale"
