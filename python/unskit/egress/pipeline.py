"""The egress pipeline: per instance, a scanner that queues settled source files and one
worker per destination that delivers them; a file completes (source deleted or archived)
only once every destination has delivered and verified it.

Threads never poll: the scanner sleeps until inotify reports a change or the next file's
settle deadline; a destination worker sleeps until a file is queued, a retry falls due,
or the instance is resumed."""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from unskit.config.secrets import SecretResolver
from unskit.config.watch import DirectoryWatcher
from unskit.egress.backends import Backend, Outcome, Transfer, open_backend, safe_relative
from unskit.egress.config import DestinationSpec, EgressSettings, InstanceSpec
from unskit.egress.state import (
    DeliveryRecord,
    DeliveryState,
    EgressState,
    FileRecord,
    FileState,
    Part,
)
from unskit.egress.throttle import Throttle, TokenBucket
from unskit.errors import (
    EgressError,
    SourceChangedError,
    TransferInterruptedError,
    UnsafePathError,
    VerificationError,
)
from unskit.runtime.metrics import MetricsRegistry

__all__ = ["EventSink", "InstancePipeline", "Pipeline", "ProgressSink"]

_log = logging.getLogger(__name__)

#: (severity, event type, context, instance): how the pipeline announces what it did.
EventSink = Callable[[str, str, Mapping[str, Any], str], None]
#: (instance, destination, relative path, bytes done, size): live progress for a CLI.
ProgressSink = Callable[[str, str, str, int, int], None]
#: Events closer together than this are taken by one scan of the source tree.
SCAN_MIN_INTERVAL_S = 0.1
#: How many queued files sb/status lists per instance.
STATUS_QUEUE_LIMIT = 100


def _no_events(_severity: str, _type: str, _context: Mapping[str, Any], _instance: str) -> None:
    return None


@dataclass
class _Journal:
    """Records one delivery's progress in the state store and reports it."""

    pipeline: InstancePipeline
    file: FileRecord
    dest: str
    sent_total: int = 0
    last_event: float = field(default_factory=time.monotonic)

    def offset(self, offset: int) -> None:
        self.pipeline.state.save_offset(self.file.id, self.dest, offset, self.sent_total)

    def upload(self, upload_id: str | None) -> None:
        self.pipeline.state.save_upload(self.file.id, self.dest, upload_id)

    def part(self, part: Part) -> None:
        self.pipeline.state.save_part(self.file.id, self.dest, part, self.sent_total)

    def forget_part(self, number: int) -> None:
        self.pipeline.state.forget_part(self.file.id, self.dest, number)

    def sent(self, amount: int) -> None:
        self.sent_total += amount
        self.pipeline.on_sent(self, amount)


