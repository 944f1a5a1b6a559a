"""The MQTT transport's subscription layer: the filters a link keeps (sent in one SUBSCRIBE,
restored after every reconnect), the broker's SUBACKs that readiness waits for, and the retry
of refused filters on a jittered backoff of its own."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from unskit.config.messaging import ReconnectConfig
from unskit.messaging.mqtt_connection import _Connection
from unskit.messaging.requests import DeadlineTimer
from unskit.messaging.transport import QoS

# The logger keeps the name it had before this module was split out of mqtt.py.
_log = logging.getLogger("unskit.messaging.mqtt")

# The retry of refused subscriptions: full jitter over an exponentially growing window.
# (Reconnects follow the link's `reconnect` configuration, ReconnectConfig.)
BACKOFF_BASE_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
_RESUBSCRIBE_BACKOFF = ReconnectConfig(BACKOFF_BASE_SECS, BACKOFF_MAX_SECS)


class _Subscriptions(_Connection):
    """The subscription layer of `MqttTransport`: filters, SUBACKs, refused filters retried."""

    def subscribe(self, topic_filters: Sequence[str], qos: QoS) -> None:
        """Subscribes now, in one SUBSCRIBE, if connected; the filters are restored after every
        reconnect."""
        client = self._require_client()
        with self._lock:
            for topic_filter in topic_filters:
                self._filters[topic_filter] = qos
            # Sent under the lock: the SUBACK handler waits for the packet id to be recorded.
            if self._connected and topic_filters:
                self._send_subscribe(client, [(f, qos) for f in topic_filters])

    def unsubscribe(self, topic_filters: Sequence[str]) -> None:
        """Forgets the filters and unsubscribes the known ones, in one UNSUBSCRIBE, if
        connected."""
        client = self._require_client()
        with self._lock:
            known = [f for f in topic_filters if self._filters.pop(f, None) is not None]
            self._acknowledged.difference_update(known)
            for topic_filter in known:
                self._retrying.pop(topic_filter, None)
            if not self._retrying:
                self._cancel_retry()
            connected = self._connected
        if known and connected:
            client.unsubscribe(known)

    def acknowledged(self, topic_filters: Sequence[str]) -> bool:
        """Whether the broker acknowledged (SUBACK) every one of the filters since the link
        last connected."""
        with self._lock:
            return self._connected and self._acknowledged.issuperset(topic_filters)

    def wait_acknowledged(self, topic_filters: Sequence[str], timeout: float) -> bool:
        """Blocks until `acknowledged(topic_filters)` or `timeout` seconds pass."""
        with self._subacks:
            return self._subacks.wait_for(
                lambda: self._connected and self._acknowledged.issuperset(topic_filters),
                timeout,
            )

    @property
    def subscribes_sent(self) -> int:
        """SUBSCRIBE packets sent since start (restores after reconnects included)."""
        return self._subscribes_sent

    @property
    def subscribe_refusals(self) -> int:
        """Filters the broker refused in a SUBACK since start, every retry counted."""
        return self._subscribe_refusals

    @property
    def refused_filters(self) -> list[str]:
        """Filters the broker refused that wait for a retry (readiness waits with them)."""
        with self._lock:
            return list(self._retrying)

    @property
    def refused_subscriptions(self) -> dict[str, str]:
        """Each filter waiting for a retry, with why (for sb/status)."""
        with self._lock:
            return dict.fromkeys(self._retrying, "refused by the broker in a SUBACK")

    @property
    def filters(self) -> dict[str, QoS]:
        """The filters this link keeps subscribed (a copy)."""
        with self._lock:
            return dict(self._filters)

    def _send_subscribe(self, client: paho.Client, filters: Sequence[tuple[str, QoS]]) -> None:
        # Called with the lock held.
        rc, mid = client.subscribe([(f, int(q)) for f, q in filters])
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
            self._subscribes_sent += 1
            self._awaiting_suback[mid] = [f for f, _ in filters]
        # Otherwise the link is going down; the next connect subscribes them again.

    def _handle_suback(
        self, _c: paho.Client, _u: Any, mid: int, reason_codes: Sequence[Any], _p: Any
    ) -> None:
        with self._lock:
            filters = self._awaiting_suback.pop(mid, None)
            if filters is None:
                return
            refused: list[tuple[str, int]] = []
            granted: list[tuple[str, int]] = []
            # A short SUBACK leaves the filters it does not mention unacknowledged.
            for topic_filter, reason in zip(filters, reason_codes, strict=False):
                if topic_filter not in self._filters:
                    continue  # unsubscribed meanwhile
                if reason.is_failure:
                    self._subscribe_refusals += 1
                    self._acknowledged.discard(topic_filter)
                    streak = self._retrying.get(topic_filter, 0) + 1
                    self._retrying[topic_filter] = streak
                    refused.append((topic_filter, streak))
                else:
                    self._acknowledged.add(topic_filter)
                    streak = self._retrying.pop(topic_filter, 0)
                    if streak:
                        granted.append((topic_filter, streak))
            delay = self._schedule_retry() if refused else None
            self._subacks.notify_all()
        retry = "" if delay is None else f" in {delay:.1f} s"
        for topic_filter, streak in refused:
            # Once per streak as an error; the retries that follow only at debug level.
            if streak == 1:
                _log.error(
                    "messaging %s: the broker refused the subscription to %r; retrying%s until "
                    "it is granted (further refusals are logged at debug level)",
                    self._name,
                    topic_filter,
                    retry,
                )
            else:
                _log.debug(
                    "messaging %s: the broker refused the subscription to %r again (%d in a "
                    "row), retrying%s",
                    self._name,
                    topic_filter,
                    streak,
                    retry,
                )
        for topic_filter, streak in granted:
            _log.info(
                "messaging %s: the broker granted the subscription to %r after %d refusals",
                self._name,
                topic_filter,
                streak,
            )

    def _schedule_retry(self) -> float | None:
        """Arms the one re-SUBSCRIBE of the refused filters, unless armed; returns its delay.
        Called with the lock held."""
        if self._retry is not None or self._closed or not self._connected:
            return None
        # The freshest refusal sets the pace, so a newly refused filter is retried soon.
        streak = min(self._retrying.values(), default=1)
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

    def _resubscribe_refused(self) -> None:
        """The retry (timer thread): one SUBSCRIBE of the refused filters not in flight."""
        client = self._client
        with self._lock:
            self._retry = None
            if client is None or self._closed or not self._connected:
                return
            in_flight = {f for filters in self._awaiting_suback.values() for f in filters}
            due = [
                (f, self._filters[f])
                for f in self._retrying
                if f in self._filters and f not in in_flight
            ]
            if due:
                self._send_subscribe(client, due)
