"""The one place file checksums are computed: CRC32C and SHA-256, streaming and composite,
through the Rust digests (`unskit.digests`); MD5 (entity tags only) through hashlib."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from enum import Enum
from typing import Protocol

from unskit.digests import Crc32c, Sha256

__all__ = [
    "Algorithm",
    "Digest",
    "b64",
    "composite",
    "file_digest",
    "md5_hex",
    "multipart_etag",
    "new_digest",
]

#: Read size for re-hashing a file: large enough that the syscall cost disappears.
HASH_CHUNK = 1024 * 1024


class Algorithm(str, Enum):
    """checksumAlgorithm of a destination."""

    CRC32C = "CRC32C"
    SHA256 = "SHA256"


class Digest(Protocol):
    """A running checksum: feed bytes, then read the raw digest."""

    def update(self, data: bytes | memoryview) -> None:
        """Adds bytes."""
        ...

    def digest(self) -> bytes:
        """The raw digest of everything added so far (4 bytes for CRC32C, 32 for SHA-256)."""
        ...


def new_digest(algorithm: Algorithm | str) -> Digest:
    """A fresh running digest of `algorithm` (CRC32C big-endian as S3 encodes it, or SHA-256)."""
    if Algorithm(algorithm) is Algorithm.SHA256:
        return Sha256()
    return Crc32c()


def md5_hex(data: bytes | memoryview) -> str:
    """The MD5 an S3 entity tag of a single-part, non-KMS object carries (hex)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def multipart_etag(part_etags: Iterable[str]) -> str:
    """S3's multipart entity tag: MD5 of the concatenated part MD5s, dash, part count."""
    raw = [bytes.fromhex(etag.strip('"')) for etag in part_etags]
    return f"{hashlib.md5(b''.join(raw), usedforsecurity=False).hexdigest()}-{len(raw)}"


def b64(raw: bytes) -> str:
    """The base64 text S3 and HTTP headers carry a digest as."""
    return base64.b64encode(raw).decode("ascii")


def composite(algorithm: Algorithm | str, part_digests: Iterable[bytes]) -> bytes:
    """The digest of the concatenated part digests: S3's COMPOSITE multipart checksum."""
    digest = new_digest(algorithm)
    for part in part_digests:
        digest.update(part)
    return digest.digest()


def file_digest(
    path: str | os.PathLike[str], algorithm: Algorithm | str, *, limit: int | None = None
) -> bytes:
    """The digest of a file's content (its first `limit` bytes when given)."""
    digest = new_digest(algorithm)
    remaining = limit
    # Immutable chunks: the Rust digest reads `bytes` in place, without a copy.
    with open(path, "rb", buffering=0) as stream:
        while remaining is None or remaining > 0:
            chunk = stream.read(HASH_CHUNK if remaining is None else min(HASH_CHUNK, remaining))
            if not chunk:
                break
            digest.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return digest.digest()
