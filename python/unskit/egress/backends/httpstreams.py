"""The bytes of one `http` delivery, without requests: the request body that reads the source
block by block (each block passes the throttle, feeds the digest and counts as progress), the
read-back that re-reads the uploaded object range by range on its own connection behind the
upload, and `_Sent`, what one upload did."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from unskit.egress.backends import Transfer
from unskit.egress.backends.remote import CHUNK
from unskit.egress.verify import Digest, new_digest
from unskit.errors import SourceChangedError, TransferInterruptedError

if TYPE_CHECKING:
    from unskit.egress.backends.http import HttpBackend


class _Body:
    """`length` bytes of the source as a request body: each block passes the throttle, feeds
    the digest and counts as progress."""

    def __init__(self, source: BinaryIO, length: int, digest: Digest, transfer: Transfer) -> None:
        self._source = source
        self._length = length
        self._remaining = length
        self._digest = digest
        self._transfer = transfer

    def __len__(self) -> int:
        return self._length

    def read(self, size: int = -1) -> bytes:
        if self._remaining <= 0:
            return b""
        size = self._remaining if size is None or size < 0 else min(size, self._remaining)
        block = self._source.read(min(size, CHUNK))
        if not block:
            raise SourceChangedError(f"{self._transfer.relative} shrank while it was sent")
        if not self._transfer.throttle.acquire(len(block)):
            raise TransferInterruptedError(f"{self._transfer.relative}: interrupted")
        self._digest.update(block)
        self._remaining -= len(block)
        self._transfer.journal.sent(len(block))
        return block


class _ReadBack:
    """Reads the object back range by range on its own connection while the rest is still
    being uploaded, so the verification's read costs little time after the last PUT."""

    def __init__(self, backend: HttpBackend, url: str, path: str, size: int) -> None:
        self._backend = backend
        self._url = url
        self._path = path
        self._size = size
        self.digest = new_digest(backend.algorithm)
        self._read = 0
        self._available = 0
        self._finished = False
        self._stopped = False
        self._error: BaseException | None = None
        self._ignored = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="egress-http-readback", daemon=True)
        self._thread.start()

    def advance(self, position: int) -> None:
        """Bytes 0..position are at the server."""
        with self._changed:
            self._available = position
            self._changed.notify()

    def finish(self) -> bytes | None:
        """The digest of the whole object once read; None when the server ignored ranges
        (the caller reads it back whole). Raises what the reading raised."""
        self.advance(self._size)
        with self._changed:
            self._finished = True
            self._changed.notify()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return None if self._ignored else self.digest.digest()

    def stop(self) -> None:
        """Ends the thread without a result (the upload failed or went whole)."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    while not self._stopped and self._read >= self._available:
                        if self._finished:
                            return
                        self._changed.wait()
                    if self._stopped:
                        return
                    start, end = self._read, self._available
                if not self._backend.read_range(
                    self._url, self._path, start, end, self._size, self.digest, reader=True
                ):
                    self._ignored = True
                    return
                self._read = end
        except BaseException as exc:  # handed to the uploading thread by finish()
            self._error = exc


@dataclass(frozen=True)
class _Sent:
    """What one upload did: where it resumed, the bytes it sent, the last reply's headers,
    the digest of the whole file as sent."""

    resumed_from: int
    bytes: int
    headers: Mapping[str, str]
    digest: Digest
    #: The read-back running behind the upload, if one was started.
    readback: _ReadBack | None = None
