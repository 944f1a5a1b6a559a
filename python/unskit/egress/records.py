"""The records the egress progress store hands out: a file, one delivery of it to one
destination, one uploaded part; and how a row of the store becomes one."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "DELIVERY_COLUMNS",
    "FILE_COLUMNS",
    "DeliveryRecord",
    "DeliveryState",
    "FileRecord",
    "FileState",
    "Part",
    "delivery_record",
    "file_record",
]


class FileState(str, Enum):
    ACTIVE = "active"
    COMPLETED = "completed"
    VANISHED = "vanished"


class DeliveryState(str, Enum):
    PENDING = "pending"
    VERIFIED = "verified"
    FAILED = "failed"


@dataclass(frozen=True)
class FileRecord:
    id: int
    instance: str
    rel: str
    size: int
    mtime_ns: int
    state: FileState
    discovered_at: float


@dataclass(frozen=True)
class DeliveryRecord:
    file_id: int
    dest: str
    state: DeliveryState
    offset: int
    upload_id: str | None
    attempts: int
    last_error: str | None
    next_at: float
    bytes_sent: int


@dataclass(frozen=True)
class Part:
    """One uploaded part of a multipart transfer, as recorded when its upload returned."""

    number: int
    etag: str
    checksum: bytes
    size: int


#: The `files` columns a FileRecord is read from, in its field order.
FILE_COLUMNS = "id, instance, rel, size, mtime_ns, state, discovered_at"
#: The `deliveries` columns a DeliveryRecord is read from, in its field order.
DELIVERY_COLUMNS = (
    "file_id, dest, state, offset, upload_id, attempts, last_error, next_at, bytes_sent"
)


def file_record(row: tuple[object, ...]) -> FileRecord:
    """A FileRecord from a row of FILE_COLUMNS."""
    ident, instance, rel, size, mtime_ns, state, discovered = row
    return FileRecord(
        int(ident),  # type: ignore[call-overload]
        str(instance),
        str(rel),
        int(size),  # type: ignore[call-overload]
        int(mtime_ns),  # type: ignore[call-overload]
        FileState(state),
        float(discovered),  # type: ignore[arg-type]
    )


def delivery_record(row: tuple[object, ...]) -> DeliveryRecord:
    """A DeliveryRecord from a row of DELIVERY_COLUMNS."""
    file_id, dest, state, offset, upload_id, attempts, error, next_at, sent = row
    return DeliveryRecord(
        int(file_id),  # type: ignore[call-overload]
        str(dest),
        DeliveryState(state),
        int(offset),  # type: ignore[call-overload]
        None if upload_id is None else str(upload_id),
        int(attempts),  # type: ignore[call-overload]
        None if error is None else str(error),
        float(next_at),  # type: ignore[arg-type]
        int(sent),  # type: ignore[call-overload]
    )
