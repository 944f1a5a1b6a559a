"""Catalog retention: terminal jobs past the count or the age are pruned, in bounded passes,
never a non-terminal job, a job that just ended, or a member of a group still pending; the
images stay. Unit tests on SQLite in tmp_path, then end to end on the camera adapter."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, sim
from tests.camera.test_config_and_codec import load
from unskit.camera.catalog import PRUNE_BATCH, PRUNE_GRACE_MS, Catalog, GroupRecord
from unskit.camera.config import CatalogRetention, parse_settings
from unskit.camera.jobs import TERMINAL, Job, JobState, new_id, now_ms
from unskit.errors import ConfigError

HOUR = 3_600_000
#: Ended long enough ago to be past the grace.
OLD_AGE = 2 * PRUNE_GRACE_MS


CAMERAS = [{"instance": "a", "backend": "sim"}]


def test_retention_defaults_and_settings(tmp_path: Path) -> None:
    default = parse_settings(load(tmp_path, {"cameras": CAMERAS})).retention
    assert (default.max_terminal_jobs, default.max_age_hours) == (10_000, 168.0)
    retention = {"maxTerminalJobs": 5, "maxAgeHours": 0.5}
    set_ = parse_settings(load(tmp_path, {"cameras": CAMERAS, "catalog": {"retention": retention}}))
    assert (set_.retention.max_terminal_jobs, set_.retention.max_age_ms) == (5, 1_800_000)


@pytest.mark.parametrize(
    "retention",
    [{"maxTerminalJobs": 0}, {"maxAgeHours": 0}, {"maxAgeHours": -1}, {"keep": 1}],
    ids=["no jobs", "no age", "negative age", "unknown key"],
)
def test_the_schema_refuses_a_retention(
    tmp_path: Path, retention: dict[str, Any], now: int
) -> None:
    with pytest.raises(ConfigError):
        load(tmp_path, {"cameras": CAMERAS, "catalog": {"retention": retention}})


def job(
    state: JobState = JobState.SUCCEEDED,
    terminal_ms: int | None = None,
    group: GroupRecord | None = None,
) -> Job:
    return Job(
        capture_id=new_id("cap"),
        camera="cam-1",
        state=state,
        trigger={"type": "command", "requestId": "r"},
        profile="default",
        capture_mode="simulated",
        timeout_ms=30_000,
        accepted_ms=(terminal_ms or now_ms()) - 100,
        correlation_id="c",
        event_id=new_id("evt"),
        group_id=None if group is None else group.group_id,
        group_size=None if group is None else group.size,
        terminal_ms=(terminal_ms or now_ms() - OLD_AGE) if state in TERMINAL else None,
        result={"metadata": {}} if state in TERMINAL else None,
    )


@pytest.fixture
def now() -> int:
    """The test's clock: the insert prunes by the real one, a moment later."""
    return now_ms()


def catalog(tmp_path: Path, max_jobs: int = 10_000, max_age_hours: float = 168.0) -> Catalog:
    return Catalog(
        tmp_path / "catalog.sqlite3",
        synchronous_full=False,
        retention=CatalogRetention(max_jobs, max_age_hours),
    )


def present(store: Catalog, jobs: list[Job]) -> list[bool]:
    return [store.get(j.capture_id) is not None for j in jobs]


def test_the_oldest_terminal_jobs_beyond_the_count_go(tmp_path: Path, now: int) -> None:
    store = catalog(tmp_path, max_jobs=4)
    jobs = [job(terminal_ms=now - OLD_AGE - i * 1000) for i in range(10)]  # jobs[0] is the newest
    store.insert(jobs)
    # The insert itself pruned, in the same commit.
    assert present(store, jobs) == [True] * 4 + [False] * 6
    assert store.prune(now) == 0


