"""Ours beside its anchor round by round: the best round of each, run alternately.

The machine is shared, so a mean swings with whatever else runs, and even the best round of
one side timed in its own phase moves with the phase it ran in (a CIP row's best-round
ratio spread 16.7x to 31.5x over three gate runs that way). Rounds interleaved one by one
see the same load on both sides; the best of each is what each can do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def compare(
    benchmark: Any,
    ours: Callable[[], Any],
    anchor: Callable[[], Any],
    seconds_each: float,
    calls: int = 1,
) -> tuple[float, float]:
    """Calls/s of ours and the anchor from their best interleaved rounds of `calls` calls;
    `seconds_each` (a round's rough length) sizes the rounds to about 1.5 s in all."""
    rounds = max(7, int(1.5 / seconds_each))
    best = {"ours": float("inf"), "anchor": float("inf")}
    for _ in range(rounds):
        for impl, fn in (("ours", ours), ("anchor", anchor)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[impl] = min(best[impl], time.perf_counter() - start)
    # pytest-benchmark's table shows ours too.
    benchmark.pedantic(ours, rounds=3, iterations=1, warmup_rounds=1)
    return calls / best["ours"], calls / best["anchor"]
