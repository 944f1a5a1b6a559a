"""The views of `InstanceRunner`: its part of sb/status (state, counters, stale signals,
the driver's description and security) and every signal with its settings and last value
(sb/signals)."""

from __future__ import annotations

import time
from typing import Any

from unskit.southbound.driver import SignalSpec
from unskit.southbound.instance_connection import _Connection
from unskit.southbound.signals import not_encodable

#: Counters with a pollGroup dimension, and those of the instance as a whole.
_GROUP_COUNTERS = ("reads", "readErrors")
_INSTANCE_COUNTERS = (
    "samplesPublished",
    "publishErrors",
    "reconnects",
    "samplesDropped",
    "encodeErrors",
    "threadFailures",
)


class _Views(_Connection):
    """The views of `InstanceRunner`: sb/status and sb/signals."""

    # -- views ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The instance's part of sb/status."""
        now = time.monotonic()
        described = dict(self.driver.describe())
        security = described.pop("security", None)
        return {
            "instance": self.spec.id,
            "adapter": self.spec.adapter,
            "endpoint": self.spec.endpoint,
            "state": self._state.value,
            "connected": self.connected,
            "paused": self._paused,
            "connectedForSecs": None
            if self._connected_since is None
            else round(now - self._connected_since, 3),
            "lastError": self._last_error or None,
            "signals": len(self._table.by_id),
            "staleSignals": 0
            if self._paused
            else len(self._table.stale(now, self.spec.timing.stale_signal_secs)),
            "writable": sorted(self.spec.writes_allow),
            "counters": self._counters(),
            "device": described,
            "security": security
            or {"mode": "plaintext", "est": {"enabled": False}, "target": None},
        }

    def _counters(self) -> dict[str, float]:
        counter, groups = self._context.counter, [group.id for group in self.spec.poll_groups]
        totals = {
            name: sum(counter(self.spec.id, name, group).total for group in groups)
            for name in _GROUP_COUNTERS
        }
        for name in _INSTANCE_COUNTERS:
            totals[name] = counter(self.spec.id, name, None).total
        return totals

    def signal_views(self) -> list[dict[str, Any]]:
        """Every signal with its settings and last value (sb/signals)."""
        now = time.monotonic()
        stale = {id(s) for s in self._table.stale(now, self.spec.timing.stale_signal_secs)}
        views = []
        for state in self._table.by_id.values():
            spec = state.spec
            value, quality, status = state.last_value, state.last_quality, state.last_detail
            unfit = not_encodable(value)
            views.append(
                {
                    "id": spec.id,
                    "name": spec.name,
                    "channel": state.channel,
                    "group": state.group,
                    "type": spec.type,
                    "arrayCount": spec.array_count,
                    "publishMode": spec.publish_mode.value,
                    "deadband": {"type": spec.deadband.type, "value": spec.deadband.value},
                    "batchMs": spec.batch_ms,
                    # One value the envelope cannot carry must not fail the whole reply.
                    "value": None if unfit else value,
                    "quality": "BAD" if unfit else (None if quality is None else quality.value),
                    "serverTimestampMs": state.last_server_ms or None,
                    "status": unfit or status or None,
                    "stale": (not self._paused) and id(state) in stale,
                    "writable": spec.id in self.spec.writes_allow,
                }
            )
        return views

    def signals(self) -> list[SignalSpec]:
        """The instance's signals now (a push source's change as it browses)."""
        return [state.spec for state in self._table.by_id.values()]
