"""Files replaced whole: a reader or a crash sees the old content or the new, never a part."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["fsync_directory", "write_atomically"]


def write_atomically(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replaces `path` with `data` through a hidden temporary file, durably (file and folder
    fsynced); the file has `mode` from its first byte, so a secret is never world-readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Makes a rename or a new file in `directory` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
