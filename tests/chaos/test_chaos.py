"""The chaos suite: the demo stack under a seeded schedule of real faults, then the
invariants (tests/chaos/invariants.py). `make test` runs one round with a fixed seed;
`make chaos` runs rounds for CHAOS_SECS with CHAOS_SEED (UNSKIT_CHAOS_SECONDS and
UNSKIT_CHAOS_SEED here)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.chaos.conftest import TABLES
from tests.chaos.faults import Injected, run_fault, schedule
from tests.chaos.invariants import check, exit_verdict, table, undelivered
from tests.chaos.stack import PRODUCERS, running_stack

#: The seed `make test` runs with: the same schedule each run, one that kills the camera and
#: the egress (the two that own files) at random points.
BOUNDED_SEED = 25
SECONDS = float(os.environ.get("UNSKIT_CHAOS_SECONDS", "0"))
SEED = int(os.environ.get("UNSKIT_CHAOS_SEED", BOUNDED_SEED))
#: After the schedule: the egress ships what the camera captured meanwhile.
DELIVERY_TIMEOUT_S = 30.0


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(120 if SECONDS <= 0 else SECONDS + 240)
def test_the_stack_keeps_its_invariants_under_faults(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(SEED)
    injected: list[Injected] = []
    began = time.monotonic()
    with running_stack(tmp_path / "stack") as stack:
        # One round of every fault; more rounds, each in a new order, while time is left.
        try:
            while True:
                for fault in schedule(rng):
                    injected.append(run_fault(stack, fault))
                if time.monotonic() - began >= SECONDS:
                    break
        except BaseException:
            # A fault the stack did not recover from: the table shows what came before it.
            text = table(SEED, injected, []) + "\nthe schedule stopped: see the error below"
            request.config.stash.setdefault(TABLES, []).append(text)
            raise
        stack.stop_components(PRODUCERS)
        # Bounded: what is still missing then is named by the invariants below.
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while undelivered(stack) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling the destination folder; nothing to wait on instead
        stack.stop_components(("file-egress",))
        # Checked before the stop unmounts the camera's tmpfs.
        verdicts = check(stack, injected)
        stack.stop()
        verdicts.append(exit_verdict(stack))
    text = table(SEED, injected, verdicts) + f"\nwall time {time.monotonic() - began:.0f} s"
    request.config.stash.setdefault(TABLES, []).append(text)
    request.node.user_properties.append(("chaos", text))
    failed = [v for v in verdicts if not v.held]
    assert not failed, text
