"""One open file on disk (written as a hidden ``.tmp``, renamed once closed), the
process identity that names files, and the crashed recorders' leftovers set aside."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from unskit.recorder.columns import _Columns

__all__ = [
    "ABANDONED_SUFFIX",
    "TMP_SUFFIX",
    "FileFailure",
    "process_identity",
    "recover_leftovers",
]

# The logger keeps the name it had before this module was split out of writer.py.
_log = logging.getLogger("unskit.recorder.writer")

TMP_SUFFIX = ".parquet.tmp"
ABANDONED_SUFFIX = ".parquet.abandoned"


def process_identity() -> str:
    """``{host}-{pid}-{random}``: names this process's files apart from every other
    recorder's (a share group's members write into one root) and from its own last run's
    (a container restarts with the same pid)."""
    host = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())
    return f"{host or 'host'}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class FileFailure:
    """A file that could not be written: its rows are lost, its .tmp removed."""

    path: Path
    rows_lost: int
    error: str


@dataclass
class _OpenFile:
    partition: tuple[str, ...]
    tag_keys: tuple[str, ...]
    path: Path
    schema: pa.Schema
    buffer: _Columns
    opened: float
    handle: IO[bytes] | None = None
    writer: pq.ParquetWriter | None = None
    rows_written: int = 0
    bytes_written: int = 0
    last_used: float = field(default=0.0)

    @property
    def rows(self) -> int:
        return self.rows_written + self.buffer.count

    @property
    def tmp(self) -> Path:
        return self.path.with_name(f".{self.path.name}.tmp")

    def discard(self) -> None:
        # Best effort: the file is being given up, so a second failure must not hide the first.
        with contextlib.suppress(Exception):
            if self.writer is not None:
                self.writer.close()
        with contextlib.suppress(OSError):
            if self.handle is not None:
                self.handle.close()
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)


def recover_leftovers(output: Path, identity: str) -> list[Path]:
    """Renames the hidden ``.tmp`` files a crashed recorder of this host left (its pid is
    gone, or it is ours from an earlier run) to ``.parquet.abandoned``: they have no footer
    and cannot be read, and neither a reader nor the egress must take them. Returns the new
    names."""
    host, pid, _ = identity.rsplit("-", 2)
    moved: list[Path] = []
    if not output.is_dir():
        return moved
    for tmp in output.rglob(f".{host}-*{TMP_SUFFIX}"):
        parts = tmp.name[len(host) + 2 :].split("-")
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        owner = int(parts[0])
        if tmp.name.startswith(f".{identity}-"):
            continue
        if owner != int(pid) and _alive(owner):
            continue
        target = tmp.with_name(tmp.name[: -len(TMP_SUFFIX)] + ABANDONED_SUFFIX)
        try:
            os.replace(tmp, target)
        except OSError as error:
            _log.warning("recorder: leftover %s not set aside: %s", tmp, error)
            continue
        moved.append(target)
    return moved


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
