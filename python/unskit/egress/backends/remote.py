"""What the streamed remote backends (sftp, ftps) share and that needs no SDK: the remote
path of a file, the source read in chunks under the throttle, and the digest of the prefix
a resumed delivery does not send again."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from unskit.config.secrets import Secret, SecretRef, SecretResolver, resolve_value
from unskit.egress.backends import Transfer, safe_relative
from unskit.egress.verify import Algorithm, Digest
from unskit.errors import SecretError, SourceChangedError, TransferInterruptedError

__all__ = [
    "CHECKPOINT_BYTES",
    "CHUNK",
    "DEFAULT_ALGORITHM",
    "DEFAULT_TEMP_SUFFIX",
    "bundle_fields",
    "hash_prefix",
    "remote_path",
    "send_chunks",
]

CHUNK = 1024 * 1024
#: Progress is recorded every this many bytes: a crash re-sends at most this much.
CHECKPOINT_BYTES = 8 * CHUNK
DEFAULT_TEMP_SUFFIX = ".part"
# The copy is read back and re-hashed locally: a cryptographic digest by default, since the
# read-back costs far more than the hash.
DEFAULT_ALGORITHM = Algorithm.SHA256


def remote_path(base_dir: str, relative: PurePosixPath) -> str:
    """baseDir joined with the source-relative path ('..' and absolute paths refused)."""
    rel = str(safe_relative(str(relative)))
    return posixpath.join(base_dir, rel) if base_dir else rel


def hash_prefix(source: BinaryIO, digest: Digest, offset: int, transfer: Transfer) -> None:
    """Feeds the source's first `offset` bytes (already at the destination) to `digest`."""
    position = 0
    while position < offset:
        chunk = source.read(min(CHUNK, offset - position))
        if not chunk:
            raise SourceChangedError(f"{transfer.relative} shrank while it was sent")
        digest.update(chunk)
        position += len(chunk)


def send_chunks(source: BinaryIO, transfer: Transfer, limit: int) -> Iterator[bytes]:
    """Up to `limit` more bytes of the source in chunks, each after the throttle allowed
    it; TransferInterruptedError when a pause or shutdown stops the transfer."""
    remaining = limit
    while remaining > 0:
        chunk = source.read(min(CHUNK, remaining))
        if not chunk:
            return
        if not transfer.throttle.acquire(len(chunk)):
            raise TransferInterruptedError(f"{transfer.relative}: interrupted")
        remaining -= len(chunk)
        yield chunk


def bundle_fields(
    settings: Mapping[str, Any],
    secrets: SecretResolver | None,
    fields: tuple[str, ...],
) -> dict[str, Secret | None]:
    """Credential fields from `credentials` (a `$secret` bundle, each field optional) or,
    absent that, from the entry's own keys (each a string or a `$secret`)."""
    ref = SecretRef.parse(settings.get("credentials"))
    resolved: dict[str, Secret | None] = {}
    for name in fields:
        if ref is not None:
            try:
                resolved[name] = resolve_value(SecretRef(ref.name, name), secrets)
            except SecretError:
                resolved[name] = None  # a bundle holds the fields of one auth method only
            continue
        value = settings.get(name)
        resolved[name] = resolve_value(SecretRef.parse(value) or value, secrets)
    if ref is not None and not any(resolved.values()):
        # Nothing resolved at all: the reference itself is broken; say why.
        resolve_value(SecretRef(ref.name, fields[0]), secrets)
    return resolved
