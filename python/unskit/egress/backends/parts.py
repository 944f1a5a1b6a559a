"""Parallel part uploads shared by the backends that send a large file as numbered parts
(objectstore multipart parts, blobstore staged blocks): each part is read with pread,
hashed, throttled, put, then recorded in the journal before the next is counted."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable

from unskit.egress.backends import Transfer
from unskit.egress.records import Part
from unskit.egress.verify import Algorithm, new_digest
from unskit.errors import SourceChangedError, TransferInterruptedError

__all__ = ["PutPart", "upload_parts"]

#: Sends part `number` (its bytes and their digest); returns the tag the store keeps for it
#: (an ETag, a block id).
PutPart = Callable[[int, bytes, bytes], str]


def upload_parts(
    transfer: Transfer,
    parts: dict[int, Part],
    todo: list[int],
    *,
    part_size: int,
    algorithm: Algorithm,
    concurrency: int,
    thread_prefix: str,
    put: PutPart,
) -> int:
    """Uploads the `todo` parts of `transfer` on `concurrency` threads, adding each to
    `parts` and the journal as it is acknowledged; returns the bytes sent. The first failure
    cancels the parts not yet started and is raised."""
    lock = threading.Lock()
    sent = 0

    def upload(number: int) -> None:
        nonlocal sent
        if transfer.cancel.is_set():
            raise TransferInterruptedError(f"{transfer.relative}: interrupted")
        start = (number - 1) * part_size
        size = min(part_size, transfer.size - start)
        with open(transfer.source, "rb", buffering=0) as source:
            data = os.pread(source.fileno(), size, start)
        if len(data) != size:
            raise SourceChangedError(f"{transfer.relative} shrank while it was sent")
        digest = new_digest(algorithm)
        digest.update(data)
        checksum = digest.digest()
        if not transfer.throttle.acquire(size):
            raise TransferInterruptedError(f"{transfer.relative}: interrupted")
        part = Part(number, put(number, data, checksum), checksum, size)
        with lock:
            sent += size
            parts[number] = part
            transfer.journal.part(part)
            transfer.journal.sent(size)

    with concurrent.futures.ThreadPoolExecutor(
        concurrency, thread_name_prefix=thread_prefix
    ) as pool:
        futures = [pool.submit(upload, n) for n in todo]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return sent
