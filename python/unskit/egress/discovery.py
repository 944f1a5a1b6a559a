"""Finding an instance's files: the source tree watched through inotify and scanned, each
file queued once it has settled (or its completion marker appeared), or the files of a
one-shot send queued as given.

The scanner never polls: it sleeps until inotify reports a change in the tree or the next
file's settle deadline comes."""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from unskit.config.watch import DirectoryWatcher
from unskit.egress.backends import safe_relative
from unskit.egress.context import InstanceContext
from unskit.egress.lifecycle import SourceLifecycle
from unskit.errors import UnsafePathError

__all__ = ["SCAN_MIN_INTERVAL_S", "SourceScanner"]

_log = logging.getLogger(__name__)

#: Events closer together than this are taken by one scan of the source tree.
SCAN_MIN_INTERVAL_S = 0.1


class SourceScanner:
    """Queues an instance's settled source files for every destination."""

    def __init__(
        self, context: InstanceContext, lifecycle: SourceLifecycle, *, watch: bool = True
    ) -> None:
        self.context = context
        self.lifecycle = lifecycle
        self._watch = watch
        self._watchers: dict[str, DirectoryWatcher] = {}
        self._dirty = True
        self._refused: set[str] = set()
        # Files stamped ahead of our wall clock: (size, mtime_ns) and the monotonic time they
        # were first seen so; pruned each scan to what is still there and not queued.
        self._ahead: dict[str, tuple[tuple[int, int], float]] = {}
        self._thread = threading.Thread(
            target=self._scan_loop, name=f"egress-{context.id}-scan", daemon=True
        )

    def start(self) -> None:
        """Starts the scanner thread."""
        self._thread.start()

    def close(self) -> None:
        """Waits for the scanner thread (once stopping is set) and closes every watch."""
        if self._thread.is_alive():
            self._thread.join(10)
        for watcher in list(self._watchers.values()):
            watcher.close()

    def submit(self, files: Mapping[str, Path]) -> None:
        """Queues the files of a one-shot send (by relative path) not already queued."""
        for rel, path in files.items():
            if not path.is_file():
                raise FileNotFoundError(f"{path} is not a regular file")
            existing = self.context.state.find_active(self.context.id, rel)
            if existing is None:
                self._queue(rel, str(path))

    def _changed(self) -> None:
        with self.context.wake:
            self._dirty = True
            self.context.wake.notify_all()

    def _scan_loop(self) -> None:
        ctx = self.context
        last = 0.0
        while not ctx.stopping.is_set():
            # At most one scan per SCAN_MIN_INTERVAL_S: a burst of events (our own
            # deletions among them) is taken in one scan rather than one scan each.
            pause = last + SCAN_MIN_INTERVAL_S - time.monotonic()
            if pause > 0 and ctx.stopping.wait(pause):
                return
            last = time.monotonic()
            with ctx.wake:
                self._dirty = False
            try:
                wait = self.scan()
            except Exception:  # the scanner must outlive any one bad directory entry
                _log.exception(
                    "instance %s: scanning %s failed; trying again", ctx.id, ctx.spec.source.path
                )
                wait = 5.0
            deadline = None if wait is None else time.monotonic() + wait
            with ctx.wake:
                # The condition is shared with the workers: only a change in the tree, the
                # next settle deadline or stopping starts another scan.
                while not self._dirty and not ctx.stopping.is_set():
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    ctx.wake.wait(remaining)

    def _watch_dir(self, directory: str) -> None:
        if not self._watch or directory in self._watchers:
            return
        try:
            self._watchers[directory] = DirectoryWatcher(
                directory, self._changed, name=f"egress-{self.context.id}-watch"
            ).start()
        except OSError as error:
            _log.warning("instance %s: cannot watch %s: %s", self.context.id, directory, error)
            return
        # The directory was listed before its watch existed: what landed in between (a new
        # subdirectory, a file renamed in) raised no event, so one more scan looks again.
        self._changed()

    def scan(self) -> float | None:
        """Queues every settled file; returns seconds until the next settle deadline."""
        ctx = self.context
        source = ctx.spec.source
        root = str(source.path)
        real_root = os.path.realpath(root)
        archive = str(ctx.spec.archive_dir) if ctx.spec.archive_dir else None
        now = time.time()
        wait: float | None = None
        seen: set[str] = set()
        for directory in [d for d in self._watchers if not os.path.isdir(d)]:
            self._watchers.pop(directory).close()
        # One query per scan: every inotify event (our own deletions too) rescans the tree.
        known = {file.rel: file for file in ctx.state.active_files(ctx.id)}
        prefix = root.rstrip(os.sep) + os.sep
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            if archive is not None:
                dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) != archive]
            if not source.recursive:
                dirnames.clear()
            self._watch_dir(dirpath)
            for name in filenames:
                full = os.path.join(dirpath, name)
                rel = full[len(prefix) :].replace(os.sep, "/")
                if not self._wanted(rel, name):
                    continue
                seen.add(rel)
                if rel in known:
                    continue
                try:
                    st = os.lstat(full)
                    if stat.S_ISLNK(st.st_mode):
                        real = os.path.realpath(full)
                        if not real.startswith(real_root + os.sep):
                            self._refuse(rel, f"is a symlink to {real}, outside the source tree")
                            continue
                        st = os.stat(full)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                ready_in = self._ready_in(rel, full, st, now)
                if ready_in > 0:
                    # A missing marker has no deadline: its creation is an inotify event.
                    if ready_in != float("inf"):
                        wait = ready_in if wait is None else min(wait, ready_in)
                    continue
                self._queue(rel, full)
        for rel in [r for r in self._ahead if r not in seen or r in known]:
            del self._ahead[rel]
        for rel, file in known.items():
            if rel not in seen and not os.path.lexists(ctx.source_path(rel)):
                self.lifecycle.gone(file)
        return wait

    def _wanted(self, rel: str, name: str) -> bool:
        source = self.context.spec.source
        if name.endswith(".unskit-part"):
            return False
        if source.completion_marker and name.endswith(source.completion_marker):
            return False
        if not any(
            fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in source.include
        ):
            return False
        return not any(
            fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in source.exclude
        )

    def _ready_in(self, rel: str, full: str, st: os.stat_result, now: float) -> float:
        marker = self.context.spec.source.completion_marker
        if marker:
            # With a marker the writer says when it is done; no settle time applies.
            return 0.0 if os.path.exists(full + marker) else float("inf")
        settle = self.context.spec.source.settle_seconds
        if st.st_mtime <= now:
            self._ahead.pop(rel, None)
            return max(st.st_mtime + settle - now, 0.0)
        # Stamped ahead of our clock (it was stepped back, or the writer's clock is ahead):
        # the wall clock cannot say how long it has been unchanged, so settleSeconds are
        # counted on the monotonic clock from when it was first seen as it is now.
        signature = (st.st_size, st.st_mtime_ns)
        first = self._ahead.get(rel)
        if first is None or first[0] != signature:
            first = self._ahead[rel] = (signature, time.monotonic())
        return max(first[1] + settle - time.monotonic(), 0.0)

    def _refuse(self, rel: str, reason: str) -> None:
        if rel in self._refused:
            return
        self._refused.add(rel)
        _log.warning("instance %s: %s refused: %s", self.context.id, rel, reason)
        self.context.announce("warning", "file-refused", {"file": rel, "reason": reason})

    def _queue(self, rel: str, full: str) -> None:
        ctx = self.context
        try:
            safe_relative(rel)
        except UnsafePathError as error:
            self._refuse(rel, str(error))
            return
        dests = [dest.id for dest in ctx.spec.destinations]
        # Completion deletes the source and records it under this lock: a file completed
        # since the directory was listed is either gone here or still has its record.
        with ctx.lock:
            try:
                st = os.stat(full)
            except FileNotFoundError:
                return
            if ctx.state.find_active(ctx.id, rel) is not None:
                return
            file_id = ctx.state.add_file(ctx.id, rel, st.st_size, st.st_mtime_ns, dests)
        _log.info(
            "instance %s: queued %s (%d bytes) for %s", ctx.id, rel, st.st_size, ", ".join(dests)
        )
        ctx.metrics.counter("egress", "filesQueued", {"instance": ctx.id}).inc()
        ctx.announce("info", "file-queued", {"file": rel, "size": st.st_size, "fileId": file_id})
        ctx.notify()
