"""The mounted-directory watcher: a config-map style `..data` swap is seen, without polling."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from unskit.config import ComponentConfig, ConfigLoader, Platform
from unskit.config.watch import DirectoryWatcher, inotify_available
from unskit.errors import ConfigError

from .documents import THING, patched

pytestmark = pytest.mark.skipif(not inotify_available(), reason="inotify is Linux only")

DEADLINE = 10.0


class ConfigMapDir:
    """A directory written the way the kubelet's atomic writer updates a config-map mount:
    a new timestamped directory, a ``..data_tmp`` symlink renamed over ``..data``, the
    user-visible file a symlink through ``..data``, the old directory removed."""

    def __init__(self, root: Path, key: str = "config.json") -> None:
        self.root = root
        self.key = key
        self.generation = 0
        self.latest = ""

    def publish(self, text: str) -> None:
        self.generation += 1
        version = self.root / f"..2025_01_01_00_00_00.{self.generation:09d}"
        version.mkdir()
        (version / self.key).write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        self.latest = version.name
        os.symlink(version.name, self.root / "..data_tmp")
        os.rename(self.root / "..data_tmp", data)
        if not (self.root / self.key).is_symlink():
            os.symlink(f"..data/{self.key}", self.root / self.key)
        if old is not None:
            shutil.rmtree(self.root / old)

    def publish_document(self, document: Any, indent: int | None = 2) -> None:
        self.publish(json.dumps(document, indent=indent))


class Recorder:
    """Collects callbacks and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.configs: list[ComponentConfig] = []
        self.errors: list[ConfigError] = []
        self.changed = threading.Event()
        self.failed = threading.Event()

    def on_change(self, config: ComponentConfig) -> None:
        self.configs.append(config)
        self.changed.set()

    def on_error(self, error: ConfigError) -> None:
        self.errors.append(error)
        self.failed.set()


@pytest.fixture
def mount(tmp_path: Path) -> ConfigMapDir:
    directory = tmp_path / "config"
    directory.mkdir()
    mount = ConfigMapDir(directory)
    mount.publish_document(patched({"tags": {"owner": "day-shift"}}))
    return mount


def _watch(mount: ConfigMapDir, recorder: Recorder) -> tuple[ConfigLoader, Any]:
    loader = ConfigLoader(mount.root, thing=THING, platform=Platform.CLUSTER)
    assert loader.load().tags["owner"] == "day-shift"
    watch = loader.watch(recorder.on_change, recorder.on_error)
    assert watch is not None
    return loader, watch


def _thread_cpu_seconds(watcher: DirectoryWatcher) -> float:
    assert watcher.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(watcher.ident))


def test_symlink_swap_is_seen_within_deadline(mount: ConfigMapDir) -> None:
    recorder = Recorder()
    loader, watch = _watch(mount, recorder)
    try:
        mount.publish_document(patched({"tags": {"owner": "night-shift"}}))
        assert recorder.changed.wait(DEADLINE), "the swap was not seen"
        assert recorder.configs[0].tags["owner"] == "night-shift"
        current = loader.current
        assert current is not None
        assert current.tags["owner"] == "night-shift"
    finally:
        watch.close()


def test_formatting_only_swap_is_not_a_change(mount: ConfigMapDir) -> None:
    recorder = Recorder()
    loader = ConfigLoader(mount.root, thing=THING, platform=Platform.CLUSTER)
    loader.load()
    read = loader.source.read
    read_latest = threading.Event()

    def tracking_read() -> dict[str, Any]:
        # Set once the watcher has read the newest version (the link did not move meanwhile).
        before = os.readlink(mount.root / "..data")
        document = read()
        if before == os.readlink(mount.root / "..data") == mount.latest:
            read_latest.set()
        return document

    loader.source.read = tracking_read  # type: ignore[method-assign]
    watch = loader.watch(recorder.on_change, recorder.on_error)
    assert watch is not None
    try:
        mount.publish_document(patched({"tags": {"owner": "day-shift"}}), indent=None)
        assert read_latest.wait(DEADLINE)
        read_latest.clear()
        mount.publish_document(patched({"tags": {"owner": "swing-shift"}}))
        assert recorder.changed.wait(DEADLINE)
        assert [c.tags["owner"] for c in recorder.configs] == ["swing-shift"]
    finally:
        watch.close()


