"""Queue administration: what sb/queue-status reports (admission, limits, dispatcher queues,
durable job counts) and the drain sb/queue-clear performs."""

from __future__ import annotations

from typing import Any

from unskit.camera.catalog import Catalog
from unskit.camera.config import Limits
from unskit.camera.jobs import BACKLOG, IN_FLIGHT
from unskit.camera.outcomes import Outcomes
from unskit.camera.pending import PendingCaptures
from unskit.camera.sessions import CameraSessions
from unskit.errors import CommandError

__all__ = ["QueueAdministration"]


class QueueAdministration:
    """The queue verbs' view of the pending captures and the catalog."""

    def __init__(
        self,
        limits: Limits,
        *,
        sessions: CameraSessions,
        pending: PendingCaptures,
        catalog: Catalog,
        outcomes: Outcomes,
    ) -> None:
        self.limits = limits
        self._sessions = sessions
        self._pending = pending
        self._catalog = catalog
        self._outcomes = outcomes

    def admission(self) -> dict[str, Any]:
        """What is free right now."""
        in_flight, reserved = self._pending.usage()
        available = max(self.limits.max_concurrent_captures - in_flight, 0)
        return {
            "availableAcquisitions": available,
            "availableResourceGroupAcquisitions": {},
            "availableMemoryBytes": max(self.limits.max_in_flight_bytes - reserved, 0),
            "outstandingDiskBytes": reserved,
            "availableEncoders": available,
            "availableWriters": available,
        }

    def status(self, instance: str | None) -> dict[str, Any]:
        """The sb/queue-status reply, of one camera or (None) the whole component."""
        limits = self.limits
        names = [instance] if instance else list(self._sessions.names())
        cameras = [
            {
                "instance": name,
                "queued": len(self._pending.queues[name]),
                "capacity": limits.max_queued_captures_per_camera,
            }
            for name in names
        ]
        counts = self._catalog.counts(instance)
        return {
            "admission": self.admission(),
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

    def clear(self, instance: str | None, include_in_flight: bool, reason: str) -> dict[str, Any]:
        """Cancels the backlog (and the running captures): the sb/queue-clear reply."""
        states = set(BACKLOG)
        if include_in_flight:
            states |= IN_FLIGHT
        cancelled = already = 0
        failed: list[dict[str, str]] = []
        for capture_id in self._pending.ids(instance, states):
            try:
                done, _ = self._outcomes.cancel(capture_id, reason)
            except CommandError as error:
                failed.append({"captureId": capture_id, "error": error.code})
                continue
            if done:
                cancelled += 1
            else:
                already += 1
        return {"cancelled": cancelled, "alreadyTerminal": already, "failed": failed}
