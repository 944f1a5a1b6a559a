"""The ``message-publish-degraded`` alarm: raised while a broker link loses publishes or
holds more unacknowledged ones than a healthy link does, cleared once publishing recovered.

Every `CHECK_INTERVAL_S` the watch reads each link's `PublishStatus`. A link is degraded
when more than `BACKLOG_DEGRADED` QoS 1/2 publishes wait for the broker's acknowledgement
(queued while the link is down, or stuck behind a stalled broker), when the oldest of them
(or, with store-and-forward, the oldest stored entry) has waited longer than the link's
``publishDegradedAfterSeconds`` (default 30 s: a few publishes held back for long), or when
it lost a publish since the previous check (QoS 0 while down, or refused by a full queue).
The alarm clears at the first check that finds every link drained: up, at most
`BACKLOG_RECOVERED` unacknowledged, none of them older than half that age, and nothing
lost. An outage keeps it raised, however quiet.

A component may also report its own messages (`report`): the camera adapter reports a
terminal capture message that could not be published, and its next one that was. A reported
failure raises the alarm at once; it clears once every reporter succeeded again and the
links are healthy.

The alarm is a component-scope warning on ``.../evt/warning/message-publish-degraded``,
published through `Events` (a raise made while the local link is down waits in the
client's queue with the rest) and logged at once, since a subscriber sees it only later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from unskit.errors import UnskitError
from unskit.messaging.client import MessagingClient, PublishStatus
from unskit.runtime.events import Events, Severity
from unskit.runtime.periodic import PeriodicWatch

__all__ = [
    "BACKLOG_DEGRADED",
    "BACKLOG_RECOVERED",
    "CHECK_INTERVAL_S",
    "PUBLISH_DEGRADED",
    "RECOVERED_AGE_FRACTION",
    "PublishWatch",
]

_log = logging.getLogger(__name__)

PUBLISH_DEGRADED = "message-publish-degraded"
#: Half the client's queue bound (10,000, beyond which publishes are refused), and well
#: above the 1,000 a fast healthy link keeps in flight.
BACKLOG_DEGRADED = 5_000
#: The in-flight window: at or below it nothing waits behind the broker.
BACKLOG_RECOVERED = 1_000
CHECK_INTERVAL_S = 1.0
#: The clear waits until the oldest unacknowledged publish is younger than this share of
#: the link's publishDegradedAfterSeconds.
RECOVERED_AGE_FRACTION = 0.5


class PublishWatch(PeriodicWatch):
    """Checks the links' publishing every interval and raises or clears the alarm."""

    thread_name = "unskit-publish-watch"

    def __init__(
        self,
        messaging: MessagingClient,
        events: Events,
        links: Sequence[str] = ("local",),
        *,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        super().__init__(interval_s)
        self._messaging = messaging
        self._events = events
        self._links = tuple(links)
        # Losses counted before the watch started are not its to report.
        self._failures = {name: self._status(name).failures for name in self._links}
        # Reporters whose own messages failed: source -> what they said.
        self._sources: dict[str, dict[str, Any]] = {}
        # The periodic check and a reporter's check never interleave.
        self._lock = threading.Lock()

    def report(self, source: str, problem: Mapping[str, Any] | None) -> None:
        """A component's own publishing: `problem` when a message of `source` failed (raises
        the alarm now), None when one succeeded (clears it if nothing else is degraded)."""
        with self._lock:
            if problem is None:
                if self._sources.pop(source, None) is None:
                    return
            else:
                self._sources[source] = dict(problem)
            self._check_locked()

    def _status(self, name: str) -> PublishStatus:
        return self._messaging.publish_status(northbound=name == "northbound")

    def check(self) -> None:
        """One check of every link: raise, clear or leave the alarm."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        report: dict[str, dict[str, Any]] = {}
        degraded = False
        recovered = True
        for name in self._links:
            status = self._status(name)
            lost = status.failures - self._failures[name]
            self._failures[name] = status.failures
            age = status.oldest_age_s
            report[name] = {
                "connected": status.connected,
                "backlog": status.backlog,
                "oldestAgeSeconds": round(age, 1),
                "lost": lost,
            }
            degraded = (
                degraded
                or status.backlog > BACKLOG_DEGRADED
                or age > status.degraded_after_s
                or lost > 0
            )
            # Half the age: a link whose oldest publish hovers near it must not flap.
            recovered = recovered and (
                status.connected
                and status.backlog <= BACKLOG_RECOVERED
                and age <= status.degraded_after_s * RECOVERED_AGE_FRACTION
                and lost == 0
            )
        degraded = degraded or bool(self._sources)
        recovered = recovered and not self._sources
        raised = self._events.is_raised(PUBLISH_DEGRADED)
        context: dict[str, Any] = {"links": report}
        if self._sources:
            context["sources"] = {name: dict(value) for name, value in self._sources.items()}
        try:
            if degraded and not raised:
                _log.warning("publishing degraded (%s): raising %s", report, PUBLISH_DEGRADED)
                self._events.raise_alarm(PUBLISH_DEGRADED, context, severity=Severity.WARNING)
            elif raised and recovered:
                _log.info("publishing recovered (%s): clearing %s", report, PUBLISH_DEGRADED)
                self._events.clear_alarm(PUBLISH_DEGRADED, context)
        except UnskitError as error:
            # A refused raise is rolled back and a refused clear keeps the alarm raised:
            # the next check tries again.
            _log.warning("publish watch: %s not published: %s", PUBLISH_DEGRADED, error)
        self.checks += 1
