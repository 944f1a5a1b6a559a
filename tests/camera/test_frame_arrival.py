"""When a frame arrived, as each backend tells it (no network: the stream clock and the HTTP
headers alone)."""

from __future__ import annotations

from email.message import Message

import pytest

from unskit.camera.backends.rtsp import CLOCK_CREEP, StreamClock
from unskit.camera.backends.snapshot import declared_age_s

pytestmark = pytest.mark.unit


def _arrivals(frames: list[tuple[float, float]]) -> list[float]:
    clock = StreamClock()
    return [round(clock.arrival(received, pts), 6) for received, pts in frames]


def test_a_live_stream_arrives_when_it_is_received() -> None:
    # 10 fps, received 0.3 s after each timestamp (decoder and network delay): on time.
    frames = [(100.3 + i / 10, 1000.0 + 100 * i) for i in range(5)]
    assert _arrivals(frames) == [round(received, 6) for received, _ in frames]


def test_frames_handed_out_after_a_stall_arrived_before_it() -> None:
    # Four frames on time, then the stream stalls; the decoder hands out the two it held
    # at its read timeouts, 5 s and 10 s later.
    frames = [(100.3 + i / 10, 1000.0 + 100 * i) for i in range(4)]
    frames += [(105.6, 1400.0), (110.6, 1500.0)]
    arrivals = _arrivals(frames)
    # Placed back at their timestamps (plus the session's least delay and the little the
    # offset may creep while nothing came), never at their decoding.
    assert arrivals[4] == pytest.approx(100.7, abs=5.3 * CLOCK_CREEP + 1e-6)
    assert arrivals[5] == pytest.approx(100.8, abs=10.3 * CLOCK_CREEP + 1e-6)


def test_the_least_delay_sets_the_clock_and_drift_is_followed() -> None:
    # A jittered frame arrives late by its jitter; a faster one lowers the offset at once.
    arrivals = _arrivals([(100.5, 0.0), (100.9, 100.0), (100.95, 500.0)])
    assert arrivals == [100.5, pytest.approx(100.6 + 0.4 * CLOCK_CREEP), 100.95]
    # A camera clock slower than ours: the delay grows by 0.5 ms per second, and is followed.
    slow = [(100.0 + i * 1.0005, 1000.0 * i) for i in range(0, 600)]
    late = [
        received - arrived for (received, _), arrived in zip(slow, _arrivals(slow), strict=True)
    ]
    assert max(late) < 0.001


@pytest.mark.parametrize("pts", [0.0, 500.0])
def test_a_timestamp_that_does_not_advance_re_anchors(pts: float) -> None:
    # Timestamps that stand still or jump back say nothing about arrival: received is it.
    frames = [(100.0, 600.0), (100.1, 700.0), (107.0, pts), (107.1, pts)]
    assert _arrivals(frames)[2:] == [107.0, 107.1]


def _headers(**fields: str) -> Message:
    message = Message()
    for name, value in fields.items():
        message[name.replace("_", "-")] = value
    return message


NOW = "Wed, 02 Dec 2026 06:00:00 GMT"

# (response headers) -> declared age in seconds, at least.
AGES = [
    ({}, 0.0),
    ({"Date": NOW}, 0.0),
    ({"Age": "3600"}, 3600.0),
    ({"Age": "bogus"}, 0.0),
    ({"Age": "-5"}, 0.0),
    # Last-Modified against the same response's Date: no clock of ours involved; one
    # second either way may be rounding.
    ({"Date": NOW, "Last_Modified": "Wed, 02 Dec 2026 05:00:00 GMT"}, 3599.0),
    ({"Date": NOW, "Last_Modified": "Wed, 02 Dec 2026 05:59:59 GMT"}, 0.0),
    ({"Date": NOW, "Last_Modified": "Wed, 02 Dec 2026 07:00:00 GMT"}, 0.0),
    ({"Date": NOW, "Last_Modified": "not a date"}, 0.0),
    ({"Last_Modified": "Wed, 02 Dec 2026 05:00:00 GMT"}, 0.0),
    # A cache's Age adds to the origin's Date - Last-Modified.
    ({"Age": "60", "Date": NOW, "Last_Modified": "Wed, 02 Dec 2026 05:58:00 GMT"}, 179.0),
]


@pytest.mark.parametrize(("fields", "age"), AGES)
def test_an_http_image_is_as_old_as_its_headers_say(fields: dict[str, str], age: float) -> None:
    assert declared_age_s(_headers(**fields)) == age