class _DestinationWorker:
    """Delivers an instance's queued files to one destination, one file at a time."""

    def __init__(self, pipeline: InstancePipeline, spec: DestinationSpec, backend: Backend) -> None:
        self.pipeline = pipeline
        self.spec = spec
        self.backend = backend
        self.bucket = TokenBucket(spec.bandwidth)
        self.current: str | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"egress-{pipeline.spec.id}-{spec.id}", daemon=True
        )

    def _run(self) -> None:
        pipeline = self.pipeline
        while not pipeline.stopping.is_set():
            wait: float | None = None
            if not pipeline.paused:
                due, wait = self._next_due()
                if due is not None:
                    self._deliver(*due)
                    continue
            with pipeline.wake:
                if pipeline.stopping.is_set():
                    return
                pipeline.wake.wait(wait)

    def _next_due(self) -> tuple[tuple[FileRecord, DeliveryRecord] | None, float | None]:
        now = time.time()
        due, later = self.pipeline.state.next_due(self.pipeline.spec.id, self.spec.id, now)
        return due, None if later is None else max(later - now, 0.01)

    def _deliver(self, file: FileRecord, delivery: DeliveryRecord) -> None:
        pipeline = self.pipeline
        if not pipeline.source_unchanged(file):
            return
        journal = _Journal(pipeline, file, self.spec.id)
        transfer = Transfer(
            source=pipeline.source_path(file.rel),
            relative=PurePosixPath(file.rel),
            size=file.size,
            mtime_ns=file.mtime_ns,
            offset=delivery.offset,
            upload_id=delivery.upload_id,
            parts=pipeline.state.parts(file.id, self.spec.id),
            throttle=Throttle(
                [pipeline.bucket, self.bucket, *pipeline.shared_buckets], pipeline.halt
            ),
            cancel=pipeline.halt,
            journal=journal,
        )
        self.current = file.rel
        try:
            outcome = self.backend.deliver(transfer)
        except TransferInterruptedError:
            _log.info("%s -> %s: interrupted, progress kept", file.rel, self.spec.id)
            return
        except SourceChangedError as error:
            _log.warning("%s -> %s: %s; starting over", file.rel, self.spec.id, error)
            pipeline.restart(file)
            return
        except VerificationError as error:
            pipeline.state.reset_delivery(file.id, self.spec.id)
            self.backend.discard(transfer.relative, None)
            pipeline.failed_attempt(file, self.spec, str(error), verification=True)
            return
        except UnsafePathError as error:
            pipeline.failed_attempt(file, self.spec, str(error), permanent=True)
            return
        except EgressError as error:
            pipeline.failed_attempt(file, self.spec, str(error))
            return
        except Exception as error:  # a backend bug must not kill the worker thread
            _log.exception("%s -> %s: unexpected failure", file.rel, self.spec.id)
            pipeline.failed_attempt(file, self.spec, f"{type(error).__name__}: {error}")
            return
        finally:
            self.current = None
        pipeline.delivered(file, self.spec, outcome, journal)


