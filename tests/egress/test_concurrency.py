"""More than one file in flight per destination (`maxConcurrentFiles`, issue 16 item 5):
each file is sent by one worker at a time and delivered exactly once, the destination's
bandwidth is shared by its workers, and a stopped pipeline resumes each file from its own
recorded offset."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.support.servers import wait_until

pytestmark = pytest.mark.integration


def in_flight(pipeline, dest: str = "out") -> list[str]:
    (status,) = pipeline.status()
    (entry,) = [d for d in status["destinations"] if d["id"] == dest]
    return entry["inFlight"]


@pytest.mark.parametrize(("limit", "expected"), [(1, 1), (2, 2), (3, 3)])
def test_a_destination_sends_up_to_its_limit_at_once(harness: Harness, tmp_path, limit, expected):
    for n in range(4):
        write_file(harness.source / f"f{n}.bin", 4 * MIB)
    destination = {
        "type": "local",
        "id": "out",
        "path": str(tmp_path / "out"),
        "maxConcurrentFiles": limit,
        # Slow enough that every worker is busy for a while.
        "bandwidthBytesPerSec": 4 * MIB,
    }
    pipeline, events = harness.start([destination])
    peak: list[int] = [0]

    def busy() -> bool:
        peak[0] = max(peak[0], len(in_flight(pipeline)))
        return peak[0] >= expected

    wait_until(busy, 30, f"{expected} files in flight")
    (status,) = pipeline.status()
    assert status["destinations"][0]["maxConcurrentFiles"] == limit
    assert len(in_flight(pipeline)) <= limit
    wait_until(lambda: len(events.of("file-completed")) == 4, 60, "every file")
    assert peak[0] == expected


def test_every_file_is_delivered_once_by_one_worker(harness: Harness, tmp_path):
    sources = {f"d{n % 3}/f{n}.bin": write_file(harness.source / f"d{n % 3}" / f"f{n}.bin", 4096)
               for n in range(60)}  # fmt: skip
    _, events = harness.start(
        [{"type": "local", "id": "out", "path": str(tmp_path / "out"), "maxConcurrentFiles": 8}]
    )
    wait_until(lambda: len(events.of("file-completed")) == len(sources), 60, "every file")
    delivered = Counter(d["file"] for d in events.of("file-delivered"))
    assert delivered == Counter(dict.fromkeys(sources, 1))
    for rel, data in sources.items():
        assert (tmp_path / "out" / rel).read_bytes() == data
    assert not list((tmp_path / "out").rglob("*unskit-part"))


def test_a_stopped_pipeline_resumes_each_file_from_its_own_offset(harness: Harness, tmp_path):
    # The local backend records its offset every 8 MiB.
    data = {name: write_file(harness.source / name, 32 * MIB) for name in ("a.bin", "b.bin")}
    destination = {
        "type": "local",
        "id": "out",
        "path": str(tmp_path / "out"),
        "maxConcurrentFiles": 2,
        "bandwidthBytesPerSec": 16 * MIB,
    }
    pipeline, _ = harness.start([destination])

    def offsets() -> dict[str, int]:
        (status,) = pipeline.status()
        return {q["file"]: q["destinations"]["out"]["offset"] for q in status["queue"]}

    wait_until(lambda: len(offsets()) == 2 and min(offsets().values()) >= 8 * MIB, 30,
               "both files under way")  # fmt: skip
    harness.stop(pipeline)
    recorded = offsets()
    assert all(8 * MIB <= v < 32 * MIB for v in recorded.values()), recorded
    _, events = harness.start([destination])
    wait_until(lambda: len(events.of("file-completed")) == 2, 60, "both files")
    resumed = {d["file"]: d["resumedFrom"] for d in events.of("file-delivered")}
    assert resumed == recorded
    for name, content in data.items():
        assert (tmp_path / "out" / name).read_bytes() == content
