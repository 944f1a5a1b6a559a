"""The IPC transport's subscription layer: one SubscribeToTopic stream per filter, opened
with the receive mode `receiveOwnMessages` chooses and restored after every reconnect; the
nucleus's answers readiness waits for; and the retry of refused filters (a recipe without
the permission: AccessDenied) on the same jittered backoff as the MQTT transport's."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from unskit.edge import edge_error
from unskit.edge.pubsub import (
    Bus,
    StreamCallbacks,
    close_stream,
    is_connection_lost,
    subscribe_bus,
)
from unskit.errors import UnsupportedQosError
from unskit.messaging.ipc_connection import _IpcState
from unskit.messaging.subscription_ledger import SubscriptionLedger
from unskit.messaging.transport import QoS
from unskit.topics import REPLY_TOPIC_PREFIX

_log = logging.getLogger("unskit.messaging.ipc")


class _IpcSubscriptions(_IpcState, SubscriptionLedger):
    """The subscription layer of `IpcTransport`: streams, answers, refused filters retried."""

    def subscribe(self, topic_filters: Sequence[str], qos: QoS) -> None:
        """Subscribes now if connected (one stream per filter); restored after reconnects.
        The local IPC bus has no subscription QoS (`qos` is kept only to answer `filters`);
        the cloud proxy takes 0 or 1."""
        if qos == QoS.EXACTLY_ONCE and self._bus is Bus.IOT_CORE:
            raise UnsupportedQosError(
                f"messaging {self._name}: QoS 2 subscription to {list(topic_filters)} refused: "
                "the edge runtime's cloud MQTT proxy carries QoS 0 and 1 only"
            )
        self._require_started()
        with self._lock:
            for topic_filter in topic_filters:
                self._filters[topic_filter] = qos
            client, generation = self._client, self._generation
            # While a new connection restores the filters too (not yet `connected`): a
            # filter added meanwhile must not wait for the next reconnect.
            linked = self._client is not None and not self._closed
            due = [f for f in topic_filters if f not in self._streams] if linked else []
        for topic_filter in due:
            self._open_stream(client, generation, topic_filter)

    def unsubscribe(self, topic_filters: Sequence[str]) -> None:
        """Forgets the filters and closes their streams."""
        self._require_started()
        streams = []
        with self._lock:
            for topic_filter in topic_filters:
                if self._filters.pop(topic_filter, None) is None:
                    continue
                self._acknowledged.discard(topic_filter)
                self._retrying.pop(topic_filter, None)
                self._refusal_reasons.pop(topic_filter, None)
                stream = self._streams.pop(topic_filter, None)
                if stream is not None:
                    streams.append(stream)
            if not self._retrying:
                self._cancel_retry()
        for stream in streams:
            try:
                close_stream(stream)
            except Exception as exc:  # a stream of a connection going down
                _log.debug("messaging %s: closing a subscription: %s", self._name, exc)

    @property
    def refused_subscriptions(self) -> dict[str, str]:
        """Each filter waiting for a retry, with the nucleus's reason (for sb/status: an
        AccessDenied names the operation and the topic the recipe does not allow)."""
        with self._lock:
            return {
                f: self._refusal_reasons.get(f, "ended by the edge runtime") for f in self._retrying
            }

    # -- streams ----------------------------------------------------------------------

    def _receive_all(self, topic_filter: str) -> bool:
        # A reply filter receives all: a component that asks itself (its own cmd) must hear
        # its own reply, and nobody else publishes there but responders.
        return self._config.receive_own_messages or topic_filter.startswith(REPLY_TOPIC_PREFIX)

    def _open_stream(self, client: Any, generation: int, topic_filter: str) -> Future[Any] | None:
        """Opens one filter's stream on connection `generation`; returns the nucleus's
        answer (None when the connection is already gone). Never called under the lock."""
        callbacks = StreamCallbacks(
            self._deliver, functools.partial(self._stream_closed, generation, topic_filter)
        )
        try:
            with self._lock:
                qos = self._filters.get(topic_filter, QoS.AT_LEAST_ONCE)
            answer, stream = subscribe_bus(
                client,
                self._bus,
                topic_filter,
                receive_all=self._receive_all(topic_filter),
                at_least_once=qos != QoS.AT_MOST_ONCE,
                callbacks=callbacks,
            )
        except Exception as exc:  # the connection just went; its loss restores the filter
            _log.debug("messaging %s: subscribing %r: %s", self._name, topic_filter, exc)
            return None
        with self._lock:
            self._subscribes_sent += 1
            if (
                generation != self._generation
                or topic_filter not in self._filters
                or topic_filter in self._streams  # opened meanwhile by another thread
            ):
                stale = True
            else:
                stale = False
                self._streams[topic_filter] = stream
        if stale:
            close_stream(stream)
            return None
        answer.add_done_callback(
            functools.partial(self._subscribe_answered, generation, topic_filter, stream)
        )
        return answer

    def _deliver(self, topic: str, payload: bytes) -> None:
        # The SDK's event-loop thread: the messaging client queues without blocking.
        on_message = self._on_message
        if on_message is not None:
            on_message(topic, payload)

    def _subscribe_answered(
        self, generation: int, topic_filter: str, stream: Any, answer: Future[Any]
    ) -> None:
        exc = answer.exception()
        error = (
            None
            if exc is None or is_connection_lost(exc)
            else edge_error(exc, self._bus.subscribe_operation, topic_filter)
        )
        with self._lock:
            if generation != self._generation or self._streams.get(topic_filter) is not stream:
                return  # an earlier connection's, or unsubscribed meanwhile
            if exc is None:
                self._acknowledged.add(topic_filter)
                streak = self._retrying.pop(topic_filter, 0)
                self._refusal_reasons.pop(topic_filter, None)
                self._changed.notify_all()
                refused = False
            elif is_connection_lost(exc):
                return  # the loss restores it on the next connection
            else:
                refused = True
                del self._streams[topic_filter]
                self._subscribe_refusals += 1
                self._acknowledged.discard(topic_filter)
                streak = self._retrying.get(topic_filter, 0) + 1
                self._retrying[topic_filter] = streak
                self._refusal_reasons[topic_filter] = str(error)
                delay = self._schedule_retry()
                self._changed.notify_all()
        if not refused:
            if streak:
                _log.info(
                    "messaging %s: the edge runtime accepted the subscription to %r after %d "
                    "refusals",
                    self._name,
                    topic_filter,
                    streak,
                )
            return
        retry = "" if delay is None else f" in {delay:.1f} s"
        if streak == 1:
            # Once per streak as an error; the retries that follow only at debug level.
            _log.error(
                "messaging %s: the edge runtime refused the subscription to %r: %s; retrying%s "
                "until it is accepted (further refusals are logged at debug level)",
                self._name,
                topic_filter,
                error,
                retry,
            )
        else:
            _log.debug(
                "messaging %s: the subscription to %r refused again (%d in a row), retrying%s",
                self._name,
                topic_filter,
                streak,
                retry,
            )

    def _stream_closed(self, generation: int, topic_filter: str, error: Exception | None) -> None:
        """A stream the nucleus ended after accepting it: the filter is retried. One not yet
        answered is left to its answer; one of a lost connection to the reconnect."""
        with self._lock:
            if (
                self._closed
                or generation != self._generation
                or not self._connected
                or topic_filter not in self._acknowledged
            ):
                return
            del self._streams[topic_filter]
            self._acknowledged.discard(topic_filter)
            self._retrying.setdefault(topic_filter, 0)
            self._schedule_retry()
            self._changed.notify_all()
        _log.warning(
            "messaging %s: the edge runtime ended the subscription to %r (%s); subscribing again",
            self._name,
            topic_filter,
            error or "closed",
        )

    def _resubscribe_refused(self) -> None:
        """The retry (timer thread): a stream for each refused filter not open."""
        with self._lock:
            self._retry = None
            if self._closed or not self._connected:
                return
            client, generation = self._client, self._generation
            due = [f for f in self._retrying if f in self._filters and f not in self._streams]
        for topic_filter in due:
            self._open_stream(client, generation, topic_filter)

    def _restore(self, client: Any, generation: int, timeout: float) -> int:
        """Opens every filter's stream on a new connection and waits (up to `timeout` s) for
        the answers, so that what was held goes out after them; returns how many."""
        with self._lock:
            due = [f for f in self._filters if f not in self._streams]
        answers = [self._open_stream(client, generation, f) for f in due]
        deadline = self._clock() + timeout
        for answer in answers:
            if answer is None:
                continue
            try:
                answer.exception(max(0.0, deadline - self._clock()))
            except TimeoutError:
                break  # readiness waits on; the held publishes need not
        return len(due)