class InstancePipeline:
    """One instance: its source watch, its queue and its destination workers."""

    def __init__(
        self,
        spec: InstanceSpec,
        state: EgressState,
        *,
        metrics: MetricsRegistry,
        events: EventSink = _no_events,
        secrets: SecretResolver | None = None,
        shared_buckets: tuple[TokenBucket, ...] = (),
        progress_interval_s: float = 1.0,
        progress: ProgressSink | None = None,
        watch: bool = True,
        files: Mapping[str, Path] | None = None,
    ) -> None:
        self.spec = spec
        # One-shot mode (`unskit egress send`): these files, by relative path, instead of
        # a watched directory; they are delivered but never deleted or archived.
        self.files = dict(files) if files is not None else None
        self.state = state
        self.metrics = metrics
        self.events = events
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.bucket = TokenBucket(spec.bandwidth)
        self.shared_buckets = shared_buckets
        self.stopping = threading.Event()
        # Set while paused or stopping: transfers in flight stop at their next chunk.
        self.halt = threading.Event()
        self.paused = False
        self.wake = threading.Condition()
        self._lock = threading.RLock()
        self._watch = watch
        self._watchers: dict[str, DirectoryWatcher] = {}
        self._dirty = True
        self._refused: set[str] = set()
        self.workers = [
            _DestinationWorker(self, dest, open_backend(dest.settings, secrets))
            for dest in spec.destinations
        ]
        self._scanner = threading.Thread(
            target=self._scan_loop, name=f"egress-{spec.id}-scan", daemon=True
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> InstancePipeline:
        """Creates the source directory if missing, starts watching and delivering."""
        self.spec.source.path.mkdir(parents=True, exist_ok=True)
        dest_ids = [dest.id for dest in self.spec.destinations]
        for file in self.state.active_files(self.spec.id):
            self.state.ensure_destinations(file.id, dest_ids)
            # Verified everywhere before a crash (or a destination was removed from the
            # configuration): only the completion is left to do.
            self._complete_if_done(file)
        if self.files is None:
            self._scanner.start()
        else:
            self._submit(self.files)
        for worker in self.workers:
            worker.thread.start()
        return self

    def stop(self) -> None:
        """Stops every thread; transfers in flight keep their recorded progress."""
        self.stopping.set()
        self.halt.set()
        self._notify()
        for worker in self.workers:
            if worker.thread.is_alive():
                worker.thread.join(30)
        if self._scanner.is_alive():
            self._scanner.join(10)
        for watcher in list(self._watchers.values()):
            watcher.close()
        for worker in self.workers:
            worker.backend.close()

    def pause(self) -> bool:
        """Holds every transfer of this instance (in-flight ones stop at the next chunk)."""
        with self._lock:
            changed = not self.paused
            self.paused = True
            self.halt.set()
        return changed

    def resume(self) -> bool:
        """Lets transfers run again."""
        with self._lock:
            changed = self.paused
            self.paused = False
            if not self.stopping.is_set():
                self.halt.clear()
        self._notify()
        return changed

    def retry(self, rel: str | None) -> list[str]:
        """Puts permanently failed deliveries back in the queue."""
        files = self.state.retry_failed(self.spec.id, rel)
        self._notify()
        return files

    def _notify(self) -> None:
        with self.wake:
            self.wake.notify_all()

    # -- the source ------------------------------------------------------------------------

    def source_path(self, rel: str) -> Path:
        """The absolute source path of a relative one."""
        if self.files is not None and rel in self.files:
            return self.files[rel]
        return self.spec.source.path.joinpath(*safe_relative(rel).parts)

    def _submit(self, files: Mapping[str, Path]) -> None:
        for rel, path in files.items():
            if not path.is_file():
                raise FileNotFoundError(f"{path} is not a regular file")
            existing = self.state.find_active(self.spec.id, rel)
            if existing is None:
                self._queue(rel, str(path))

    def settled(self, rels: Collection[str]) -> dict[str, dict[str, str]]:
        """Per file, each destination's state, once no delivery of these files is still
        pending (one-shot mode); empty while any is."""
        result: dict[str, dict[str, str]] = {}
        for file in self.state.files_by_rel(self.spec.id, rels):
            states = {d.dest: d.state.value for d in self.state.deliveries(file.id)}
            if DeliveryState.PENDING.value in states.values():
                return {}
            result[file.rel] = states
        return result if set(result) == set(rels) else {}

    def _changed(self) -> None:
        with self.wake:
            self._dirty = True
            self.wake.notify_all()

    def _scan_loop(self) -> None:
        last = 0.0
        while not self.stopping.is_set():
            # At most one scan per SCAN_MIN_INTERVAL_S: a burst of events (our own
            # deletions among them) is taken in one scan rather than one scan each.
            pause = last + SCAN_MIN_INTERVAL_S - time.monotonic()
            if pause > 0 and self.stopping.wait(pause):
                return
            last = time.monotonic()
            with self.wake:
                self._dirty = False
            try:
                wait = self.scan()
            except Exception:  # the scanner must outlive any one bad directory entry
                _log.exception(
                    "instance %s: scanning %s failed; trying again",
                    self.spec.id,
                    self.spec.source.path,
                )
                wait = 5.0
            deadline = None if wait is None else time.monotonic() + wait
            with self.wake:
                # The condition is shared with the workers: only a change in the tree, the
                # next settle deadline or stopping starts another scan.
                while not self._dirty and not self.stopping.is_set():
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self.wake.wait(remaining)

    def _watch_dir(self, directory: str) -> None:
        if not self._watch or directory in self._watchers:
            return
        try:
            self._watchers[directory] = DirectoryWatcher(
                directory, self._changed, name=f"egress-{self.spec.id}-watch"
            ).start()
        except OSError as error:
            _log.warning("instance %s: cannot watch %s: %s", self.spec.id, directory, error)
            return
        # The directory was listed before its watch existed: what landed in between (a new
        # subdirectory, a file renamed in) raised no event, so one more scan looks again.
        self._changed()

    def scan(self) -> float | None:
        """Queues every settled file; returns seconds until the next settle deadline."""
        source = self.spec.source
        root = str(source.path)
        real_root = os.path.realpath(root)
        archive = str(self.spec.archive_dir) if self.spec.archive_dir else None
        now = time.time()
        wait: float | None = None
        seen: set[str] = set()
        for directory in [d for d in self._watchers if not os.path.isdir(d)]:
            self._watchers.pop(directory).close()
        # One query per scan: every inotify event (our own deletions too) rescans the tree.
        known = {file.rel: file for file in self.state.active_files(self.spec.id)}
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
                ready_in = self._ready_in(full, st, now)
                if ready_in > 0:
                    # A missing marker has no deadline: its creation is an inotify event.
                    if ready_in != float("inf"):
                        wait = ready_in if wait is None else min(wait, ready_in)
                    continue
                self._queue(rel, full)
        for rel, file in known.items():
            if rel not in seen and not os.path.lexists(self.source_path(rel)):
                self._source_gone(file)
        return wait

    def _wanted(self, rel: str, name: str) -> bool:
        source = self.spec.source
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

    def _ready_in(self, full: str, st: os.stat_result, now: float) -> float:
        marker = self.spec.source.completion_marker
        if marker:
            # With a marker the writer says when it is done; no settle time applies.
            return 0.0 if os.path.exists(full + marker) else float("inf")
        return max(st.st_mtime + self.spec.source.settle_seconds - now, 0.0)

    def _refuse(self, rel: str, reason: str) -> None:
        if rel in self._refused:
            return
        self._refused.add(rel)
        _log.warning("instance %s: %s refused: %s", self.spec.id, rel, reason)
        self.events("warning", "file-refused", {"file": rel, "reason": reason}, self.spec.id)

    def _queue(self, rel: str, full: str) -> None:
        try:
            safe_relative(rel)
        except UnsafePathError as error:
            self._refuse(rel, str(error))
            return
        dests = [dest.id for dest in self.spec.destinations]
        # Completion deletes the source and records it under this lock: a file completed
        # since the directory was listed is either gone here or still has its record.
        with self._lock:
            try:
                st = os.stat(full)
            except FileNotFoundError:
                return
            if self.state.find_active(self.spec.id, rel) is not None:
                return
            file_id = self.state.add_file(self.spec.id, rel, st.st_size, st.st_mtime_ns, dests)
        _log.info(
            "instance %s: queued %s (%d bytes) for %s",
            self.spec.id,
            rel,
            st.st_size,
            ", ".join(dests),
        )
        self.metrics.counter("egress", "filesQueued", {"instance": self.spec.id}).inc()
        self.events(
            "info",
            "file-queued",
            {"file": rel, "size": st.st_size, "fileId": file_id},
            self.spec.id,
        )
        self._notify()

    def source_unchanged(self, file: FileRecord) -> bool:
        """Whether the source is as queued; a changed one starts over, a gone one is settled."""
        try:
            st = os.stat(self.source_path(file.rel))
        except FileNotFoundError:
            self._source_gone(file)
            return False
        if st.st_size == file.size and st.st_mtime_ns == file.mtime_ns:
            return True
        self.restart(file)
        return False

    def restart(self, file: FileRecord) -> None:
        """The source changed: every destination starts over once it settles again."""
        with self._lock:
            try:
                st = os.stat(self.source_path(file.rel))
            except FileNotFoundError:
                self._source_gone(file)
                return
            # It is sent again once it has settled anew (a writer may still be at it).
            settle = st.st_mtime + self.spec.source.settle_seconds
            before = self.state.restart_file(file.id, st.st_size, st.st_mtime_ns, settle)
            self._discard(file, before)
        _log.warning(
            "instance %s: %s changed; every destination starts over", self.spec.id, file.rel
        )
        self.events("warning", "file-changed", {"file": file.rel, "size": st.st_size}, self.spec.id)
        self._notify()

    def _discard(self, file: FileRecord, deliveries: list[DeliveryRecord]) -> None:
        by_id = {worker.spec.id: worker for worker in self.workers}
        for delivery in deliveries:
            worker = by_id.get(delivery.dest)
            if worker is not None and delivery.state is not DeliveryState.VERIFIED:
                worker.backend.discard(PurePosixPath(file.rel), delivery.upload_id)

    def _source_gone(self, file: FileRecord) -> None:
        with self._lock:
            current = self.state.file(file.id)
            if current is None or current.state is not FileState.ACTIVE:
                return
            deliveries = self.state.deliveries(file.id)
            wanted = {dest.id for dest in self.spec.destinations}
            if all(d.state is DeliveryState.VERIFIED for d in deliveries if d.dest in wanted):
                # Deleted (or archived) before the crash that kept it from being recorded.
                self.state.finish_file(file.id, FileState.COMPLETED)
                return
            self._discard(file, deliveries)
            self.state.finish_file(file.id, FileState.VANISHED)
        _log.warning(
            "instance %s: %s vanished before every destination had it", self.spec.id, file.rel
        )
        self.events("warning", "file-vanished", {"file": file.rel}, self.spec.id)

    # -- outcomes --------------------------------------------------------------------------

    def on_sent(self, journal: _Journal, amount: int) -> None:
        """Progress of one transfer: metrics always, an event at most every interval."""
        dims = {"instance": self.spec.id, "destination": journal.dest}
        self.metrics.counter("egress", "bytesSent", dims, unit="Bytes").inc(amount)
        if self.progress is not None:
            self.progress(
                self.spec.id, journal.dest, journal.file.rel, journal.sent_total, journal.file.size
            )
        now = time.monotonic()
        if now - journal.last_event >= self.progress_interval_s:
            journal.last_event = now
            self.events(
                "info",
                "file-progress",
                {
                    "file": journal.file.rel,
                    "destination": journal.dest,
                    "bytesSent": journal.sent_total,
                    "size": journal.file.size,
                },
                self.spec.id,
            )

    def failed_attempt(
        self,
        file: FileRecord,
        dest: DestinationSpec,
        error: str,
        *,
        permanent: bool = False,
        verification: bool = False,
    ) -> None:
        """Counts a failure; retried with backoff until maxAttempts, then failed for good."""
        retry = self.spec.retry
        record = self.state.delivery(file.id, dest.id)
        attempts = (record.attempts if record else 0) + 1
        permanent = permanent or attempts >= retry.max_attempts
        # A failed verification is sent again at once: the destination answered, the
        # bytes were wrong.
        delay = 0.0 if verification else retry.backoff_seconds(attempts)
        self.state.mark_failed_attempt(
            file.id, dest.id, error, time.time() + delay, permanent=permanent
        )
        dims = {"instance": self.spec.id, "destination": dest.id}
        self.metrics.counter("egress", "failures", dims).inc()
        context = {"file": file.rel, "destination": dest.id, "attempts": attempts, "error": error}
        if permanent:
            _log.error(
                "instance %s: %s -> %s failed for good after %d attempts: %s",
                self.spec.id,
                file.rel,
                dest.id,
                attempts,
                error,
            )
            self.events("error", "delivery-failed", context, self.spec.id)
        else:
            self.metrics.counter("egress", "retries", dims).inc()
            _log.warning(
                "instance %s: %s -> %s attempt %d failed (%s); retry in %.1f s",
                self.spec.id,
                file.rel,
                dest.id,
                attempts,
                error,
                delay,
            )
            kind = "verification-failed" if verification else "delivery-retry"
            self.events("warning", kind, {**context, "retryInSeconds": delay}, self.spec.id)
        self._notify()

    def delivered(
        self, file: FileRecord, dest: DestinationSpec, outcome: Outcome, journal: _Journal
    ) -> None:
        """One destination verified its copy; the file completes when every one has."""
        self.state.mark_verified(file.id, dest.id)
        dims = {"instance": self.spec.id, "destination": dest.id}
        self.metrics.counter("egress", "filesDelivered", dims).inc()
        _log.info(
            "instance %s: %s delivered to %s and verified (resumed from %d, sent %d)",
            self.spec.id,
            file.rel,
            dest.id,
            outcome.resumed_from,
            outcome.bytes_sent,
        )
        self.events(
            "info",
            "file-delivered",
            {
                "file": file.rel,
                "destination": dest.id,
                "size": file.size,
                "resumedFrom": outcome.resumed_from,
                "bytesSent": outcome.bytes_sent,
                **dict(outcome.detail),
            },
            self.spec.id,
        )
        self._complete_if_done(file)
        self._notify()

    def _complete_if_done(self, file: FileRecord) -> None:
        with self._lock:
            wanted = {d.id for d in self.spec.destinations}
            deliveries = [d for d in self.state.deliveries(file.id) if d.dest in wanted]
            if not deliveries or any(d.state is not DeliveryState.VERIFIED for d in deliveries):
                return
            if not self.source_unchanged(file):
                return
            source = self.source_path(file.rel)
            marker = self.spec.source.completion_marker
            archive = self.spec.archive_dir
            if self.files is not None:
                self.state.finish_file(file.id, FileState.COMPLETED)
                self._notify()
                return
            try:
                if archive is not None:
                    target = archive.joinpath(*safe_relative(file.rel).parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(source, target)
                    if marker and os.path.exists(str(source) + marker):
                        shutil.move(str(source) + marker, str(target) + marker)
                else:
                    source.unlink()
                    if marker:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(str(source) + marker)
            except OSError as error:
                _log.error(
                    "instance %s: %s delivered everywhere but not %s: %s",
                    self.spec.id,
                    file.rel,
                    "archived" if archive else "deleted",
                    error,
                )
                return
            self.state.finish_file(file.id, FileState.COMPLETED)
        self.metrics.counter("egress", "filesCompleted", {"instance": self.spec.id}).inc()
        _log.info(
            "instance %s: %s completed (%s)",
            self.spec.id,
            file.rel,
            "archived" if archive else "deleted",
        )
        self.events(
            "info",
            "file-completed",
            {
                "file": file.rel,
                "size": file.size,
                "destinations": sorted(wanted),
                "action": "archive" if archive else "delete",
            },
            self.spec.id,
        )

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The sb/status view: queue and each file's per-destination state."""
        files = self.state.active_files(self.spec.id)
        queue = []
        for file in files[:STATUS_QUEUE_LIMIT]:
            queue.append(
                {
                    "file": file.rel,
                    "size": file.size,
                    "discoveredAt": file.discovered_at,
                    "destinations": {
                        d.dest: {
                            "state": d.state.value,
                            "offset": d.offset,
                            "bytesSent": d.bytes_sent,
                            "attempts": d.attempts,
                            "lastError": d.last_error,
                            "nextAttemptAt": d.next_at or None,
                        }
                        for d in self.state.deliveries(file.id)
                    },
                }
            )
        return {
            "instance": self.spec.id,
            "paused": self.paused,
            "source": str(self.spec.source.path),
            "files": self.state.counts(self.spec.id),
            "destinations": [
                {
                    "id": w.spec.id,
                    "type": w.spec.type,
                    "sending": w.current,
                    "bandwidthBytesPerSec": w.spec.bandwidth,
                }
                for w in self.workers
            ],
            "queue": queue,
            "queueTotal": len(files),
        }


class Pipeline:
    """Every instance of a file-egress configuration over one state store."""

    def __init__(
        self,
        settings: EgressSettings,
        state: EgressState,
        *,
        metrics: MetricsRegistry,
        events: EventSink = _no_events,
        secrets: SecretResolver | None = None,
        progress: ProgressSink | None = None,
        watch: bool = True,
    ) -> None:
        self.settings = settings
        self.state = state
        shared = TokenBucket(settings.bandwidth)
        self.instances: dict[str, InstancePipeline] = {}
        try:
            for spec in settings.instances:
                self.instances[spec.id] = InstancePipeline(
                    spec,
                    state,
                    metrics=metrics,
                    events=events,
                    secrets=secrets,
                    shared_buckets=(shared,),
                    progress_interval_s=settings.progress_interval_s,
                    progress=progress,
                    watch=watch,
                )
        except BaseException:
            for instance in self.instances.values():
                instance.stop()
            raise

    def start(self) -> Pipeline:
        """Prunes old records, then starts every instance."""
        pruned = self.state.prune(self.settings.retention_hours * 3600)
        if pruned:
            _log.info("forgot %d finished file records", pruned)
        for instance in self.instances.values():
            instance.start()
        return self

    def stop(self) -> None:
        """Stops every instance."""
        for instance in self.instances.values():
            instance.halt.set()
            instance.stopping.set()
        for instance in self.instances.values():
            instance.stop()
