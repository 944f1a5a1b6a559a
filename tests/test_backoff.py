"""The one backoff rule: a doubling window, capped, and a jittered delay inside it."""

from __future__ import annotations

import pytest

from unskit.backoff import backoff_window, jittered_delay


@pytest.mark.parametrize(
    ("attempt", "window"),
    [(-1, 1.0), (0, 1.0), (1, 2.0), (3, 8.0), (5, 30.0), (10_000, 30.0)],
)
def test_the_window_doubles_from_the_initial_delay_up_to_the_cap(attempt, window):
    assert backoff_window(1.0, 30.0, attempt) == window


def test_a_tiny_initial_delay_still_reaches_the_cap():
    # 1 ms doubled 16 times is only 65.5 s: the exponent's bound must not become the cap.
    assert backoff_window(0.001, 300.0, 40) == 300.0


def test_the_delay_is_drawn_between_the_initial_delay_and_the_window():
    draws: list[tuple[float, float]] = []

    def draw(low: float, high: float) -> float:
        draws.append((low, high))
        return high

    assert jittered_delay(0.5, 30.0, 2, draw) == 2.0
    assert draws == [(0.5, 2.0)]
