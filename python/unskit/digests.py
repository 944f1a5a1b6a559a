"""Streaming SHA-256 and CRC32C over the Rust core, and writing a file while hashing it.

`Sha256` and `Crc32c` take any buffer (bytes, bytearray, memoryview, a numpy array) and
release the GIL for large inputs. `write_hashed` writes and hashes in one pass over memory.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from unskit._core.image import Crc32c, Sha256
from unskit._core.image import write_hashed as _write_hashed

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["ALGORITHMS", "Crc32c", "Sha256", "WrittenFile", "crc32c_base64", "write_hashed"]

ALGORITHMS = ("sha256", "crc32c")


def crc32c_base64(value: int) -> str:
    """Base64 of the big-endian 4-byte CRC32C, as S3 and GCS carry it."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


@dataclass(frozen=True)
class WrittenFile:
    """A file `write_hashed` wrote: its path, size and the digests asked for."""

    path: Path
    size: int
    sha256: bytes | None = None
    crc32c: int | None = None

    @property
    def sha256_hex(self) -> str | None:
        """The SHA-256 as lowercase hex, or None when it was not asked for."""
        return None if self.sha256 is None else self.sha256.hex()

    @property
    def crc32c_base64(self) -> str | None:
        """The CRC32C in the cloud stores' form, or None when it was not asked for."""
        return None if self.crc32c is None else crc32c_base64(self.crc32c)


def write_hashed(
    path: str | os.PathLike[str],
    data: Buffer,
    *,
    fsync: bool = False,
    algorithms: Iterable[str] = ("sha256",),
) -> WrittenFile:
    """Writes `data` to `path` (created or truncated), hashing it in the same pass."""
    wanted = set(algorithms)
    unknown = wanted.difference(ALGORITHMS)
    if unknown:
        raise ValueError(f"unknown digest algorithm(s) {sorted(unknown)}; known: {ALGORITHMS}")
    size, sha256, crc32c = _write_hashed(
        path, data, fsync=fsync, sha256="sha256" in wanted, crc32c="crc32c" in wanted
    )
    return WrittenFile(Path(path), size, sha256, crc32c)
