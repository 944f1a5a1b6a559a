"""What the MQTT and IPC subscription layers share: the filters the server accepted on the
current connection (what readiness waits for), the counters of subscribes and refusals, and
the one timer-armed retry of refused filters on a jittered backoff."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from unskit.config.messaging import ReconnectConfig
from unskit.messaging.requests import DeadlineTimer
from unskit.messaging.transport import QoS

# The retry of refused subscriptions: full jitter over an exponentially growing window.
# (Reconnects follow the link's `reconnect` configuration, ReconnectConfig.)
BACKOFF_BASE_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
_RESUBSCRIBE_BACKOFF = ReconnectConfig(BACKOFF_BASE_SECS, BACKOFF_MAX_SECS)


class SubscriptionLedger:
    """A transport's accepted filters and refused-filter retry; the transport's state layer
    sets these attributes in its __init__ and writes `_resubscribe_refused`."""

    _name: str
    _clock: Callable[[], float]
    _lock: threading.Lock
    # Notified (under the lock) whenever the server answers a subscription.
    _changed: threading.Condition
    _connected: bool
    _closed: bool
    _filters: dict[str, QoS]
    _acknowledged: set[str]
    # Refused filters, each with the refusals of its current streak, and the one armed retry
    # of them all. The timer is the messaging client's, else one of our own made when first
    # needed.
    _retrying: dict[str, int]
    _retry: int | None
    _timer: DeadlineTimer | None
    _own_timer: DeadlineTimer | None
    _subscribes_sent: int
    _subscribe_refusals: int

    def acknowledged(self, topic_filters: Sequence[str]) -> bool:
        """Whether the server (the broker's SUBACK, the nucleus's answer) accepted every one
        of the filters on the current connection."""
        with self._lock:
            return self._connected and self._acknowledged.issuperset(topic_filters)

    def wait_acknowledged(self, topic_filters: Sequence[str], timeout: float) -> bool:
        """Blocks until `acknowledged(topic_filters)` or `timeout` seconds pass."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._connected and self._acknowledged.issuperset(topic_filters),
                timeout,
            )

    @property
    def subscribes_sent(self) -> int:
        """Subscribe requests sent since start (restores after reconnects and retries
        included): SUBSCRIBE packets, or SubscribeToTopic calls."""
        return self._subscribes_sent

    @property
    def subscribe_refusals(self) -> int:
        """Filters the server refused since start, every retry counted (the metric
        messaging/refusedSubscriptions)."""
        return self._subscribe_refusals

    @property
    def refused_filters(self) -> list[str]:
        """Filters the server refused that wait for a retry (readiness waits with them)."""
        with self._lock:
            return list(self._retrying)

    @property
    def filters(self) -> dict[str, QoS]:
        """The filters this link keeps subscribed (a copy)."""
        with self._lock:
            return dict(self._filters)

    def _resubscribe_refused(self) -> None:
        """The retry (timer thread): subscribes again to the refused filters not in flight."""
        raise NotImplementedError

    def _schedule_retry(self) -> float | None:
        """Arms the one retry of the refused filters, unless armed; returns its delay.
        Called with the lock held."""
        if self._retry is not None or self._closed or not self._connected:
            return None
        # The freshest refusal sets the pace, so a newly refused filter is retried soon.
        streak = max(1, min(self._retrying.values(), default=1))
        delay = _RESUBSCRIBE_BACKOFF.delay(streak)
        timer = self._timer
        if timer is None:
            if self._own_timer is None:
                self._own_timer = DeadlineTimer(f"unskit-{self._name}-resubscribe", self._clock)
            timer = self._own_timer
        self._retry = timer.call_later(delay, self._resubscribe_refused)
        return delay

    def _cancel_retry(self) -> None:
        # Called with the lock held.
        handle, self._retry = self._retry, None
        if handle is not None:
            timer = self._timer or self._own_timer
            if timer is not None:
                timer.cancel(handle)