def test_terminal_jobs_past_the_age_go(tmp_path: Path, now: int) -> None:
    store = catalog(tmp_path, max_age_hours=1)
    ages = [HOUR // 2, HOUR - 60_000, HOUR + 1, 5 * HOUR]
    jobs = [job(terminal_ms=now - age) for age in ages]
    store.insert(jobs)
    assert present(store, jobs) == [True, True, False, False]
    assert store.prune(now) == 0
    assert store.prune(now + 120_000) == 1
    assert present(store, jobs) == [True, False, False, False]


@pytest.mark.parametrize("state", list(JobState), ids=[s.value for s in JobState])
def test_only_terminal_states_are_pruned(tmp_path: Path, state: JobState, now: int) -> None:
    store = catalog(tmp_path, max_jobs=1, max_age_hours=1)
    old = job(state, terminal_ms=now - 10 * HOUR)
    # Even with a stamp it cannot have, a non-terminal job stays: the state decides.
    old.terminal_ms = now - 10 * HOUR
    newest = job(terminal_ms=now - OLD_AGE)
    store.insert([old, newest])
    store.prune(now)
    assert present(store, [old, newest]) == [state not in TERMINAL, True]


def test_a_job_that_just_ended_is_kept_beyond_the_count(tmp_path: Path, now: int) -> None:
    store = catalog(tmp_path, max_jobs=1)
    jobs = [job(terminal_ms=now - PRUNE_GRACE_MS // 2 - i) for i in range(3)]
    store.insert(jobs)
    assert store.prune(now) == 0
    assert store.prune(now + PRUNE_GRACE_MS) == 2
    assert present(store, jobs) == [True, False, False]


def test_a_pending_group_keeps_its_members_and_goes_whole_when_done(
    tmp_path: Path, now: int
) -> None:
    store = catalog(tmp_path, max_jobs=1, max_age_hours=1)
    group = GroupRecord(new_id("grp"), "g", now - 10 * HOUR, 2)
    done = job(terminal_ms=now - 10 * HOUR, group=group)
    waiting = job(JobState.ACQUIRING, group=group)
    store.insert([done, waiting], group)
    single = job(terminal_ms=now - 9 * HOUR)
    store.insert([single])
    store.prune(now)
    assert present(store, [done, waiting, single]) == [True, True, False]
    waiting.state, waiting.terminal_ms, waiting.result = JobState.FAILED, now - 2 * HOUR, {}
    assert store.finish(waiting)
    assert store.prune(now) == 2
    assert store.group(group.group_id) is None
    assert store.members(group.group_id) == []


def test_a_pass_is_bounded_and_opening_catches_up(tmp_path: Path, now: int) -> None:
    store = catalog(tmp_path)
    jobs = [job(terminal_ms=now - 10 * HOUR - i) for i in range(3 * PRUNE_BATCH)]
    store.insert(jobs)
    store.close()
    store = catalog(tmp_path, max_age_hours=1)  # a lower retention: caught up at open
    assert present(store, jobs) == [False] * len(jobs)
    store.close()
    store = catalog(tmp_path)
    store.insert(jobs[: PRUNE_BATCH * 2])
    store.retention = CatalogRetention(10_000, 1)
    assert store.prune(now) == PRUNE_BATCH
    assert store.prune(now) == PRUNE_BATCH
    assert store.prune(now) == 0


def test_finished_jobs_count_towards_the_retention(tmp_path: Path, now: int) -> None:
    store = catalog(tmp_path, max_jobs=2)
    jobs = [job(JobState.QUEUED) for _ in range(4)]
    store.insert(jobs)
    for index, entry in enumerate(jobs):
        entry.state, entry.terminal_ms, entry.result = JobState.SUCCEEDED, now - OLD_AGE + index, {}
        assert store.finish(entry)
    assert store.prune(now) == 2
    assert present(store, jobs) == [False, False, True, True]
    store.close()
    # The count is read back at open.
    reopened = catalog(tmp_path, max_jobs=1)
    assert present(reopened, jobs) == [False, False, False, True]


# -- end to end ---------------------------------------------------------------------------------


def backdate(path: Path, capture_id: str, terminal_ms: int) -> None:
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE jobs SET terminal_ms = ? WHERE capture_id = ?", (terminal_ms, capture_id)
        )


def test_pruned_captures_are_not_found_and_their_images_stay(harness: CameraHarness) -> None:
    component: dict[str, Any] = {"cameras": [sim("cam-1")]}
    rig = harness.start(component)
    bodies = [rig.call("capture", {"requestId": f"r{i}"}, "cam-1") for i in range(3)]
    assert rig.app.service is not None
    path = rig.app.service.catalog.path
    harness.stop(rig)
    # The adapter is stopped: as if days had passed since the first capture.
    now = now_ms()
    for body, age in zip(bodies, (48 * HOUR, 10 * 60_000, 5 * 60_000), strict=True):
        backdate(path, body["captureId"], now - age)

    document = rig.document
    document["component"]["catalog"] = {"retention": {"maxTerminalJobs": 1, "maxAgeHours": 24}}
    rig = harness.start(component, document)
    # Opening pruned the first by age and the second by count; the third stays.
    for body in bodies[:2]:
        assert rig.error("capture-status", {"captureId": body["captureId"]}) == (
            "CAPTURE_NOT_FOUND"
        )
        by_request = {"requestId": body["trigger"]["requestId"]}
        assert rig.error("capture-status", by_request, "cam-1") == "CAPTURE_NOT_FOUND"
    assert rig.status(bodies[2]["captureId"])["result"] == bodies[2]
    # A new capture (inside the grace) leaves the third in place; the next admission prunes it.
    rig.call("capture", {"requestId": "r3"}, "cam-1")
    rig.call("capture-submit", {"requestId": "r4"}, "cam-1")
    assert rig.error("capture-status", {"captureId": bodies[2]["captureId"]}) == (
        "CAPTURE_NOT_FOUND"
    )
    # Pruning a row never touches the files.
    for body in bodies:
        image = Path(body["image"]["absolutePath"])
        assert hashlib.sha256(image.read_bytes()).hexdigest() == body["image"]["sha256"]
        assert (rig.output / body["image"]["metadataSidecarRelativePath"]).exists()
