"""The camera adapter's cmd/sb verbs, exactly as the specification's tables declare them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from unskit.camera.catalog import GroupRecord
from unskit.camera.jobs import BACKLOG, IN_FLIGHT, Job, JobState, new_id, now_ms, rfc3339
from unskit.camera.service import CameraService, CameraState, CaptureRequest, group_state
from unskit.commands import (
    CURSOR,
    ID,
    INSTANCE,
    LIMIT,
    REASON,
    REQUEST_ID,
    BodySpec,
    Boolean,
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
from unskit.commands.fields import DEFAULT_LIMIT, REPLY_BUDGET_BYTES, json_size
from unskit.commands.paging import CursorBook
from unskit.errors import CommandError

__all__ = ["CameraVerbs"]

CAPTURE_TIMEOUT = Integer(minimum=1000, maximum=1_800_000)
PROFILE = Text(min_bytes=1, max_bytes=128)
STATES = Choice(tuple(state.value for state in JobState))
_OPERATOR_CANCEL = "cancelled by an operator"
_OPERATOR_DRAIN = "queue cleared by an operator"


def _owner(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class CameraVerbs:
    """Builds the verb table over a CameraService."""

    def __init__(self, service: CameraService) -> None:
        self.service = service
        self.settings = service.settings
        self._cursors = CursorBook()

    def verbs(self) -> list[Verb]:
        """Every verb of the camera adapter, the not-yet-built ones disabled with a reason."""
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
        discover_reason = (
            "discovery is off (discovery.enabled is false)"
            if not self.settings.discovery_enabled
            else "no backend of this build can discover cameras yet"
        )
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
            Verb(
                "list",
                self._list,
                body=BodySpec(
                    {
                        "includeCapabilities": Param(Boolean()),
                        "includeUnconfigured": Param(Boolean()),
                        **paging,
                    }
                ),
                summary="the configured cameras",
            ),
            Verb(
                "discover",
                self._list,
                enabled=False,
                disabled_reason=discover_reason,
                summary="a bounded, credential-free discovery pass",
            ),
            Verb("status", self._status, scope=Scope.BOTH, summary="camera snapshots"),
            Verb(
                "queue-status",
                self._queue_status,
                scope=Scope.BOTH,
                summary="admission, limits, dispatcher queues and durable job counts",
            ),
            Verb(
                "queue-clear",
                self._queue_clear,
                scope=Scope.BOTH,
                request_id=required,
                body=BodySpec(
                    {
                        "allCameras": Param(Boolean()),
                        "includeInFlight": Param(Boolean(), default=False),
                        "reason": Param(REASON),
                    }
                ),
                summary="cancel the backlog (and with includeInFlight the running captures)",
            ),
            Verb(
                "reconnect",
                self._reconnect,
                scope=Scope.INSTANCE,
                request_id=required,
                body=BodySpec({"reason": Param(REASON)}),
                summary="drop the camera's live session",
            ),
            Verb("pause", self._pause, scope=Scope.INSTANCE, summary="hold new capture work"),
            Verb("resume", self._resume, scope=Scope.INSTANCE, summary="admit capture work again"),
            Verb(
                "ptz",
                self._list,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.CONDITIONAL,
                request_id_needed=lambda body: body.get("operation") != "status",
                enabled=False,
                disabled_reason="pan-tilt-zoom control is not built yet (no backend offers ptz)",
            ),
            Verb(
                "ptz-presets",
                self._list,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.CONDITIONAL,
                request_id_needed=lambda body: body.get("operation") != "list",
                enabled=False,
                disabled_reason="PTZ presets are not built yet (no backend offers presets)",
            ),
        ]

    # -- helpers ----------------------------------------------------------------------------

    def _enabled_camera(self, instance: str | None) -> CameraState:
        assert instance is not None
        camera = self.service.camera(instance)
        if not camera.spec.enabled:
            raise CommandError(ErrorCode.CAMERA_DISABLED, f"camera {instance!r} is disabled")
        return camera

    def _request(
        self,
        context: CommandContext,
        instance: str,
        profile_name: str | None,
        trigger_type: str,
    ) -> CaptureRequest:
        camera = self._enabled_camera(instance)
        profile = self.service.profile(camera, profile_name)
        assert context.request_id is not None
        return CaptureRequest(
            camera=instance,
            profile=profile.name,
            timeout_ms=self.service.timeout_ms(profile, context.body.get("timeoutMs")),
            trigger={"type": trigger_type, "requestId": context.request_id},
            metadata=context.body.get("metadata") or {},
            correlation_id=context.request.correlation_id,
            request_id=context.request_id if trigger_type == "command" else None,
        )

    def _page(
        self, context: CommandContext, owner: str, items: Sequence[Any], extra: Mapping[str, Any]
    ) -> tuple[list[Any], str | None, Mapping[str, Any]]:
        limit = int(context.body.get("limit", DEFAULT_LIMIT))
        cursor = context.body.get("cursor")
        if cursor is not None:
            sliced = self._cursors.next(owner, str(cursor), limit)
        else:
            sliced = self._cursors.first(owner, items, limit, extra)
        return sliced.items, sliced.next_cursor, sliced.extra

    # -- captures ---------------------------------------------------------------------------

    def _submit_one(self, context: CommandContext) -> Job:
        assert context.instance is not None
        request = self._request(
            context, context.instance, context.body.get("captureProfile"), "command"
        )
        return self.service.submit([request])[0]

    def _capture(self, context: CommandContext) -> Future[Mapping[str, Any]]:
        job = self._submit_one(context)
        return self.service.wait_capture(job.capture_id)

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
            self.service.camera(instance)
            profile = overrides.get(instance, body.get("captureProfile"))
            requests.append(self._request(context, instance, profile, "group-command"))
        assert context.request_id is not None
        group = GroupRecord(new_id("grp"), context.request_id, now_ms(), len(instances))
        return group, self.service.submit(requests, group)

    def _capture_group(self, context: CommandContext) -> Future[Mapping[str, Any]]:
        group, _ = self._submit_group(context)
        return self.service.wait_group(group.group_id)

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
        catalog = self.service.catalog
        if present == {"captureId"} and not paging:
            job = catalog.get(body["captureId"])
            if job is None or (instance is not None and job.camera != instance):
                raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no capture {body['captureId']!r}")
            return job.status_body()
        if present == {"captureGroupId"} and instance is None:
            return self._group_page(context, body["captureGroupId"], by_request=False)
        if present == {"requestId"} and instance is not None and not paging:
            job = catalog.by_request(instance, body["requestId"])
            if job is None:
                raise CommandError(
                    ErrorCode.CAPTURE_NOT_FOUND,
                    f"camera {instance!r} accepted no capture for requestId {body['requestId']!r}",
                )
            return job.status_body()
        if present == {"requestId"} and instance is None:
            return self._group_page(context, body["requestId"], by_request=True)
        if present == {"states"}:
            states = body["states"]
            if len(set(states)) != len(states):
                raise bad_args("states must not repeat a state")
            owner = _owner("list", instance, sorted(states))
            jobs: list[Any] = []
            if "cursor" not in body:
                found = catalog.in_states([JobState(s) for s in states], instance)
                jobs = [job.status_body() for job in found]
            items, cursor, _ = self._page(context, owner, jobs, {})
            return {"jobs": items, "nextCursor": cursor}
        raise bad_args(
            "choose exactly one lookup: captureId; captureGroupId; instance and requestId; "
            "requestId; or states (with optional instance)"
        )

    def _group_page(self, context: CommandContext, key: str, by_request: bool) -> dict[str, Any]:
        owner = _owner("group", by_request, key)
        members: list[Any] = []
        extra: Mapping[str, Any] = {}
        if "cursor" not in context.body:
            catalog = self.service.catalog
            record = catalog.group_by_request(key) if by_request else catalog.group(key)
            if record is None:
                what = "requestId" if by_request else "captureGroupId"
                raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no group for {what} {key!r}")
            jobs = catalog.members(record.group_id)
            state = group_state(jobs)
            terminal = all(job.terminal for job in jobs)
            failed = [job for job in jobs if job.state is not JobState.SUCCEEDED]
            extra = {
                "group": {
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
                    "result": self.service.group_reply(record.group_id) if terminal else None,
                }
            }
            members = [job.status_body() for job in jobs]
        items, cursor, extra = self._page(context, owner, members, extra)
        return {**extra, "members": items, "nextCursor": cursor}

    # -- cancel and queue administration ----------------------------------------------------

    def _capture_cancel(self, context: CommandContext) -> Mapping[str, Any]:
        body = context.body
        if ("captureId" in body) == ("captureGroupId" in body):
            raise bad_args("give exactly one of captureId or captureGroupId")
        reason = body.get("reason") or _OPERATOR_CANCEL
        if "captureId" in body:
            cancelled, state = self.service.cancel(body["captureId"], reason)
            return {
                "captureId": body["captureId"],
                "cancelled": cancelled,
                "state": state.value,
                "cancellationInProgress": False,
            }
        group_id = body["captureGroupId"]
        if self.service.catalog.group(group_id) is None:
            raise CommandError(ErrorCode.CAPTURE_NOT_FOUND, f"no capture group {group_id!r}")
        members = []
        for job in self.service.catalog.members(group_id):
            cancelled, state = self.service.cancel(job.capture_id, reason)
            members.append(
                {
                    "captureId": job.capture_id,
                    "instance": job.camera,
                    "cancelled": cancelled,
                    "state": state.value,
                    "cancellationInProgress": False,
                }
            )
        done = sum(1 for member in members if member["cancelled"])
        return {
            "captureGroupId": group_id,
            "cancelledMembers": done,
            "unchangedMembers": len(members) - done,
            "members": members,
        }

    def _queue_clear(self, context: CommandContext) -> Mapping[str, Any]:
        body = context.body
        every = body.get("allCameras", False)
        if (context.instance is None) == (not every):
            raise bad_args("give exactly one of instance or allCameras true")
        states = set(BACKLOG)
        if body.get("includeInFlight", False):
            states |= IN_FLIGHT
        reason = body.get("reason") or _OPERATOR_DRAIN
        cancelled = already = 0
        failed: list[dict[str, str]] = []
        for capture_id in self.service.active_ids(context.instance, states):
            try:
                done, _ = self.service.cancel(capture_id, reason)
            except CommandError as error:
                failed.append({"captureId": capture_id, "error": error.code})
                continue
            if done:
                cancelled += 1
            else:
                already += 1
        return {"cancelled": cancelled, "alreadyTerminal": already, "failed": failed}

    def _queue_status(self, context: CommandContext) -> Mapping[str, Any]:
        service = self.service
        limits = self.settings.limits
        names = [context.instance] if context.instance else list(service.cameras)
        cameras = [
            {
                "instance": name,
                "queued": service.queued(name),
                "capacity": limits.max_queued_captures_per_camera,
            }
            for name in names
        ]
        counts = service.catalog.counts(context.instance)
        return {
            "admission": service.admission(),
            "limits": {
                "maxConcurrentCaptures": limits.max_concurrent_captures,
                "maxInFlightBytes": limits.max_in_flight_bytes,
                "maxQueuedCapturesPerCamera": limits.max_queued_captures_per_camera,
                "maxPendingCaptures": limits.max_pending_captures,
            },
            "cameras": cameras,
            "dispatchQueued": sum(entry["queued"] for entry in cameras),
            "durable": {state.value: count for state, count in counts.items()},
            "durableBacklog": sum(counts[state] for state in BACKLOG),
            "durableInFlight": sum(counts[state] for state in IN_FLIGHT),
        }

    # -- cameras ----------------------------------------------------------------------------

    def _list(self, context: CommandContext) -> Mapping[str, Any]:
        full = bool(context.body.get("includeCapabilities", False))
        owner = _owner("list", full)
        cameras: list[Any] = []
        if "cursor" not in context.body:
            cameras = [camera.snapshot(full) for camera in self.service.cameras.values()]
        items, cursor, _ = self._page(context, owner, cameras, {})
        # No backend of this build discovers, so there is never an unconfigured camera to
        # report, even with discovery.reportUnconfigured and includeUnconfigured.
        return {"cameras": items, "unconfigured": [], "nextCursor": cursor}

    def _status(self, context: CommandContext) -> Mapping[str, Any]:
        def snapshot(camera: CameraState) -> dict[str, Any]:
            return {**camera.snapshot(True), "paused": camera.paused}

        if context.instance is not None:
            return snapshot(self.service.camera(context.instance))
        return {"cameras": [snapshot(camera) for camera in self.service.cameras.values()]}

    def _reconnect(self, context: CommandContext) -> Mapping[str, Any]:
        camera = self._enabled_camera(context.instance)
        self.service.reconnect(camera.spec.instance)
        return {"operationId": new_id("op"), "instance": camera.spec.instance, "state": "ACCEPTED"}

    def _pause(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        changed = self.service.set_paused(context.instance, True)
        return {"id": context.instance, "paused": True, "changed": changed}

    def _resume(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        changed = self.service.set_paused(context.instance, False)
        return {"id": context.instance, "paused": False, "changed": changed}
