"""The camera adapter's cmd/sb verbs, exactly as the specification's tables declare them:
the capture verbs (capture_verbs.py), then the camera and queue verbs here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from unskit.camera.capture_verbs import CaptureVerbs
from unskit.camera.config import CameraSettings
from unskit.camera.discover_verb import discover_verb
from unskit.camera.jobs import new_id
from unskit.camera.pages import Pages, snapshot_owner
from unskit.camera.ptz import PtzVerbs
from unskit.camera.service import CameraService
from unskit.commands import (
    CURSOR,
    LIMIT,
    REASON,
    BodySpec,
    Boolean,
    CommandContext,
    Param,
    RequestIdRule,
    Scope,
    Verb,
    bad_args,
)

__all__ = ["CameraVerbs"]

_OPERATOR_DRAIN = "queue cleared by an operator"


class CameraVerbs:
    """Builds the verb table over a CameraService."""

    def __init__(
        self,
        service: CameraService,
        messaging_status: Callable[[], Mapping[str, Any]] = dict,
    ) -> None:
        self.service = service
        self._pages = Pages()
        # The broker links' part of sb/status (the runtime's messaging_status).
        self._messaging_status = messaging_status

    @property
    def settings(self) -> CameraSettings:
        """The running settings (a reload replaces them)."""
        return self.service.settings

    def verbs(self) -> list[Verb]:
        """Every verb of the camera adapter, the not-yet-built ones disabled with a reason."""
        paging = {"limit": Param(LIMIT), "cursor": Param(CURSOR)}
        required = RequestIdRule.REQUIRED
        return [
            *CaptureVerbs(self.service, self._pages).verbs(),
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
            discover_verb(
                self.service.discovery,
                self._pages,
                self.settings.discovery_enabled,
                "discovery is off (discovery.enabled is false)",
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
            *PtzVerbs(self.service.sessions, self.service.ptz_stops, self._pages).verbs(),
        ]

    # -- queue administration ----------------------------------------------------------------

    def _queue_clear(self, context: CommandContext) -> Mapping[str, Any]:
        body = context.body
        every = body.get("allCameras", False)
        if (context.instance is None) == (not every):
            raise bad_args("give exactly one of instance or allCameras true")
        reason = body.get("reason") or _OPERATOR_DRAIN
        return self.service.queues.clear(
            context.instance, bool(body.get("includeInFlight", False)), reason
        )

    def _queue_status(self, context: CommandContext) -> Mapping[str, Any]:
        return self.service.queues.status(context.instance)

    # -- cameras ----------------------------------------------------------------------------

    def _list(self, context: CommandContext) -> Mapping[str, Any]:
        full = bool(context.body.get("includeCapabilities", False))
        owner = snapshot_owner("list", full)
        cameras: list[Any] = []
        if "cursor" not in context.body:
            cameras = [session.snapshot(full) for session in self.service.sessions]
        items, cursor, _ = self._pages.page(context, owner, cameras, {})
        return {"cameras": items, "unconfigured": self._unconfigured(context), "nextCursor": cursor}

    def _unconfigured(self, context: CommandContext) -> list[Any]:
        # From the last sb/discover pass (sb/list never probes), on every page.
        if not (self.settings.report_unconfigured and context.body.get("includeUnconfigured")):
            return []
        configured = [
            str(session.spec.connection.get("uri", "")) for session in self.service.sessions
        ]
        return self.service.discovery.unconfigured(configured)

    def _status(self, context: CommandContext) -> Mapping[str, Any]:
        sessions = self.service.sessions
        if context.instance is not None:
            return sessions.get(context.instance).status()
        return {
            "cameras": [session.status() for session in sessions],
            "messaging": self._messaging_status(),
        }

    def _reconnect(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        sessions = self.service.sessions
        instance = sessions.enabled(context.instance).instance
        sessions.reconnect(instance)
        return {"operationId": new_id("op"), "instance": instance, "state": "ACCEPTED"}

    def _pause(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        changed = self.service.sessions.set_paused(context.instance, True)
        return {"id": context.instance, "paused": True, "changed": changed}

    def _resume(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        changed = self.service.sessions.set_paused(context.instance, False)
        return {"id": context.instance, "paused": False, "changed": changed}
