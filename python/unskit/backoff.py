"""The one backoff rule of every retry: an exponentially growing window, capped, and for
reconnects a delay drawn uniformly within it (full jitter, so a fleet does not retry in
step). The broker links, the southbound instances and the egress deliveries all use it."""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["backoff_window", "jittered_delay"]

#: Past 2**30 any positive initial delay is beyond every cap; the float stays finite.
_MAX_EXPONENT = 30


def backoff_window(initial: float, maximum: float, attempt: int) -> float:
    """`initial * 2**attempt`, at most `maximum` (attempt 0 is the initial delay itself)."""
    return min(maximum, initial * 2.0 ** min(max(attempt, 0), _MAX_EXPONENT))


def jittered_delay(
    initial: float,
    maximum: float,
    attempt: int,
    draw: Callable[[float, float], float] = random.uniform,
) -> float:
    """A delay drawn by `draw` from [initial, backoff_window(initial, maximum, attempt)]."""
    return draw(initial, backoff_window(initial, maximum, attempt))
