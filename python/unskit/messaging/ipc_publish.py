"""The IPC transport's publish layer: the envelope's bytes go out as a BinaryMessage of
PublishToTopic (on the cloud proxy: as the payload of PublishToIoTCore); QoS 1 publishes made
while the link is down are held (at most MAX_QUEUED_MESSAGES, as over MQTT) and sent after
the reconnect, QoS 0 ones are dropped and counted; QoS 2 and topics the nucleus would refuse
are refused before anything is sent. `publish_tracked`/`on_acknowledged` serve the northbound
outbox: a held publish keeps its id across reconnects, so the outbox hears of each id once."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from unskit.edge import edge_error
from unskit.edge.pubsub import Bus, is_connection_lost, is_service_error, publish
from unskit.errors import PublishError, UnsupportedQosError
from unskit.messaging.ipc_connection import _IpcState
from unskit.messaging.mqtt_publish import MAX_QUEUED_MESSAGES
from unskit.messaging.requests import DeadlineTimer
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

    def check_publish(self, topic: str, qos: QoS) -> None:
        """Raises for a publish this link can never send (QoS 2, a wildcard topic): the
        outbox asks before it stores one, which it could otherwise only retry forever."""
        if qos == QoS.EXACTLY_ONCE:
            raise UnsupportedQosError(
                f"messaging {self._name}: QoS 2 publish to {topic!r} refused: the edge "
                f"runtime's {self._bus_name} carries QoS 0 and 1 only"
            )
        _check_topic(self._name, topic)

    def publish(self, topic: str, payload: bytes, qos: QoS) -> None:
        """Sends now, or (QoS 1) holds for the next connection; QoS 0 is dropped when down."""
        self._publish(topic, payload, qos, tracked=False)

    def publish_tracked(self, topic: str, payload: bytes, qos: QoS) -> int | None:
        """`publish` for the outbox: returns the publish's id, which `on_acknowledged`
        reports once the nucleus answered it (for QoS 0 too, whatever the answer); None
        when a QoS 0 publish was dropped, the link being down."""
        return self._publish(topic, payload, qos, tracked=True)

    def on_acknowledged(self, callback: Callable[[int], None] | None) -> None:
        """Calls `callback(id)` on the SDK's event-loop thread for each answered publish of
        `publish_tracked`. The answer is the nucleus's: on the cloud proxy it means the
        nucleus sent the message or holds it in its spooler, not that the cloud has it."""
        with self._lock:
            self._on_acknowledged = callback

    def _publish(self, topic: str, payload: bytes, qos: QoS, *, tracked: bool) -> int | None:
        self.check_publish(topic, qos)
        self._require_started()
        with self._lock:
            if not self._connected:
                if qos == QoS.AT_MOST_ONCE and tracked:
                    return None  # the outbox keeps it and sends it once the link is up
                return self._hold_locked(topic, payload, qos, self._clock(), None, tracked)
            if self._held and qos == QoS.AT_LEAST_ONCE:
                # Up, but publishes the nucleus refused for now wait for their retry: this
                # one goes behind them, so the order holds.
                return self._hold_locked(topic, payload, qos, self._clock(), None, tracked)
            client, generation = self._client, self._generation
            message_id = self._new_id_locked(tracked)
            if qos == QoS.AT_LEAST_ONCE:
                self._in_flight[message_id] = self._clock()
        self._send(client, generation, message_id, topic, payload, qos)
        return message_id

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

    def _new_id_locked(self, tracked: bool) -> int:
        self._next_id += 1
        if tracked:
            self._tracked.add(self._next_id)
        return self._next_id

    def _hold_locked(
        self,
        topic: str,
        payload: bytes,
        qos: QoS,
        made: float,
        message_id: int | None,
        tracked: bool,
    ) -> int | None:
        """Holds a QoS 1 publish for the next connection, keeping its id (the outbox waits
        for that id's answer across the reconnect); drops a QoS 0 one."""
        if qos == QoS.AT_MOST_ONCE:
            self._dropped_qos0 += 1
            _log.debug("messaging %s: link down, QoS 0 publish to %r dropped", self._name, topic)
            if message_id is not None:
                self._answered_locked(message_id)
            return None
        if len(self._held) >= MAX_QUEUED_MESSAGES:
            self._refused += 1
            if message_id is not None:
                self._tracked.discard(message_id)
            raise PublishError(
                f"messaging {self._name}: {MAX_QUEUED_MESSAGES} publishes already wait for the "
                f"edge runtime; {topic!r} was not queued"
            )
        if message_id is None:
            message_id = self._new_id_locked(tracked)
        held = self._held
        if held and held[-1][3] > message_id:
            # Held again after newer ones: back in its place, ids being in publish order.
            at = len(held)
            while at and held[at - 1][3] > message_id:
                at -= 1
            held.insert(at, (made, topic, payload, message_id))
        else:
            held.append((made, topic, payload, message_id))
        return message_id

    def _answered_locked(self, message_id: int) -> None:
        """Reports a tracked publish's answer to the outbox (after the lock is released:
        the callback is queued here, run by `_report_answers`)."""
        if message_id in self._tracked:
            self._tracked.discard(message_id)
            self._answers.append(message_id)

    def _report_answers(self) -> None:
        with self._lock:
            callback, answers = self._on_acknowledged, list(self._answers)
            self._answers.clear()
        if callback is not None:
            for message_id in answers:
                callback(message_id)

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
                batch = list(self._held)
                self._held.clear()
                for made, _topic, _payload, message_id in batch:
                    self._in_flight[message_id] = made
            # Never under the lock: a future already settled runs its callback right here.
            for _made, topic, payload, message_id in batch:
                self._send(client, generation, message_id, topic, payload, QoS.AT_LEAST_ONCE)
            sent += len(batch)

    def _send(
        self,
        client: Any,
        generation: int,
        message_id: int,
        topic: str,
        payload: bytes,
        qos: QoS,
    ) -> None:
        try:
            future = publish(client, self._bus, topic, payload, qos == QoS.AT_LEAST_ONCE)
        except Exception as exc:  # the SDK raises when the connection just went
            self._publish_failed(generation, message_id, topic, payload, qos, exc)
            return
        future.add_done_callback(
            functools.partial(self._publish_answered, generation, message_id, topic, payload, qos)
        )

    def _publish_answered(
        self,
        generation: int,
        message_id: int,
        topic: str,
        payload: bytes,
        qos: QoS,
        future: Future[Any],
    ) -> None:
        # The SDK's event-loop thread: bookkeeping only.
        exc = future.exception()
        if exc is None:
            with self._lock:
                self._in_flight.pop(message_id, None)
                self._answered_locked(message_id)
                if not self._held:
                    self._retry_streak = 0  # the next refusal's retry starts quick again
                self._changed.notify_all()
            self._report_answers()
            return
        self._publish_failed(generation, message_id, topic, payload, qos, exc)

    def _publish_failed(
        self,
        generation: int,
        message_id: int,
        topic: str,
        payload: bytes,
        qos: QoS,
        exc: BaseException,
    ) -> None:
        refused = streak = 0
        with self._lock:
            made = self._in_flight.pop(message_id, None)
            made = self._clock() if made is None else made
            tracked = message_id in self._tracked
            lost = is_connection_lost(exc) or generation != self._generation
            for_now = (
                not lost
                and self._bus is Bus.IOT_CORE
                and qos == QoS.AT_LEAST_ONCE
                and tracked
                and is_service_error(exc)
            )
            if (lost or for_now) and not self._closed:
                # Held again for the next connection (lost), or, refused for now (the
                # nucleus's spooler full while its cloud connection is down), for a retry
                # after a backoff rather than deleted from the outbox unsent; newer ones
                # queue behind it. Beyond the bound it is counted as refused.
                with contextlib.suppress(PublishError):
                    self._hold_locked(topic, payload, qos, made, message_id, tracked)
                if lost and self._connected and generation == self._generation:
                    # Failed as lost while the link still counts as up (its loss not yet
                    # reported, or one stream closed): the retry sends it if no reconnect
                    # does, so nothing queued behind it waits for good.
                    self._schedule_publish_retry_locked(1)
                if for_now:
                    self._spool_refusals += 1
                    self._retry_streak += 1
                    self._schedule_publish_retry_locked(self._retry_streak)
                    now = self._clock()
                    # A warning a minute at most: a full spooler refuses in bursts, and
                    # takes some again in between as it frees room.
                    if self._spool_warned_at is None or now - self._spool_warned_at >= 60:
                        self._spool_warned_at = now
                        streak = self._spool_refusals
            elif lost and tracked:
                # Closing: the outbox keeps the entry for the next start (never answered,
                # so never deleted).
                self._tracked.discard(message_id)
            else:
                self._refused += 1
                refused = self._refused
                # Answered, though refused: the outbox must not wait for it forever (the
                # refusal is counted and logged here, as without an outbox).
                self._answered_locked(message_id)
            self._changed.notify_all()
        self._report_answers()
        if streak:
            _log.warning(
                "messaging %s: %s; held with what follows and sent again with backoff (%d "
                "refused for now so far; logged once a minute at most)",
                self._name,
                edge_error(exc, self._bus.value, topic),
                streak,
            )
        if refused == 1 or (refused and refused % _REFUSED_LOG_EVERY == 0):
            _log.error(
                "messaging %s: %s (%d publishes refused so far)",
                self._name,
                edge_error(exc, self._bus.value, topic),
                refused,
            )

    def _schedule_publish_retry_locked(self, streak: int) -> float | None:
        """Arms the one retry of the held publishes, unless armed; returns its delay."""
        if self._publish_retry is not None or self._closed:
            return None
        delay = self._config.reconnect.delay(streak)
        timer = self._timer
        if timer is None:
            if self._own_timer is None:
                self._own_timer = DeadlineTimer(f"unskit-{self._name}-resubscribe", self._clock)
            timer = self._own_timer
        self._publish_retry = timer.call_later(delay, self._retry_held)
        return delay

    def _cancel_publish_retry_locked(self) -> None:
        handle, self._publish_retry = self._publish_retry, None
        if handle is not None:
            timer = self._timer or self._own_timer
            if timer is not None:
                timer.cancel(handle)

    def _retry_held(self) -> None:
        """The retry (timer thread): sends what is held, in order, on the current connection
        (while down, the reconnect sends it)."""
        with self._lock:
            self._publish_retry = None
            if self._closed or not self._connected or self._client is None:
                return
            client, generation = self._client, self._generation
        self._flush_held(client, generation)


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
