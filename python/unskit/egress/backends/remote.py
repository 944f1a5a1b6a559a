"""What the streamed remote backends (sftp, ftps) share and that needs no SDK: the delivery
itself (resume at the recorded offset into `<name><tempSuffix>`, send in checkpointed
segments, read the copy back and re-hash it, rename it into place, a copy renamed before a
crash verified in place), the remote path of a file, the source read in chunks under the
throttle, and the credentials. Each backend module supplies its SDK's file operations."""

from __future__ import annotations

import contextlib
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any, BinaryIO, ClassVar, Generic, TypeVar

from unskit.config.secrets import Secret, SecretRef, SecretResolver, resolve_value
from unskit.egress.backends import Outcome, Transfer, safe_relative
from unskit.egress.verify import Algorithm, Digest, new_digest
from unskit.errors import (
    DestinationError,
    EgressError,
    SecretError,
    SourceChangedError,
    TransferInterruptedError,
    VerificationError,
)

__all__ = [
    "CHECKPOINT_BYTES",
    "CHUNK",
    "DEFAULT_ALGORITHM",
    "DEFAULT_TEMP_SUFFIX",
    "StreamedBackend",
    "bundle_fields",
    "hash_prefix",
    "remote_path",
    "send_chunks",
    "send_segments",
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


def send_segments(
    transfer: Transfer, offset: int, send: Callable[[int, int], int], *, create: bool = False
) -> int:
    """Sends the source from `offset` in segments of CHECKPOINT_BYTES through
    `send(position, step)`, which returns the bytes it sent and records its checkpoint;
    returns the bytes sent. With `create`, one segment is sent even for an empty source.
    A segment cut short means the source shrank."""
    position = offset
    while create or position < transfer.size:
        create = False
        step = min(CHECKPOINT_BYTES, transfer.size - position)
        got = send(position, step)
        position += got
        if got < step:
            raise SourceChangedError(f"{transfer.relative} shrank while it was sent")
    return position - offset


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


#: The SDK's session: an FTP control connection, an SFTP client.
S = TypeVar("S")


class StreamedBackend(ABC, Generic[S]):
    """Delivers under `baseDir` on one remote file server: the missing bytes are written at
    the recorded offset into `<name><tempSuffix>`, the copy read back and re-hashed, then
    renamed into place. A subclass supplies its SDK's session and file operations."""

    #: What the SDK raises for a failed exchange: the session is closed, DestinationError.
    sdk_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    #: What a best-effort discard swallows besides EgressError.
    discard_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(
        self,
        settings: Mapping[str, Any],
        secrets: SecretResolver | None,
        *,
        scheme: str,
        default_port: int,
        credential_fields: tuple[str, ...],
    ) -> None:
        self.host: str = settings["host"]
        self.port = int(settings.get("port", default_port))
        self.base_dir: str = settings.get("baseDir", "")
        self.temp_suffix: str = settings.get("tempSuffix", DEFAULT_TEMP_SUFFIX)
        self.algorithm = Algorithm(settings.get("checksumAlgorithm", DEFAULT_ALGORITHM))
        self.credentials = bundle_fields(settings, secrets, credential_fields)
        username = self.credentials["username"] or settings.get("username")
        self.username = username.reveal() if isinstance(username, Secret) else username
        self.password = self.credentials["password"]
        self.where = f"{scheme}://{self.host}:{self.port}"

    # -- what each SDK supplies --------------------------------------------------------------

    @abstractmethod
    def connect(self) -> S:
        """The SDK session, connected (again) when it is not open; DestinationError if not."""

    @abstractmethod
    def close(self) -> None:
        """Closes the session and its connection."""

    @abstractmethod
    def _size(self, session: S, path: str) -> int | None:
        """The size of a remote file; None if there is none."""

    @abstractmethod
    def _makedirs(self, session: S, directory: str) -> None:
        """Creates a remote directory and its parents as needed."""

    @abstractmethod
    def _write(
        self,
        session: S,
        transfer: Transfer,
        source: BinaryIO,
        temp: str,
        offset: int,
        temp_size: int | None,
        digest: Digest,
    ) -> int:
        """Feeds the first `offset` bytes of `source` to `digest`, writes the rest into
        `temp` (which holds `temp_size` bytes, or does not exist), recording checkpoints;
        returns the bytes sent."""

    @abstractmethod
    def _read(self, session: S, path: str, size: int, feed: Callable[[bytes], None]) -> None:
        """Reads a remote file of `size` bytes into `feed`, chunk by chunk."""

    @abstractmethod
    def _rename(self, session: S, temp: str, target: str) -> None:
        """Renames `temp` to `target`, replacing it."""

    @abstractmethod
    def _remove(self, session: S, path: str) -> None:
        """Removes a remote file."""

    # -- delivery --------------------------------------------------------------------------

    def deliver(self, transfer: Transfer) -> Outcome:
        """Writes the missing bytes at the recorded offset, re-hashes, renames into place."""
        target = remote_path(self.base_dir, transfer.relative)
        transfer.check_source()
        session = self.connect()
        try:
            return self._deliver(session, transfer, target, target + self.temp_suffix)
        except EgressError:
            raise
        except self.sdk_errors as exc:
            self.close()
            raise DestinationError(f"{self.where}: {target}: {exc}") from exc

    def _deliver(self, session: S, transfer: Transfer, target: str, temp: str) -> Outcome:
        temp_size = self._size(session, temp)
        if (
            transfer.offset > 0
            and temp_size is None
            and self._already_there(session, transfer, target)
        ):
            return Outcome(transfer.size, 0, {"path": target, "alreadyDelivered": True})
        self._makedirs(session, posixpath.dirname(target))
        offset = min(transfer.offset, temp_size or 0)
        digest = new_digest(self.algorithm)
        with open(transfer.source, "rb") as source:
            sent = self._write(session, transfer, source, temp, offset, temp_size, digest)
        transfer.check_source()
        copy = self._read_digest(session, temp, transfer.size)
        if copy != digest.digest():
            raise VerificationError(
                f"{self.where}: {temp}: the copy's {self.algorithm.value} differs from the source's"
            )
        self._rename(session, temp, target)
        return Outcome(offset, sent, {"path": target})

    def _read_digest(self, session: S, path: str, size: int) -> bytes:
        """The digest of the remote file, read back (file servers rarely offer a hash)."""
        digest = new_digest(self.algorithm)
        read = 0

        def feed(chunk: bytes) -> None:
            nonlocal read
            digest.update(chunk)
            read += len(chunk)

        self._read(session, path, size, feed)
        if read != size:
            raise VerificationError(f"{self.where}: {path} holds {read} bytes, {size} were sent")
        return digest.digest()

    def _already_there(self, session: S, transfer: Transfer, target: str) -> bool:
        """Progress was recorded but the temporary file is gone: a crash after the rename and
        before the verification was recorded. The copy in place counts only if it re-hashes
        to the source's digest."""
        if self._size(session, target) != transfer.size:
            return False
        digest = new_digest(self.algorithm)
        with open(transfer.source, "rb") as source:
            hash_prefix(source, digest, transfer.size, transfer)
        try:
            same = self._read_digest(session, target, transfer.size) == digest.digest()
        except VerificationError:
            return False
        transfer.check_source()
        return same

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Removes the temporary file of an abandoned delivery (best effort)."""
        with contextlib.suppress(EgressError, *self.discard_errors):
            temp = remote_path(self.base_dir, relative) + self.temp_suffix
            self._remove(self.connect(), temp)
