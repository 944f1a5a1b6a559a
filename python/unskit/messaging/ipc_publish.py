"""The IPC transport's publish layer: the envelope's bytes go out as a BinaryMessage of
PublishToTopic; QoS 1 publishes made while the link is down are held (at most
MAX_QUEUED_MESSAGES, as over MQTT) and sent after the reconnect, QoS 0 ones are dropped and
counted; QoS 2 and topics the nucleus would refuse are refused before anything is sent."""

from __future__ import annotations

import contextlib
import functools
import logging
from concurrent.futures import Future
from typing import Any

from unskit.edge import edge_error
from unskit.edge.pubsub import is_connection_lost, publish_binary
from unskit.errors import PublishError, UnsupportedQosError
from unskit.messaging.ipc_connection import _IpcState
from unskit.messaging.mqtt_publish import MAX_QUEUED_MESSAGES
from unskit.messaging.transport import QoS

_log = logging.getLogger("unskit.messaging.ipc")

#: Characters the nucleus refuses in a publish topic (InvalidArguments): wildcards.
_WILDCARDS = ("+", "#", "*")
#: Publishes the nucleus refused are logged first and then every this many.
_REFUSED_LOG_EVERY = 1_000


class _IpcPublishing(_IpcState):
    """The publish layer of `IpcTransport`: publishes, held ones and their counters."""

    @property
    def dropped_while_disconnected(self) -> int:
        """QoS 0 publishes dropped because the link was down (QoS 0 is at most once)."""
        return self._dropped_qos0

    def publish(self, topic: str, payload: bytes, qos: QoS) -> None:
        """Sends now, or (QoS 1) holds for the next connection; QoS 0 is dropped when down."""
        if qos == QoS.EXACTLY_ONCE:
            raise UnsupportedQosError(
                f"messaging {self._name}: QoS 2 publish to {topic!r} refused: the edge "
                "runtime's IPC bus carries QoS 0 and 1 only"
            )
        _check_topic(self._name, topic)
        self._require_started()
        with self._lock:
            if not self._connected:
                self._hold_locked(topic, payload, qos, self._clock())
                return
            client, generation = self._client, self._generation
            message_id = self._track_locked(qos, self._clock())
        self._send(client, generation, message_id, topic, payload, qos)

    def publish_backlog(self) -> int:
        """QoS 1 publishes the nucleus has not answered yet, held ones included."""
        with self._lock:
            return len(self._held) + len(self._in_flight)

    def publish_oldest_age(self) -> float:
        """Seconds the oldest QoS 1 publish not yet answered has waited (0 when none)."""
        with self._lock:
            made = [self._held[0][0]] if self._held else []
            made += list(self._in_flight.values())[:1]
        return max(0.0, self._clock() - min(made)) if made else 0.0

    def publish_failures(self) -> int:
        """Publishes lost so far: QoS 0 ones dropped while down, and refused ones."""
        return self._dropped_qos0 + self._refused

    # -- held, sent, answered ---------------------------------------------------------

    def _hold_locked(self, topic: str, payload: bytes, qos: QoS, made: float) -> None:
        if qos == QoS.AT_MOST_ONCE:
            self._dropped_qos0 += 1
            _log.debug("messaging %s: link down, QoS 0 publish to %r dropped", self._name, topic)
            return
        if len(self._held) >= MAX_QUEUED_MESSAGES:
            self._refused += 1
            raise PublishError(
                f"messaging {self._name}: {MAX_QUEUED_MESSAGES} publishes already wait for the "
                f"edge runtime; {topic!r} was not queued"
            )
        self._held.append((made, topic, payload))

    def _track_locked(self, qos: QoS, made: float) -> int | None:
        if qos == QoS.AT_MOST_ONCE:
            return None
        self._next_id += 1
        self._in_flight[self._next_id] = made
        return self._next_id

    def _flush_held(self, client: Any, generation: int) -> int:
        """Sends what was held (the link thread, after the subscriptions were restored) and
        marks the link up once nothing waits; returns how many were sent."""
        sent = 0
        while True:
            with self._lock:
                if generation != self._generation:
                    return sent
                if not self._held:
                    self._connected = True
                    return sent
                batch = [(self._track_locked(QoS.AT_LEAST_ONCE, m), t, p) for m, t, p in self._held]
                self._held.clear()
            # Never under the lock: a future already settled runs its callback right here.
            for message_id, topic, payload in batch:
                self._send(client, generation, message_id, topic, payload, QoS.AT_LEAST_ONCE)
            sent += len(batch)

    def _send(
        self,
        client: Any,
        generation: int,
        message_id: int | None,
        topic: str,
        payload: bytes,
        qos: QoS,
    ) -> None:
        try:
            future = publish_binary(client, topic, payload)
        except Exception as exc:  # the SDK raises when the connection just went
            self._publish_failed(generation, message_id, topic, payload, qos, exc)
            return
        future.add_done_callback(
            functools.partial(self._publish_answered, generation, message_id, topic, payload, qos)
        )

    def _publish_answered(
        self,
        generation: int,
        message_id: int | None,
        topic: str,
        payload: bytes,
        qos: QoS,
        future: Future[Any],
    ) -> None:
        # The SDK's event-loop thread: bookkeeping only.
        exc = future.exception()
        if exc is None:
            with self._lock:
                if message_id is not None:
                    self._in_flight.pop(message_id, None)
                self._changed.notify_all()
            return
        self._publish_failed(generation, message_id, topic, payload, qos, exc)

    def _publish_failed(
        self,
        generation: int,
        message_id: int | None,
        topic: str,
        payload: bytes,
        qos: QoS,
        exc: BaseException,
    ) -> None:
        with self._lock:
            made = self._in_flight.pop(message_id, None) if message_id is not None else None
            lost = is_connection_lost(exc) or generation != self._generation
            if lost and not self._closed:
                # Held again for the next connection, as if made while down (beyond the
                # bound it is counted as refused).
                with contextlib.suppress(PublishError):
                    self._hold_locked(topic, payload, qos, self._clock() if made is None else made)
                self._changed.notify_all()
                return
            self._refused += 1
            refused = self._refused
            self._changed.notify_all()
        if refused == 1 or refused % _REFUSED_LOG_EVERY == 0:
            _log.error(
                "messaging %s: %s (%d publishes refused so far)",
                self._name,
                edge_error(exc, "PublishToTopic", topic),
                refused,
            )


def _check_topic(name: str, topic: str) -> None:
    """The nucleus refuses a wildcard in a publish topic (InvalidArguments) only after the
    round trip, where the caller no longer hears of it: refused here, naming the topic."""
    if not topic:
        raise PublishError(f"messaging {name}: a publish topic must not be empty")
    wildcards = [c for c in _WILDCARDS if c in topic]
    if wildcards:
        raise PublishError(
            f"messaging {name}: publish topic {topic!r} contains {' and '.join(wildcards)}: "
            "the edge runtime's IPC bus refuses wildcards in a publish topic"
        )
