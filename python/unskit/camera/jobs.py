"""Capture jobs: the JobState machine, identifiers and the job record the catalog keeps."""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "BACKLOG",
    "IN_FLIGHT",
    "NON_TERMINAL",
    "STAGES",
    "TERMINAL",
    "Job",
    "JobState",
    "group_state",
    "new_id",
    "now_ms",
    "rfc3339",
]


class JobState(str, enum.Enum):
    """Where a capture is; the last four are terminal."""

    ACCEPTED = "ACCEPTED"
    QUEUED = "QUEUED"
    ACQUIRING = "ACQUIRING"
    ENCODING = "ENCODING"
    PERSISTING = "PERSISTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    INTERRUPTED = "INTERRUPTED"

    def __str__(self) -> str:
        return self.value


BACKLOG = frozenset({JobState.ACCEPTED, JobState.QUEUED})
IN_FLIGHT = frozenset({JobState.ACQUIRING, JobState.ENCODING, JobState.PERSISTING})
NON_TERMINAL = BACKLOG | IN_FLIGHT
TERMINAL = frozenset(JobState) - NON_TERMINAL
#: The order non-terminal states advance in (a group reports its least advanced member).
PROGRESS = (
    JobState.ACCEPTED,
    JobState.QUEUED,
    JobState.ACQUIRING,
    JobState.ENCODING,
    JobState.PERSISTING,
)
#: The stage a failure is reported in, by the state the job was in.
STAGES = {
    JobState.ACCEPTED: "queue",
    JobState.QUEUED: "queue",
    JobState.ACQUIRING: "acquisition",
    JobState.ENCODING: "encoding",
    JobState.PERSISTING: "persistence",
}


def new_id(prefix: str) -> str:
    """A fresh identifier: ``cap_``, ``grp_``, ``op_`` or ``evt_`` and 24 hex digits."""
    return f"{prefix}_{secrets.token_hex(12)}"


def now_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def rfc3339(epoch_ms: int) -> str:
    """An RFC 3339 UTC timestamp with milliseconds."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Job:
    """One capture as the catalog stores it."""

    capture_id: str
    camera: str
    state: JobState
    trigger: Mapping[str, Any]
    profile: str
    capture_mode: str
    timeout_ms: int
    accepted_ms: int
    correlation_id: str
    event_id: str
    request_id: str | None = None
    group_id: str | None = None
    group_size: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    terminal_ms: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    result: Mapping[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        """SUCCEEDED, FAILED, CANCELLED or INTERRUPTED."""
        return self.state in TERMINAL

    def status_body(self) -> dict[str, Any]:
        """The sb/capture-status job body."""
        return {
            "captureId": self.capture_id,
            "instance": self.camera,
            "state": self.state.value,
            "acceptedAtMs": self.accepted_ms,
            "terminalAtMs": self.terminal_ms,
            "captureGroupId": self.group_id,
            "errorCode": self.error_code,
            "errorMessage": self.error_message,
            "result": dict(self.result) if self.result is not None else None,
        }


def group_state(members: Sequence[Job]) -> str:
    """COMPLETED, PARTIAL or FAILED once all members are terminal, else the laggard's state."""
    live = [job.state for job in members if not job.terminal]
    if live:
        return min(live, key=PROGRESS.index).value
    succeeded = sum(job.state is JobState.SUCCEEDED for job in members)
    if succeeded == len(members):
        return "COMPLETED"
    return "PARTIAL" if succeeded else "FAILED"