def test_invalid_candidate_is_rejected_and_running_config_kept(mount: ConfigMapDir) -> None:
    recorder = Recorder()
    loader, watch = _watch(mount, recorder)
    try:
        mount.publish_document(patched({"tags": {"site": "elsewhere"}}))
        assert recorder.failed.wait(DEADLINE)
        assert [i.path for i in recorder.errors[0].issues] == ["$.tags.site"]
        assert recorder.configs == []
        current = loader.current
        assert current is not None
        assert current.tags["owner"] == "day-shift"
        # Swaps close together may be read once, as their final state: wait between them.
        recorder.failed.clear()
        mount.publish("{ not json")
        assert recorder.failed.wait(DEADLINE)
        assert "malformed JSON" in str(recorder.errors[-1])
        mount.publish_document(patched({"tags": {"owner": "fixed"}}))
        assert recorder.changed.wait(DEADLINE)
        assert [c.tags["owner"] for c in recorder.configs] == ["fixed"]
    finally:
        watch.close()


def test_watcher_sleeps_in_the_kernel_while_nothing_changes(mount: ConfigMapDir) -> None:
    recorder = Recorder()
    _, watch = _watch(mount, recorder)
    watcher: DirectoryWatcher = watch.watcher
    try:
        cpu_before = _thread_cpu_seconds(watcher)
        # An observation window, not synchronisation: nothing is expected to happen in it.
        threading.Event().wait(0.5)
        assert watcher.wakeups == 0
        assert _thread_cpu_seconds(watcher) - cpu_before < 0.01
        stat = Path(f"/proc/self/task/{watcher.native_id}/stat").read_text()
        assert stat.rsplit(")", 1)[1].split()[0] == "S"  # sleeping in poll(2)
        mount.publish_document(patched({"tags": {"owner": "night-shift"}}))
        assert recorder.changed.wait(DEADLINE)
        assert 1 <= watcher.wakeups <= 5
    finally:
        watch.close()


def test_close_stops_the_thread_and_is_idempotent(mount: ConfigMapDir) -> None:
    recorder = Recorder()
    _, watch = _watch(mount, recorder)
    watcher: DirectoryWatcher = watch.watcher
    thread = threading.enumerate()
    assert any(t.ident == watcher.ident for t in thread)
    watch.close()
    watch.close()
    assert not any(t.ident == watcher.ident for t in threading.enumerate())


def test_close_from_inside_the_change_handler(tmp_path: Path) -> None:
    done = threading.Event()
    holder: dict[str, DirectoryWatcher] = {}

    def on_change() -> None:
        holder["w"].close()
        done.set()

    watcher = DirectoryWatcher(tmp_path, on_change)
    holder["w"] = watcher
    watcher.start()
    (tmp_path / "x.json").write_text("{}")
    assert done.wait(DEADLINE)
    assert watcher._thread is not None
    watcher._thread.join(DEADLINE)
    assert not watcher._thread.is_alive()


def test_in_place_write_in_a_plain_directory_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(patched({})))
    loader = ConfigLoader(tmp_path, thing=THING, platform=Platform.CLUSTER)
    loader.load()
    recorder = Recorder()
    watch = loader.watch(recorder.on_change, recorder.on_error)
    assert watch is not None
    try:
        with path.open("w") as handle:
            handle.write(json.dumps(patched({"tags": {"owner": "edited"}})))
        assert recorder.changed.wait(DEADLINE)
        assert recorder.configs[0].tags["owner"] == "edited"
        assert recorder.errors == []
    finally:
        watch.close()


def test_missing_directory_cannot_be_watched(tmp_path: Path) -> None:
    watcher = DirectoryWatcher(tmp_path / "absent", lambda: None)
    with pytest.raises(OSError, match="cannot watch"):
        watcher.start()


def test_a_new_subdirectory_is_a_change(tmp_path: Path) -> None:
    # Nothing else follows a mkdir: without this a recursive watcher never learns of it.
    changed = threading.Event()
    watcher = DirectoryWatcher(tmp_path, changed.set).start()
    try:
        (tmp_path / "cam-1").mkdir()
        assert changed.wait(DEADLINE)
    finally:
        watcher.close()
