"""The error codes a command reply may carry: the shared southbound names and the
camera-specific ones of the specification, in one enum every verb uses."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

__all__ = ["FAILURE_FIELDS", "RETRYABLE_CODES", "ErrorCode", "failure_code"]

#: A failure reply holds exactly these fields.
FAILURE_FIELDS = frozenset({"errorCode", "errorMessage"})


class ErrorCode(str, Enum):
    """A reply's ``errorCode``; clients branch on it."""

    BAD_ARGS = "BAD_ARGS"
    NO_SUCH_INSTANCE = "NO_SUCH_INSTANCE"
    CAMERA_DISABLED = "CAMERA_DISABLED"
    DEVICE_UNAVAILABLE = "DEVICE_UNAVAILABLE"
    PAUSED = "PAUSED"
    CAMERA_MOVING = "CAMERA_MOVING"
    UNSUPPORTED_CAPABILITY = "UNSUPPORTED_CAPABILITY"
    UNKNOWN_CAPTURE_PROFILE = "UNKNOWN_CAPTURE_PROFILE"
    QUEUE_FULL = "QUEUE_FULL"
    GROUP_TOO_LARGE = "GROUP_TOO_LARGE"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"
    CAPTURE_TIMEOUT = "CAPTURE_TIMEOUT"
    CAPTURE_CANCELLED = "CAPTURE_CANCELLED"
    PROCESS_INTERRUPTED = "PROCESS_INTERRUPTED"
    CAPTURE_NOT_FOUND = "CAPTURE_NOT_FOUND"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    PREVIOUS_OUTCOME_UNKNOWN = "PREVIOUS_OUTCOME_UNKNOWN"
    REPLY_REQUIRED = "REPLY_REQUIRED"
    UNSUPPORTED_PIXEL_FORMAT = "UNSUPPORTED_PIXEL_FORMAT"
    STORAGE_PRESSURE = "STORAGE_PRESSURE"
    PERSISTENCE_FAILED = "PERSISTENCE_FAILED"
    PTZ_DISABLED = "PTZ_DISABLED"
    PTZ_RANGE_ERROR = "PTZ_RANGE_ERROR"
    PTZ_TIMEOUT = "PTZ_TIMEOUT"
    COMPONENT_STOPPING = "COMPONENT_STOPPING"
    BACKEND_ERROR = "BACKEND_ERROR"
    #: Camera adapter, beyond the spec: the frame is provably the previous capture's.
    STALE_FRAME = "STALE_FRAME"

    def __str__(self) -> str:
        return self.value


# Refusals of the moment: a retry with the same requestId must run again rather than
# replay the refusal, so the idempotency store forgets them.
RETRYABLE_CODES = frozenset(
    {
        ErrorCode.DEVICE_UNAVAILABLE,
        ErrorCode.COMPONENT_STOPPING,
        ErrorCode.QUEUE_FULL,
        ErrorCode.RESOURCE_LIMIT,
        ErrorCode.STORAGE_PRESSURE,
        ErrorCode.PAUSED,
        ErrorCode.CAMERA_MOVING,
    }
)


def failure_code(body: Mapping[str, Any]) -> str | None:
    """The errorCode of a failure reply, None for a success body."""
    # A success body may carry errorCode fields of its own (sb/capture-status's job body),
    # so a failure is a non-null errorCode with nothing beside errorCode and errorMessage.
    code = body.get("errorCode")
    if code is None or not set(body) <= FAILURE_FIELDS:
        return None
    return str(code)
