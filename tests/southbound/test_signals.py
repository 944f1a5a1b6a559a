"""The change gate, scaling and channel tokens, row by row."""

from __future__ import annotations

import math

import pytest

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
