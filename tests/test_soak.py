"""The soak gate's judgement (`benches/soak.py`): slopes after the warm-up against each
tolerance. The soak itself runs for minutes (`make soak`), not in `make test`."""

from __future__ import annotations

import pytest
from benches.soak import RSS_MIB_PER_HOUR, Series, judge


def line(slope_per_s: float, *, start: float = 0.0, end: float = 600.0, step: float = 5.0):
    points, t = [], start
    while t <= end:
        points.append((t, 100.0 + slope_per_s * t))
        t += step
    return Series(points)


def test_the_slope_is_least_squares_after_the_warm_up() -> None:
    # A warm-up that grows fast, then flat: only the flat part counts.
    series = Series([(t, (t if t < 100 else 100.0)) for t in range(0, 600, 5)])
    assert series.slope_per_s(0) > 0
    assert series.slope_per_s(100) == pytest.approx(0.0)
    assert Series([(0, 1.0), (5, 2.0)]).slope_per_s(0) == 0.0, "too few points"


@pytest.mark.parametrize(
    ("mib_per_hour", "ok"),
    [(0.0, True), (RSS_MIB_PER_HOUR * 0.9, True), (RSS_MIB_PER_HOUR * 1.5, False), (-3.0, True)],
)
def test_rss_growth_beyond_the_tolerance_fails(mib_per_hour: float, ok: bool) -> None:
    series = {"cam:rss_mib": line(mib_per_hour / 3600), "cam:fds": line(0.0)}
    verdicts = {v.what: v for v in judge(series, line(0.0), 150.0, 450.0)}
    assert verdicts["cam RSS"].slope == pytest.approx(mib_per_hour, abs=1e-6)
    assert verdicts["cam RSS"].ok is ok
    assert verdicts["cam fds"].ok
    assert verdicts["SQLite files"].ok


def test_a_descriptor_leak_fails_even_when_small() -> None:
    leak = line(3 / 450)  # three more descriptors over the measured window
    (fds, _) = judge({"egress:fds": leak}, line(0.0), 150.0, 450.0)
    assert fds.what == "egress fds"
    assert not fds.ok


def test_a_growing_queue_fails_and_a_steady_one_passes() -> None:
    growing = line(60 / 450)  # sixty more entries over the measured window
    steady = Series([(t, float(t % 20)) for t in range(0, 600, 5)])  # fills and drains
    verdicts = {
        v.what: v
        for v in judge(
            {
                "file-egress egress.files:queue": growing,
                "camera-adapter camera.captures:queue": steady,
            },
            line(0.0),
            150.0,
            450.0,
        )
    }
    assert not verdicts["file-egress egress.files queue"].ok
    assert verdicts["camera-adapter camera.captures queue"].ok
