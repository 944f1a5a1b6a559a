"""The MQTT transport's publish layer: publishes sent now or, QoS 1 and 2, held while the
link is down (at most MAX_QUEUED_MESSAGES); tracked publishes and their acknowledgements,
for the outbox; and what the publish watch reads: the backlog, the age of the oldest
unacknowledged publish, the dropped and refused ones."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from unskit.errors import MessagingError, PublishError
from unskit.messaging.mqtt_connection import _Connection
from unskit.messaging.paho_adapter import awaits_acknowledgement, unacknowledged
from unskit.messaging.transport import QoS

# The logger keeps the name it had before this module was split out of mqtt.py.
_log = logging.getLogger("unskit.messaging.mqtt")

# Publishes (QoS 1 and 2) held while the link is down; beyond this a publish raises.
MAX_QUEUED_MESSAGES = 10_000
# QoS 1/2 messages on the wire awaiting acknowledgement: 0, no limit of its own (MQTT 3.1.1
# has no Receive Maximum; MAX_QUEUED_MESSAGES bounds sent and queued together). Any limit
# makes paho rescan its whole out-queue on every PUBACK once the limit is reached (its
# `_update_inflight`), which took half of the OPC UA adapter's CPU at 10,000 changes/s; its
# default of 20 throttles a fast link besides.
MAX_INFLIGHT_MESSAGES = 0
# QoS 1/2 publishes remembered for the age of the oldest unacknowledged one, beyond which
# the acknowledged ones are swept out (a link nobody asks the age of must not grow).
_SENT_SWEEP_AT = 2 * MAX_QUEUED_MESSAGES


class _Publishing(_Connection):
    """The publish layer of `MqttTransport`: publishes, held ones and their counters."""

    @property
    def dropped_while_disconnected(self) -> int:
        """QoS 0 publishes dropped because the link was down (QoS 0 is at most once)."""
        return self._dropped_qos0

    def publish(self, topic: str, payload: bytes, qos: QoS) -> None:
        """Sends now, or (QoS 1/2) queues for the next connection; QoS 0 is dropped when down."""
        client = self._require_client()
        info = client.publish(topic, payload, int(qos))
        rc = info.rc
        if rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            self._refused += 1
            raise PublishError(
                f"messaging {self._name}: {MAX_QUEUED_MESSAGES} publishes already wait for the "
                f"broker; {topic!r} was not queued"
            )
        if qos == QoS.AT_MOST_ONCE:
            if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
                self._dropped_qos0 += 1
                _log.debug(
                    "messaging %s: link down, QoS 0 publish to %r dropped", self._name, topic
                )
            return
        if rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            self._refused += 1
            raise PublishError(f"messaging {self._name}: publish to {topic!r} failed: {rc}")
        self._track(info)

    def publish_tracked(self, topic: str, payload: bytes, qos: QoS) -> int | None:
        """Sends (QoS 1/2: or queues) one publish and returns its packet id, which
        `on_acknowledged` reports; None when a QoS 0 publish was dropped, the link being down."""
        client = self._require_client()
        info = client.publish(topic, payload, int(qos))
        rc = info.rc
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS or (
            rc == MQTTErrorCode.MQTT_ERR_NO_CONN and qos != QoS.AT_MOST_ONCE
        ):
            if qos != QoS.AT_MOST_ONCE:
                self._track(info)
            return info.mid
        if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            return None
        raise PublishError(f"messaging {self._name}: publish to {topic!r} failed: {rc}")

    def on_acknowledged(self, callback: Callable[[int], None] | None) -> None:
        """Calls `callback(packet_id)` on the network thread when the broker acknowledged a
        QoS 1/2 publish, or a QoS 0 one was written; only the outbox sets it (paho's
        on_publish costs QoS 0 throughput)."""
        client = self._client
        if client is None:
            raise MessagingError(f"messaging {self._name}: not started")
        if callback is None:
            client.on_publish = None
            return

        def on_publish(_c: paho.Client, _u: Any, mid: int, _reason: Any, _p: Any) -> None:
            callback(mid)

        client.on_publish = on_publish

    def publish_backlog(self) -> int:
        """QoS 1/2 publishes the broker has not acknowledged yet, queued ones included."""
        client = self._client
        return 0 if client is None else unacknowledged(client)

    def publish_oldest_age(self) -> float:
        """Seconds the oldest QoS 1/2 publish not yet acknowledged has waited (0 when none)."""
        client = self._client
        if client is None:
            return 0.0
        with self._sent_lock:
            self._sweep_locked(client)
            sent = self._sent
            return max(0.0, self._clock() - sent[0][0]) if sent else 0.0

    def _track(self, info: paho.MQTTMessageInfo) -> None:
        """Remembers a QoS 1/2 publish paho queued, with when it was made."""
        client = self._client
        with self._sent_lock:
            self._sent.append((self._clock(), info))
            if len(self._sent) > _SENT_SWEEP_AT and client is not None:
                self._sweep_locked(client)

    def _sweep_locked(self, client: paho.Client) -> None:
        # Acknowledgements mostly come in order, so the acknowledged ones gather at the
        # head; past the bound, any acknowledged one goes (a head that waits stays).
        sent = self._sent
        while sent and not awaits_acknowledgement(client, sent[0][1]):
            sent.popleft()
        if len(sent) > _SENT_SWEEP_AT:
            kept = [entry for entry in sent if awaits_acknowledgement(client, entry[1])]
            sent.clear()
            sent.extend(kept)

    def publish_failures(self) -> int:
        """Publishes lost so far: QoS 0 ones dropped while down, and refused ones."""
        return self._dropped_qos0 + self._refused
