"""The real edge-runtime nucleus, one per test module, with an allow-everything harness."""

from __future__ import annotations

from collections.abc import Iterator

from tests.support.greengrass import Harness, Nucleus
from tests.support.tiers import server_fixture

#: The harness component every edge test acts as unless it is about permissions.
HARNESS = "TestHarness"


@server_fixture(scope="module")
def nucleus() -> Iterator[Nucleus]:
    """A nucleus with the shadow manager and `HARNESS` (every IPC operation allowed)."""
    runtime = Nucleus([Harness(HARNESS)], shadow_manager=True).start()
    yield runtime
    runtime.remove()
