"""The pipeline with `local` destinations, in process: fan-out, completion, settle rules,
verification, changed sources, a destination that is down, retries and resume."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path, PurePosixPath

import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.support.servers import wait_until
from unskit.egress.backends import safe_relative, safe_target
from unskit.egress.backends.local import temp_path
from unskit.egress.config import RetryPolicy
from unskit.egress.state import DeliveryState
from unskit.errors import UnsafePathError
from unskit.runtime.supervision import RUNTIME_FAMILY, THREAD_FAILURES


def local(path: Path, **settings) -> dict:
    return {"type": "local", "path": str(path), **settings}


def test_every_destination_gets_the_tree_then_the_source_is_deleted(harness: Harness, tmp_path):
    files = {
        "a.csv": write_file(harness.source / "a.csv", 1000),
        "deep/er/b.bin": write_file(harness.source / "deep" / "er" / "b.bin", 3 * MIB),
        "empty.txt": write_file(harness.source / "empty.txt", 0),
    }
    one, two = tmp_path / "one", tmp_path / "two"
    _, events = harness.start([local(one, fsync=True), local(two)])
    wait_until(lambda: len(events.of("file-completed")) == 3, 20, "three completed files")
    for rel, data in files.items():
        assert (one / rel).read_bytes() == data
        assert (two / rel).read_bytes() == data
        assert not (harness.source / rel).exists()
    assert not [p for p in one.rglob("*") if p.name.endswith(".unskit-part")]
    delivered = events.of("file-delivered")
    assert {(d["file"], d["destination"]) for d in delivered} == {
        (rel, dest) for rel in files for dest in ("local-1", "local-2")
    }


def test_archive_moves_the_source_after_delivery(harness: Harness, tmp_path):
    data = write_file(harness.source / "x" / "r.json", 5000)
    archive = tmp_path / "archive"
    _, events = harness.start([local(tmp_path / "out")], archive=archive)
    wait_until(lambda: events.of("file-completed"), 20, "completion")
    assert (archive / "x" / "r.json").read_bytes() == data
    assert (tmp_path / "out" / "x" / "r.json").read_bytes() == data
    assert not (harness.source / "x" / "r.json").exists()


def test_a_file_renamed_into_a_new_subdirectory_is_delivered(harness: Harness, tmp_path):
    # The camera adapter's pattern: mkdir {camera}/{date}, then rename a finished file in.
    out = tmp_path / "out"
    write_file(harness.source / "first.jpg", 100)
    _, events = harness.start([local(out)])
    # Once the first file is done the scanner is idle: only inotify can wake it.
    wait_until(lambda: events.of("file-completed"), 20, "the first file")
    data = write_file(tmp_path / "staging" / "img.jpg", 2000)
    (harness.source / "cam-1" / "day").mkdir(parents=True)
    os.replace(tmp_path / "staging" / "img.jpg", harness.source / "cam-1" / "day" / "img.jpg")
    wait_until(lambda: len(events.of("file-completed")) == 2, 20, "the file in the new folder")
    assert (out / "cam-1" / "day" / "img.jpg").read_bytes() == data


def test_a_file_without_its_completion_marker_is_never_sent(harness: Harness, tmp_path):
    out = tmp_path / "out"
    write_file(harness.source / "waiting.csv", 100)
    ready = write_file(harness.source / "ready.csv", 100)
    (harness.source / "ready.csv.done").write_text("")
    pipeline, events = harness.start([local(out)], marker=".done")
    wait_until(lambda: events.of("file-completed"), 20, "the marked file")
    assert (out / "ready.csv").read_bytes() == ready
    assert not (harness.source / "ready.csv.done").exists()
    assert not (out / "waiting.csv").exists()
    assert pipeline.state.find_active("line-1", "waiting.csv") is None
    (harness.source / "waiting.csv.done").write_text("")
    wait_until(lambda: len(events.of("file-completed")) == 2, 20, "the late marker")
    assert (out / "waiting.csv").exists()


def test_a_fresh_file_is_queued_only_once_it_has_settled(harness: Harness, tmp_path):
    path = harness.source / "fresh.bin"
    write_file(path, 1000, settled=False)
    mtime = path.stat().st_mtime
    pipeline, events = harness.start([local(tmp_path / "out")], settle=1.0)
    wait_until(lambda: events.of("file-completed"), 20, "the settled file")
    (record,) = pipeline.state.files_by_rel("line-1", ["fresh.bin"])
    assert record.discovered_at >= mtime + 1.0


def test_a_file_stamped_ahead_of_the_clock_settles_by_the_monotonic_clock(
    harness: Harness, tmp_path
):
    """The wall clock stepped back an hour (the chaos suite found it): a file written just
    before has its mtime an hour ahead. It is queued once unchanged for settleSeconds,
    not an hour later, and not before (found by tests/chaos)."""
    path = harness.source / "ahead.bin"
    write_file(path, 1000, settled=False)
    ahead = time.time() + 3600
    os.utime(path, (ahead, ahead))
    began = time.monotonic()
    _, events = harness.start([local(tmp_path / "out")], settle=1.0)
    wait_until(lambda: events.of("file-completed"), 20, "the file stamped ahead")
    assert time.monotonic() - began >= 1.0
    assert (tmp_path / "out" / "ahead.bin").exists()


@pytest.mark.slow
def test_a_corrupted_copy_fails_verification_and_is_sent_again(harness: Harness, tmp_path):
    data = write_file(harness.source / "big.bin", 16 * MIB)
    out = tmp_path / "out"
    temp = temp_path(out / "big.bin")
    _, events = harness.start([local(out, bandwidthBytesPerSec=4 * MIB)])
    wait_until(lambda: temp.exists() and temp.stat().st_size > 2 * MIB, 20, "a partial copy")
    with temp.open("r+b") as stream:  # flip bytes the pipeline has already written
        stream.seek(1000)
        original = stream.read(16)
        stream.seek(1000)
        stream.write(bytes(b ^ 0xFF for b in original))
    wait_until(lambda: events.of("file-completed"), 60, "completion after the re-send")
    failures = events.of("verification-failed")
    assert len(failures) == 1
    assert "SHA-256" in failures[0]["error"]
    assert (out / "big.bin").read_bytes() == data
    assert len(events.of("file-delivered")) == 1


def test_a_source_changed_while_sent_is_restarted_never_torn(harness: Harness, tmp_path):
    path = harness.source / "grows.bin"
    first = write_file(path, 8 * MIB)
    out = tmp_path / "out"
    temp = temp_path(out / "grows.bin")
    _, events = harness.start([local(out, bandwidthBytesPerSec=4 * MIB)])
    wait_until(lambda: temp.exists() and temp.stat().st_size > MIB, 20, "a partial copy")
    extra = os.urandom(MIB)
    with path.open("ab") as stream:
        stream.write(extra)
    wait_until(lambda: events.of("file-completed"), 60, "completion of the new content")
    assert events.of("file-changed")
    assert (out / "grows.bin").read_bytes() == first + extra
    assert events.of("file-completed")[0]["size"] == len(first) + len(extra)


def test_a_destination_that_is_down_does_not_hold_the_others(harness: Harness, tmp_path):
    data = write_file(harness.source / "f.bin", 2 * MIB)
    up, down = tmp_path / "up", tmp_path / "down"
    down.write_text("a file where the destination directory should be")
    _, events = harness.start([local(up, id="up"), local(down, id="down")])
    wait_until(lambda: events.of("file-delivered"), 20, "delivery to the working destination")
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 20, "retries of the broken one")
    assert (up / "f.bin").read_bytes() == data
    assert (harness.source / "f.bin").exists(), "completed before every destination had it"
    assert not events.of("file-completed")
    down.unlink()
    wait_until(lambda: events.of("file-completed"), 20, "completion once it is back")
    assert (down / "f.bin").read_bytes() == data
    assert not (harness.source / "f.bin").exists()
    # The working destination was not sent to again.
    assert [d["destination"] for d in events.of("file-delivered")] == ["up", "down"]


def test_a_permanent_failure_waits_for_retry(harness: Harness, tmp_path):
    write_file(harness.source / "f.bin", 1000)
    down = tmp_path / "down"
    down.write_text("blocks the directory")
    pipeline, events = harness.start(
        [local(down)], retry=RetryPolicy(initial_backoff_ms=50, max_attempts=2)
    )
    wait_until(lambda: events.of("delivery-failed"), 20, "the permanent failure")
    instance = pipeline.instances["line-1"]
    queue = instance.status()["queue"]
    assert queue[0]["destinations"]["local-1"]["state"] == DeliveryState.FAILED.value
    assert queue[0]["destinations"]["local-1"]["attempts"] == 2
    down.unlink()
    assert instance.retry(None) == ["f.bin"]
    wait_until(lambda: events.of("file-completed"), 20, "completion after sb/retry")


def test_a_stopped_pipeline_resumes_from_the_recorded_offset(harness: Harness, tmp_path):
    data = write_file(harness.source / "r.bin", 24 * MIB)
    out = tmp_path / "out"
    first, _ = harness.start([local(out, bandwidthBytesPerSec=8 * MIB)])
    state = first.state
    wait_until(
        lambda: any(d.offset >= 8 * MIB for d in state.deliveries(1)), 20, "a recorded offset"
    )
    first.stop()
    offset = state.deliveries(1)[0].offset
    assert 8 * MIB <= offset < len(data)
    _, events = harness.start([local(out)])
    wait_until(lambda: events.of("file-completed"), 30, "completion after the restart")
    delivered = events.of("file-delivered")[0]
    assert delivered["resumedFrom"] == offset
    assert delivered["bytesSent"] == len(data) - offset
    assert (out / "r.bin").read_bytes() == data


def test_symlinks_out_of_the_source_tree_are_refused(harness: Harness, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("not for export")
    harness.source.mkdir(parents=True)
    (harness.source / "link.txt").symlink_to(outside)
    inside = write_file(harness.source / "real.txt", 10)
    out = tmp_path / "out"
    _, events = harness.start([local(out)])
    wait_until(lambda: events.of("file-completed"), 20, "the regular file")
    wait_until(lambda: events.of("file-refused"), 20, "the refusal")
    assert "outside the source tree" in events.of("file-refused")[0]["reason"]
    assert (out / "real.txt").read_bytes() == inside
    assert not (out / "link.txt").exists()
    assert outside.exists()


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x", "", "a//b", "./a"])
def test_paths_escaping_the_root_are_refused(bad):
    with pytest.raises(UnsafePathError):
        safe_relative(bad)


def test_a_symlink_in_the_destination_tree_cannot_lead_out(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError):
        safe_target(root, PurePosixPath("escape/x.bin"))
    assert safe_target(root, PurePosixPath("fine/x.bin")) == root / "fine" / "x.bin"


def test_a_file_verified_everywhere_before_a_crash_is_completed_not_sent(
    harness: Harness, tmp_path
):
    from unskit.egress.state import EgressState

    path = harness.source / "done.bin"
    write_file(path, 1000)
    st = path.stat()
    # The state a crash between the last verification and the deletion leaves behind.
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "done.bin", st.st_size, st.st_mtime_ns, ["local-1"])
    state.mark_verified(file_id, "local-1")
    state.close()
    out = tmp_path / "out"
    _, events = harness.start([local(out)])
    wait_until(lambda: events.of("file-completed"), 20, "the completion")
    assert not path.exists()
    assert not events.of("file-delivered")
    assert not out.exists(), "a verified file was sent again"


def test_a_copy_renamed_before_a_crash_is_verified_not_sent_again(harness: Harness, tmp_path):
    from unskit.egress.state import EgressState

    data = write_file(harness.source / "r.bin", 3 * MIB)
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.bin").write_bytes(data)  # renamed into place, then the process died
    before = (out / "r.bin").stat()
    st = (harness.source / "r.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "r.bin", st.st_size, st.st_mtime_ns, ["local-1"])
    state.save_offset(file_id, "local-1", 2 * MIB, 2 * MIB)
    state.close()
    _, events = harness.start([local(out)])
    wait_until(lambda: events.of("file-completed"), 20, "the completion")
    delivered = events.of("file-delivered")[0]
    assert delivered["bytesSent"] == 0
    assert delivered["alreadyDelivered"] is True
    assert (out / "r.bin").stat().st_ino == before.st_ino


def test_a_different_copy_in_place_is_replaced(harness: Harness, tmp_path):
    from unskit.egress.state import EgressState

    data = write_file(harness.source / "r.bin", MIB)
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.bin").write_bytes(bytes(len(data)))  # same size, other bytes
    st = (harness.source / "r.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "r.bin", st.st_size, st.st_mtime_ns, ["local-1"])
    state.save_offset(file_id, "local-1", MIB // 2, MIB // 2)
    state.close()
    _, events = harness.start([local(out)])
    wait_until(lambda: events.of("file-completed"), 20, "the completion")
    assert events.of("file-delivered")[0]["bytesSent"] == len(data)
    assert (out / "r.bin").read_bytes() == data


def test_progress_events_and_metrics(harness: Harness, tmp_path):
    data = write_file(harness.source / "p.bin", 6 * MIB)
    down = tmp_path / "down"
    down.write_text("blocks the directory at first")
    _, events = harness.start(
        [local(tmp_path / "out", id="out", bandwidthBytesPerSec=4 * MIB), local(down, id="down")]
    )
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 20, "retries")
    down.unlink()
    wait_until(lambda: events.of("file-completed"), 30, "completion")
    progress = [e for e in events.of("file-progress") if e["destination"] == "out"]
    assert progress, "no progress event during a 1.5 s transfer"
    assert all(0 < e["bytesSent"] <= len(data) and e["size"] == len(data) for e in progress)
    sent = [e["bytesSent"] for e in progress]
    assert sent == sorted(sent)

    def total(name: str, **dims: str) -> float:
        return sum(
            s.total or 0
            for s in harness.metrics.collect(reset_interval=False)
            if s.family == "egress"
            and s.name == name
            and all(s.dimensions.get(k) == v for k, v in dims.items())
        )

    assert total("bytesSent", destination="out") == len(data)
    assert total("bytesSent", destination="down") == len(data)
    assert total("filesDelivered") == 2
    assert total("filesCompleted") == 1
    retries = len(events.of("delivery-retry"))
    assert total("retries", destination="down") == retries
    assert total("failures", destination="down") == retries


@pytest.mark.slow
def test_a_worker_that_fails_outside_a_transfer_is_restarted(harness: Harness, tmp_path):
    """The state database locked by another process past its busy timeout (5 s) fails the
    worker's own writes: that ended the worker thread, and the file was never delivered."""
    data = write_file(harness.source / "big.bin", 4 * MIB)
    out = tmp_path / "out"
    temp = temp_path(out / "big.bin")
    _, events = harness.start([local(out, bandwidthBytesPerSec=2 * MIB)])
    wait_until(lambda: temp.exists(), 20, "the transfer under way")
    slots = [
        harness.metrics.counter(RUNTIME_FAMILY, THREAD_FAILURES, {"thread": thread})
        for thread in ("egress-line-1-local-1-0", "egress-line-1-local-1-1")
    ]
    holder = sqlite3.connect(harness.states[0].path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the database
        wait_until(lambda: sum(c.total for c in slots) >= 1, 30, "a worker's failure counted")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_until(lambda: events.of("file-completed"), 60, "completion by the restarted worker")
    assert (out / "big.bin").read_bytes() == data
