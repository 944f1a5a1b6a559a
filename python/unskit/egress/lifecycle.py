"""What becomes of a queued file's source: checked before each send, started over when it
changes, settled when it vanishes, and archived or deleted once every destination has
verified its copy."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import PurePosixPath

from unskit.egress.backends import Backend, safe_relative
from unskit.egress.context import InstanceContext
from unskit.egress.records import DeliveryRecord, DeliveryState, FileRecord, FileState

__all__ = ["SourceLifecycle"]

_log = logging.getLogger(__name__)


class SourceLifecycle:
    """The source side of one instance's files, from queued to completed or vanished."""

    def __init__(self, context: InstanceContext, backends: Mapping[str, Backend]) -> None:
        self.context = context
        # By destination id: where a restarted or vanished file's partial copies are discarded.
        self.backends = backends

    def unchanged(self, file: FileRecord) -> bool:
        """Whether the source is as queued; a changed one starts over, a gone one is settled."""
        try:
            st = os.stat(self.context.source_path(file.rel))
        except FileNotFoundError:
            self.gone(file)
            return False
        if st.st_size == file.size and st.st_mtime_ns == file.mtime_ns:
            return True
        self.restart(file)
        return False

    def restart(self, file: FileRecord) -> None:
        """The source changed: every destination starts over once it settles again."""
        ctx = self.context
        with ctx.lock:
            try:
                st = os.stat(ctx.source_path(file.rel))
            except FileNotFoundError:
                self.gone(file)
                return
            # It is sent again once it has settled anew (a writer may still be at it).
            settle = st.st_mtime + ctx.spec.source.settle_seconds
            before = ctx.state.restart_file(file.id, st.st_size, st.st_mtime_ns, settle)
            self._discard(file, before)
        _log.warning("instance %s: %s changed; every destination starts over", ctx.id, file.rel)
        ctx.announce("warning", "file-changed", {"file": file.rel, "size": st.st_size})
        ctx.notify()

    def _discard(self, file: FileRecord, deliveries: list[DeliveryRecord]) -> None:
        for delivery in deliveries:
            backend = self.backends.get(delivery.dest)
            if backend is not None and delivery.state is not DeliveryState.VERIFIED:
                backend.discard(PurePosixPath(file.rel), delivery.upload_id)

    def gone(self, file: FileRecord) -> None:
        """The source vanished: completed if every destination had it, else vanished."""
        ctx = self.context
        with ctx.lock:
            current = ctx.state.file(file.id)
            if current is None or current.state is not FileState.ACTIVE:
                return
            deliveries = ctx.state.deliveries(file.id)
            wanted = {dest.id for dest in ctx.spec.destinations}
            if all(d.state is DeliveryState.VERIFIED for d in deliveries if d.dest in wanted):
                # Deleted (or archived) before the crash that kept it from being recorded.
                ctx.state.finish_file(file.id, FileState.COMPLETED)
                return
            self._discard(file, deliveries)
            ctx.state.finish_file(file.id, FileState.VANISHED)
        _log.warning("instance %s: %s vanished before every destination had it", ctx.id, file.rel)
        ctx.announce("warning", "file-vanished", {"file": file.rel})

    def complete_if_done(self, file: FileRecord) -> None:
        """Archives or deletes the source once every destination verified its copy."""
        ctx = self.context
        with ctx.lock:
            wanted = {d.id for d in ctx.spec.destinations}
            deliveries = [d for d in ctx.state.deliveries(file.id) if d.dest in wanted]
            if not deliveries or any(d.state is not DeliveryState.VERIFIED for d in deliveries):
                return
            if not self.unchanged(file):
                return
            archive = ctx.spec.archive_dir
            if ctx.files is not None:
                ctx.state.finish_file(file.id, FileState.COMPLETED)
                ctx.notify()
                return
            try:
                self._archive_or_delete(file)
            except OSError as error:
                _log.error(
                    "instance %s: %s delivered everywhere but not %s: %s",
                    ctx.id,
                    file.rel,
                    "archived" if archive else "deleted",
                    error,
                )
                return
            ctx.state.finish_file(file.id, FileState.COMPLETED)
        ctx.metrics.counter("egress", "filesCompleted", {"instance": ctx.id}).inc()
        _log.info(
            "instance %s: %s completed (%s)", ctx.id, file.rel, "archived" if archive else "deleted"
        )
        ctx.announce(
            "info",
            "file-completed",
            {
                "file": file.rel,
                "size": file.size,
                "destinations": sorted(wanted),
                "action": "archive" if archive else "delete",
            },
        )

    def _archive_or_delete(self, file: FileRecord) -> None:
        source = self.context.source_path(file.rel)
        marker = self.context.spec.source.completion_marker
        archive = self.context.spec.archive_dir
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
