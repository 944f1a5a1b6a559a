"""The `local` backend: a directory (or a mounted share). Streams into a temporary file at
the recorded offset, re-hashes it against the source, then renames it into place."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from unskit.egress.backends import Outcome, Transfer, safe_target
from unskit.egress.verify import Algorithm, file_digest, new_digest
from unskit.errors import (
    DestinationError,
    SourceChangedError,
    TransferInterruptedError,
    VerificationError,
)

__all__ = ["TEMP_SUFFIX", "LocalBackend"]

TEMP_SUFFIX = ".unskit-part"
CHUNK = 1024 * 1024
#: Progress is committed every this many bytes: a crash re-sends at most this much.
CHECKPOINT_BYTES = 8 * CHUNK
# Local always re-hashes with SHA-256: a cryptographic digest costs little next to the disk.
ALGORITHM = Algorithm.SHA256


def temp_path(target: Path) -> Path:
    """Where a delivery in progress is written: a hidden sibling of the target."""
    return target.with_name(f".{target.name}{TEMP_SUFFIX}")


class LocalBackend:
    """Delivers into `path`, recreating the source subtree."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.root = Path(os.path.abspath(settings["path"]))
        self.fsync = bool(settings.get("fsync", False))

    def deliver(self, transfer: Transfer) -> Outcome:
        """Streams the missing bytes, re-hashes the copy, renames it into place."""
        target = safe_target(self.root, transfer.relative)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            return self._deliver(transfer, target)
        except (TransferInterruptedError, SourceChangedError, VerificationError):
            raise
        except OSError as exc:
            raise DestinationError(f"local {self.root}: {exc}") from exc

    def _deliver(self, transfer: Transfer, target: Path) -> Outcome:
        temp = temp_path(target)
        transfer.check_source()
        if transfer.offset > 0 and not temp.exists() and self._already_there(transfer, target):
            return Outcome(transfer.size, 0, {"path": str(target), "alreadyDelivered": True})
        try:
            offset = min(transfer.offset, temp.stat().st_size)
        except FileNotFoundError:
            offset = 0
        digest = new_digest(ALGORITHM)
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        position = 0
        sent = 0
        with (
            open(transfer.source, "rb", buffering=0) as source,
            open(temp, "r+b" if offset else "wb", buffering=0) as sink,
        ):
            sink.truncate(offset)
            # The prefix already delivered is hashed again from the source, not re-sent.
            while position < offset:
                count = source.readinto(view[: min(CHUNK, offset - position)])
                if not count:
                    raise SourceChangedError(f"{transfer.relative} shrank while it was sent")
                digest.update(view[:count])
                position += count
            sink.seek(offset)
            since_checkpoint = 0
            while True:
                count = source.readinto(view)
                if not count:
                    break
                if not transfer.throttle.acquire(count):
                    self._checkpoint(sink, transfer, position, since_checkpoint)
                    raise TransferInterruptedError(f"{transfer.relative}: interrupted")
                chunk = view[:count]
                sink.write(chunk)
                digest.update(chunk)
                position += count
                sent += count
                since_checkpoint += count
                transfer.journal.sent(count)
                if since_checkpoint >= CHECKPOINT_BYTES:
                    self._checkpoint(sink, transfer, position, since_checkpoint)
                    since_checkpoint = 0
            if self.fsync:
                os.fsync(sink.fileno())
        transfer.check_source()
        if position != transfer.size:
            raise SourceChangedError(f"{transfer.relative}: read {position} of {transfer.size}")
        if file_digest(temp, ALGORITHM) != digest.digest():
            temp.unlink()
            raise VerificationError(f"{target}: the copy's SHA-256 differs from the source's")
        os.replace(temp, target)
        if self.fsync:
            self._fsync_dir(target.parent)
        return Outcome(offset, sent, {"path": str(target)})

    @staticmethod
    def _already_there(transfer: Transfer, target: Path) -> bool:
        """Progress was recorded but the temporary file is gone: a crash after the rename
        and before the verification was recorded. The copy in place counts only if its
        SHA-256 is the source's."""
        try:
            if target.stat().st_size != transfer.size:
                return False
        except FileNotFoundError:
            return False
        same = file_digest(target, ALGORITHM) == file_digest(transfer.source, ALGORITHM)
        transfer.check_source()
        return same

    def _checkpoint(self, sink: Any, transfer: Transfer, position: int, pending: int) -> None:
        if pending == 0:
            return
        if self.fsync:
            os.fsync(sink.fileno())
        transfer.journal.offset(position)

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Removes the temporary file of an abandoned delivery."""
        with contextlib.suppress(OSError, ValueError):
            temp_path(safe_target(self.root, relative)).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to release."""
