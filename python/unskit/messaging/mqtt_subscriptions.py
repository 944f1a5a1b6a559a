"""The MQTT transport's subscription layer: the filters a link keeps (sent in one SUBSCRIBE,
restored after every reconnect), the broker's SUBACKs that readiness waits for, and the retry
of refused filters (subscription_ledger.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from unskit.messaging.mqtt_connection import _Connection
from unskit.messaging.subscription_ledger import SubscriptionLedger
from unskit.messaging.transport import QoS

# The logger keeps the name it had before this module was split out of mqtt.py.
_log = logging.getLogger("unskit.messaging.mqtt")


class _Subscriptions(_Connection, SubscriptionLedger):
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

    @property
    def refused_subscriptions(self) -> dict[str, str]:
        """Each filter waiting for a retry, with why (for sb/status)."""
        with self._lock:
            return dict.fromkeys(self._retrying, "refused by the broker in a SUBACK")

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
            self._changed.notify_all()
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
