"""Catalog queries: captures and capture groups as sb/capture-status and the group replies read
them. The catalog, not the announcement, is authoritative for outcomes."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from unskit.camera.catalog import Catalog, GroupRecord
from unskit.camera.jobs import Job, JobState, group_state
from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError

__all__ = ["CatalogQueries"]


class CatalogQueries:
    """Reads of the catalog; a missing capture or group is CAPTURE_NOT_FOUND."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def capture(self, capture_id: str, instance: str | None = None) -> Job:
        """A capture by captureId (of `instance` when given)."""
        job = self._catalog.get(capture_id)
        if job is None or (instance is not None and job.camera != instance):
            raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no capture {capture_id!r}")
        return job

    def by_request(self, instance: str, request_id: str) -> Job:
        """The capture a camera accepted for a requestId."""
        job = self._catalog.by_request(instance, request_id)
        if job is None:
            raise CommandError(
                ErrorCode.CAPTURE_NOT_FOUND,
                f"camera {instance!r} accepted no capture for requestId {request_id!r}",
            )
        return job

    def in_states(self, states: Collection[JobState], instance: str | None) -> list[Job]:
        """Captures in `states` (of one camera when given)."""
        return self._catalog.in_states(states, instance)

    def group(self, key: str, by_request: bool) -> tuple[GroupRecord, list[Job]]:
        """A group and its members, by captureGroupId or by requestId."""
        catalog = self._catalog
        record = catalog.group_by_request(key) if by_request else catalog.group(key)
        if record is None:
            what = "requestId" if by_request else "captureGroupId"
            raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no group for {what} {key!r}")
        return record, catalog.members(record.group_id)

    def group_summary(self, record: GroupRecord, jobs: list[Job]) -> dict[str, Any]:
        """The group object of an sb/capture-status group page."""
        state = group_state(jobs)
        terminal = all(job.terminal for job in jobs)
        failed = [job for job in jobs if job.state is not JobState.SUCCEEDED]
        return {
            "captureGroupId": record.group_id,
            "requestId": record.request_id,
            "state": state,
            "acceptedAtMs": record.accepted_ms,
            "terminalAtMs": max(job.terminal_ms or 0 for job in jobs) if terminal else None,
            "errorCode": failed[0].error_code if terminal and state == "FAILED" else None,
            "errorMessage": (
                f"{len(failed)} of {len(jobs)} members did not succeed"
                if terminal and failed
                else None
            ),
            "result": self.group_reply(record.group_id) if terminal else None,
        }

    def group_reply(self, group_id: str) -> dict[str, Any]:
        """The sb/capture-group reply: id, requestId, aggregate state, member bodies."""
        record = self._catalog.group(group_id)
        assert record is not None
        members = self._catalog.members(group_id)
        return {
            "captureGroupId": group_id,
            "requestId": record.request_id,
            "state": group_state(members),
            "members": [dict(job.result) for job in members if job.result is not None],
        }
