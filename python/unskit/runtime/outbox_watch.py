"""The northbound outbox's metrics and its ``northbound-outbox-overflow`` alarm.

Every `CHECK_INTERVAL_S` the watch samples the outbox (store-and-forward): gauges
``outboxEntries``, ``outboxBytes`` and ``outboxOldestAgeSeconds`` and counters
``outboxDropped``, ``outboxRefused``, ``outboxExpired`` and ``outboxDelivered`` of metric family
``messaging`` (dimension ``link=northbound``). The alarm (warning, component scope) is raised at
the first check that finds an entry dropped, refused or expired since the previous one, and
cleared at the first check that finds none and the outbox at most `CLEAR_FILL` full.
"""

from __future__ import annotations

import logging

from unskit.errors import UnskitError
from unskit.messaging.client import MessagingClient, OutboxStatus
from unskit.runtime.events import Events, Severity
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.periodic import PeriodicWatch

__all__ = ["CHECK_INTERVAL_S", "CLEAR_FILL", "OUTBOX_OVERFLOW", "OutboxWatch"]

_log = logging.getLogger(__name__)

OUTBOX_OVERFLOW = "northbound-outbox-overflow"
CHECK_INTERVAL_S = 1.0
#: Below this share of maxBytes the outbox is back under its bound: a dropOldest outbox
#: that is still full would drop again at the next publish.
CLEAR_FILL = 0.9
_DIMENSIONS = {"link": "northbound"}


class OutboxWatch(PeriodicWatch):
    """Samples the outbox into metrics and raises or clears the overflow alarm."""

    thread_name = "unskit-outbox-watch"

    def __init__(
        self,
        messaging: MessagingClient,
        events: Events,
        metrics: MetricsRegistry,
        *,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        super().__init__(interval_s)
        self._messaging = messaging
        self._events = events
        self._metrics = metrics
        self._last = self._status()

    def _status(self) -> OutboxStatus:
        status = self._messaging.outbox_status()
        if status is None:
            raise UnskitError("the northbound link has no outbox (storeAndForward)")
        return status

    def check(self) -> None:
        """One sample: metrics, then the alarm."""
        status = self._status()
        last, self._last = self._last, status
        metrics = self._metrics
        metrics.gauge("messaging", "outboxEntries", _DIMENSIONS).set(status.entries)
        metrics.gauge("messaging", "outboxBytes", _DIMENSIONS, unit="Bytes").set(status.bytes)
        metrics.gauge("messaging", "outboxOldestAgeSeconds", _DIMENSIONS, unit="Seconds").set(
            round(status.oldest_age_s, 3)
        )
        for name, now, before in (
            ("outboxDropped", status.dropped, last.dropped),
            ("outboxRefused", status.refused, last.refused),
            ("outboxExpired", status.expired, last.expired),
            ("outboxDelivered", status.delivered, last.delivered),
        ):
            metrics.counter("messaging", name, _DIMENSIONS).inc(max(0, now - before))
        lost = status.lost - last.lost
        context = {
            "entries": status.entries,
            "bytes": status.bytes,
            "maxBytes": status.max_bytes,
            "oldestAgeSeconds": round(status.oldest_age_s, 3),
            "dropped": status.dropped - last.dropped,
            "refused": status.refused - last.refused,
            "expired": status.expired - last.expired,
        }
        raised = self._events.is_raised(OUTBOX_OVERFLOW)
        try:
            if lost > 0 and not raised:
                _log.warning(
                    "northbound outbox overflow (%s): raising %s", context, OUTBOX_OVERFLOW
                )
                self._events.raise_alarm(OUTBOX_OVERFLOW, context, severity=Severity.WARNING)
            elif raised and lost == 0 and status.bytes <= status.max_bytes * CLEAR_FILL:
                _log.info("northbound outbox back under its bound: clearing %s", OUTBOX_OVERFLOW)
                self._events.clear_alarm(OUTBOX_OVERFLOW, context)
        except UnskitError as error:
            _log.warning("outbox watch: %s not published: %s", OUTBOX_OVERFLOW, error)
        self.checks += 1
