"""The capture verbs: sb/capture, sb/capture-submit, sb/capture-group,
sb/capture-group-submit, sb/capture-status and sb/capture-cancel."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from unskit.camera.admission import CaptureRequest
from unskit.camera.catalog import GroupRecord
from unskit.camera.config import CameraSettings
from unskit.camera.jobs import Job, JobState, group_state, new_id, now_ms, rfc3339
from unskit.camera.pages import Pages, snapshot_owner
from unskit.camera.service import CameraService
from unskit.commands import (
    CURSOR,
    ID,
    INSTANCE,
    LIMIT,
    REASON,
    REQUEST_ID,
    BodySpec,
    Choice,
    CommandContext,
    ErrorCode,
    Integer,
    JsonObject,
    Kind,
    ListOf,
    Param,
    RequestIdRule,
    Scope,
    Text,
    Verb,
    bad_args,
)
from unskit.commands.fields import REPLY_BUDGET_BYTES, json_size
from unskit.errors import CommandError

__all__ = ["CaptureVerbs"]

CAPTURE_TIMEOUT = Integer(minimum=1000, maximum=1_800_000)
PROFILE = Text(min_bytes=1, max_bytes=128)
STATES = Choice(tuple(state.value for state in JobState))
_OPERATOR_CANCEL = "cancelled by an operator"


class CaptureVerbs:
    """The capture verbs over a CameraService."""

    def __init__(self, service: CameraService, pages: Pages) -> None:
        self.service = service
        self._pages = pages

    @property
    def settings(self) -> CameraSettings:
        """The running settings (a reload replaces them)."""
        return self.service.settings

    def verbs(self) -> list[Verb]:
        """The six capture verbs, in the specification's order."""
        metadata = Param(JsonObject(max_bytes=self.settings.limits.max_metadata_bytes))
        capture_body = BodySpec(
            {
                "captureProfile": Param(PROFILE),
                "timeoutMs": Param(CAPTURE_TIMEOUT),
                "metadata": metadata,
            }
        )
        group_body = BodySpec(
            {
                "instances": Param(ListOf(INSTANCE, min_items=0, max_items=1000), required=True),
                "captureProfile": Param(PROFILE),
                "profileOverrides": Param(JsonObject(max_bytes=64 * 1024, max_depth=1)),
                "timeoutMs": Param(CAPTURE_TIMEOUT),
                "metadata": metadata,
            }
        )
        paging = {"limit": Param(LIMIT), "cursor": Param(CURSOR)}
        required = RequestIdRule.REQUIRED
        return [
            Verb(
                "capture",
                self._capture,
                scope=Scope.INSTANCE,
                kind=Kind.DEFERRED,
                request_id=required,
                body=capture_body,
                summary="capture one image; the reply is the terminal capture body",
            ),
            Verb(
                "capture-submit",
                self._capture_submit,
                scope=Scope.INSTANCE,
                request_id=required,
                body=capture_body,
                summary="accept one capture and reply with its captureId at once",
            ),
            Verb(
                "capture-group",
                self._capture_group,
                kind=Kind.DEFERRED,
                request_id=required,
                body=group_body,
                summary="capture from several cameras; the reply holds every member's body",
            ),
            Verb(
                "capture-group-submit",
                self._capture_group_submit,
                request_id=required,
                body=group_body,
                summary="accept a capture group and reply with its ids at once",
            ),
            Verb(
                "capture-status",
                self._capture_status,
                scope=Scope.BOTH,
                body=BodySpec(
                    {
                        "captureId": Param(ID),
                        "captureGroupId": Param(ID),
                        "requestId": Param(REQUEST_ID),
                        "states": Param(ListOf(STATES, min_items=1, max_items=len(JobState))),
                        **paging,
                    }
                ),
                summary="a capture, a group or a list of captures, by id, requestId or state",
            ),
            Verb(
                "capture-cancel",
                self._capture_cancel,
                request_id=required,
                body=BodySpec(
                    {"captureId": Param(ID), "captureGroupId": Param(ID), "reason": Param(REASON)}
                ),
                summary="cancel a capture or every member of a group not yet terminal",
            ),
        ]

    def _request(
        self,
        context: CommandContext,
        instance: str,
        profile_name: str | None,
        trigger_type: str,
    ) -> CaptureRequest:
        session = self.service.sessions.enabled(instance)
        assert context.request_id is not None
        return self.service.admission.request(
            session,
            profile_name,
            context.body.get("timeoutMs"),
            {"type": trigger_type, "requestId": context.request_id},
            metadata=context.body.get("metadata") or {},
            correlation_id=context.request.correlation_id,
            request_id=context.request_id if trigger_type == "command" else None,
        )

    # -- captures ---------------------------------------------------------------------------

    def _submit_one(self, context: CommandContext) -> Job:
        assert context.instance is not None
        request = self._request(
            context, context.instance, context.body.get("captureProfile"), "command"
        )
        return self.service.admission.submit([request])[0]

    def _capture(self, context: CommandContext) -> Future[Mapping[str, Any]]:
        job = self._submit_one(context)
        return self.service.admission.wait_capture(job.capture_id)

    def _capture_submit(self, context: CommandContext) -> Mapping[str, Any]:
        job = self._submit_one(context)
        return {
            "captureId": job.capture_id,
            "state": job.state.value,
            "acceptedAt": rfc3339(job.accepted_ms),
            "statusVerb": "sb/capture-status",
        }

    def _submit_group(self, context: CommandContext) -> tuple[GroupRecord, list[Job]]:
        body = context.body
        instances: list[str] = body["instances"]
        if len(instances) < 2:
            raise bad_args(f"instances must name at least 2 cameras, not {len(instances)}")
        if len(set(instances)) != len(instances):
            raise bad_args("instances must not repeat a camera")
        cap = self.settings.limits.max_cameras_per_group
        if len(instances) > cap:
            raise CommandError(
                ErrorCode.GROUP_TOO_LARGE,
                f"the group names {len(instances)} cameras; limits.maxCamerasPerGroup is {cap}",
            )
        metadata = body.get("metadata")
        if metadata:
            # Every member's body carries a copy, and the group reply carries every body.
            size = json_size(metadata)
            if size * len(instances) > REPLY_BUDGET_BYTES:
                raise bad_args(
                    f"metadata encodes to {size} bytes and is copied into each of "
                    f"{len(instances)} members; the copies may total {REPLY_BUDGET_BYTES} bytes"
                )
        overrides: dict[str, Any] = body.get("profileOverrides") or {}
        for name, profile in overrides.items():
            if name not in instances:
                raise bad_args(f"profileOverrides.{name} is not one of instances")
            PROFILE.check(profile, f"profileOverrides.{name}")
        # Every member is resolved before anything is written: all or nothing.
        requests = []
        for instance in instances:
            profile = overrides.get(instance, body.get("captureProfile"))
            requests.append(self._request(context, instance, profile, "group-command"))
        assert context.request_id is not None
        group = GroupRecord(new_id("grp"), context.request_id, now_ms(), len(instances))
        return group, self.service.admission.submit(requests, group)

    def _capture_group(self, context: CommandContext) -> Future[Mapping[str, Any]]:
        group, _ = self._submit_group(context)
        return self.service.admission.wait_group(group.group_id)

    def _capture_group_submit(self, context: CommandContext) -> Mapping[str, Any]:
        group, jobs = self._submit_group(context)
        return {
            "captureGroupId": group.group_id,
            "state": group_state(jobs),
            "members": [
                {"instance": job.camera, "captureId": job.capture_id, "state": job.state.value}
                for job in jobs
            ],
        }

    # -- capture-status ---------------------------------------------------------------------

    def _capture_status(self, context: CommandContext) -> Mapping[str, Any]:
        body = context.body
        present = {name for name in ("captureId", "captureGroupId", "requestId", "states")
                   if name in body}  # fmt: skip
        paging = {"limit", "cursor"} & set(body)
        instance = context.instance
        queries = self.service.queries
        if present == {"captureId"} and not paging:
            return queries.capture(body["captureId"], instance).status_body()
        if present == {"captureGroupId"} and instance is None:
            return self._group_page(context, body["captureGroupId"], by_request=False)
        if present == {"requestId"} and instance is not None and not paging:
            return queries.by_request(instance, body["requestId"]).status_body()
        if present == {"requestId"} and instance is None:
            return self._group_page(context, body["requestId"], by_request=True)
        if present == {"states"}:
            states = body["states"]
            if len(set(states)) != len(states):
                raise bad_args("states must not repeat a state")
            owner = snapshot_owner("list", instance, sorted(states))
            jobs: list[Any] = []
            if "cursor" not in body:
                found = queries.in_states([JobState(s) for s in states], instance)
                jobs = [job.status_body() for job in found]
            items, cursor, _ = self._pages.page(context, owner, jobs, {})
            return {"jobs": items, "nextCursor": cursor}
        raise bad_args(
            "choose exactly one lookup: captureId; captureGroupId; instance and requestId; "
            "requestId; or states (with optional instance)"
        )

    def _group_page(self, context: CommandContext, key: str, by_request: bool) -> dict[str, Any]:
        owner = snapshot_owner("group", by_request, key)
        members: list[Any] = []
        extra: Mapping[str, Any] = {}
        if "cursor" not in context.body:
            queries = self.service.queries
            record, jobs = queries.group(key, by_request)
            extra = {"group": queries.group_summary(record, jobs)}
            members = [job.status_body() for job in jobs]
        items, cursor, extra = self._pages.page(context, owner, members, extra)
        return {**extra, "members": items, "nextCursor": cursor}

    # -- cancel ------------------------------------------------------------------------------

    def _capture_cancel(self, context: CommandContext) -> Mapping[str, Any]:
        body = context.body
        if ("captureId" in body) == ("captureGroupId" in body):
            raise bad_args("give exactly one of captureId or captureGroupId")
        reason = body.get("reason") or _OPERATOR_CANCEL
        if "captureId" in body:
            cancelled, state = self.service.outcomes.cancel(body["captureId"], reason)
            return {
                "captureId": body["captureId"],
                "cancelled": cancelled,
                "state": state.value,
                "cancellationInProgress": False,
            }
        group_id = body["captureGroupId"]
        members = [
            {
                "captureId": job.capture_id,
                "instance": job.camera,
                "cancelled": cancelled,
                "state": state.value,
                "cancellationInProgress": False,
            }
            for job, cancelled, state in self.service.outcomes.cancel_group(group_id, reason)
        ]
        done = sum(1 for member in members if member["cancelled"])
        return {
            "captureGroupId": group_id,
            "cancelledMembers": done,
            "unchangedMembers": len(members) - done,
            "members": members,
        }
