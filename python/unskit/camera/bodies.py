"""The terminal capture body (schemaVersion 1) and the image sidecar, built from a job, the
instants its pipeline marked and the frame it acquired."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from unskit.camera.backends import Acquired
from unskit.camera.codec import jpeg_dimensions
from unskit.camera.jobs import Job, JobState, now_ms, rfc3339

__all__ = ["sidecar", "terminal_body"]


def _timestamps(job: Job, marks: Mapping[str, int], acquired: Acquired | None) -> dict[str, Any]:
    stamps: dict[str, Any] = {"requestedAt": rfc3339(job.accepted_ms)}
    if "acquisitionStarted" in marks:
        stamps["acquisitionStartedAt"] = rfc3339(marks["acquisitionStarted"])
    quality = "unknown"
    if acquired is not None:
        if acquired.camera_frame_at_ms is not None:
            stamps["cameraFrameAt"] = rfc3339(acquired.camera_frame_at_ms)
            quality = "device"
        else:
            quality = "adapter-receive"
        stamps["frameReceivedAt"] = rfc3339(acquired.frame_received_at_ms)
    if "persisted" in marks:
        stamps["persistedAt"] = rfc3339(marks["persisted"])
    stamps["cameraFrameTimestampQuality"] = quality
    return stamps


def _frame(acquired: Acquired) -> dict[str, Any]:
    return {
        "width": acquired.frame.width,
        "height": acquired.frame.height,
        "pixelFormat": acquired.frame.pixel_format,
        "sourceEncoding": acquired.frame.source_encoding,
    }


def _durations(job: Job, marks: Mapping[str, int]) -> dict[str, int]:
    terminal_ms = job.terminal_ms or now_ms()
    durations: dict[str, int] = {}
    if "acquisitionStarted" in marks:
        durations["queue"] = marks["acquisitionStarted"] - job.accepted_ms
        if "acquired" in marks:
            durations["acquisition"] = marks["acquired"] - marks["acquisitionStarted"]
    if "encoded" in marks and "acquired" in marks:
        durations["encoding"] = marks["encoded"] - marks["acquired"]
    if "persisted" in marks and "encoded" in marks:
        durations["persistence"] = marks["persisted"] - marks["encoded"]
    durations["total"] = terminal_ms - job.accepted_ms
    return durations


def terminal_body(
    job: Job,
    acquired: Acquired | None,
    state: JobState,
    camera: Mapping[str, Any],
    *,
    image: Mapping[str, Any] | None = None,
    failure: Mapping[str, Any] | None = None,
    marks: Mapping[str, int] | None = None,
    freshness: Mapping[str, Any] | None = None,
    frame_age_ms: int | None = None,
) -> dict[str, Any]:
    """The terminal capture body: the settled reply, the status result and the announcement;
    `frameAgeMs` (how long before the request the frame arrived, 0 when after) beside
    `frame` whenever a frame was acquired."""
    marks = marks or {}
    body: dict[str, Any] = {
        "schemaVersion": 1,
        "eventId": job.event_id,
        "captureId": job.capture_id,
        "cameraId": job.camera,
        "correlationId": job.correlation_id,
        "trigger": dict(job.trigger),
        "captureProfile": job.profile,
        "captureMode": job.capture_mode,
        "timestamps": _timestamps(job, marks, acquired),
        "durationsMs": _durations(job, marks),
    }
    if state is JobState.SUCCEEDED and image is not None:
        body["image"] = dict(image)
    if acquired is not None:
        body["frame"] = _frame(acquired)
        if frame_age_ms is not None:
            body["frameAgeMs"] = frame_age_ms
    body["camera"] = dict(camera)
    body["metadata"] = dict(job.metadata)
    if failure is not None:
        body["failure"] = dict(failure)
    if job.group_id is not None:
        body["captureGroupId"] = job.group_id
        body["groupSize"] = job.group_size
    if acquired is not None and acquired.backend_metadata:
        body["backendMetadata"] = dict(acquired.backend_metadata)
    if freshness is not None:
        body["freshness"] = dict(freshness)
    return body


def sidecar(
    job: Job,
    marks: Mapping[str, int],
    acquired: Acquired,
    data: bytes,
    camera: Mapping[str, Any],
    freshness: Mapping[str, Any] | None = None,
    frame_age_ms: int | None = None,
) -> dict[str, Any]:
    """The metadata sidecar written beside the image (its digest is the image's business)."""
    width, height = jpeg_dimensions(data) or (acquired.frame.width, acquired.frame.height)
    return {
        "schemaVersion": 1,
        "captureId": job.capture_id,
        "cameraId": job.camera,
        "trigger": dict(job.trigger),
        "captureProfile": job.profile,
        "captureMode": job.capture_mode,
        "timestamps": _timestamps(job, marks, acquired),
        "image": {
            "contentType": "image/jpeg",
            "encoding": "jpeg",
            "bytes": len(data),
            "width": width,
            "height": height,
            "sha256": None,
        },
        "frame": _frame(acquired),
        **({"frameAgeMs": frame_age_ms} if frame_age_ms is not None else {}),
        "camera": dict(camera),
        "metadata": dict(job.metadata),
        **({"freshness": dict(freshness)} if freshness is not None else {}),
    }
