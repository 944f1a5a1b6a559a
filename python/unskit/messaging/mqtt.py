"""The MQTT transport over paho-mqtt's public API; paho's internals stay in `paho_adapter`.

`MqttTransport` is joined here from its layers: `mqtt_connection` (the link's state, the
failover list, TLS and credentials, the reconnect backoff), `mqtt_publish` (publishes, the
held ones, their acknowledgements and counters) and `mqtt_subscriptions` (filters, SUBACKs,
the retry of refused ones). This module keeps the link's life: start, the paho callbacks of
connect and loss, close.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from unskit.messaging.mqtt_publish import MAX_INFLIGHT_MESSAGES as MAX_INFLIGHT_MESSAGES
from unskit.messaging.mqtt_publish import MAX_QUEUED_MESSAGES, _Publishing
from unskit.messaging.mqtt_subscriptions import _Subscriptions
from unskit.messaging.paho_adapter import BufferedClient, unacknowledged
from unskit.messaging.subscription_ledger import BACKOFF_BASE_SECS as BACKOFF_BASE_SECS
from unskit.messaging.subscription_ledger import BACKOFF_MAX_SECS as BACKOFF_MAX_SECS
from unskit.messaging.transport import LinkCallback, MessageCallback

__all__ = ["MAX_QUEUED_MESSAGES", "MqttTransport"]

_log = logging.getLogger(__name__)

#: A connection that drops sooner than this was a flap, not a recovery: readiness's failover
#: grace keeps counting from the first loss (the backoff still starts over, since a cluster
#: node that just took a session over drops it once while it loads it).
STABLE_CONNECTION_SECS = 5.0


class MqttTransport(_Publishing, _Subscriptions):
    """One MQTT broker link: TLS keyed on caPath, jittered reconnects, filters restored."""

    #: MQTT carries every payload size the library makes (spec 2: all three thumbnails).
    small_messages_only = False

    def start(self, on_message: MessageCallback, on_link: LinkCallback) -> None:
        """Resolves credentials, then connects and reconnects in paho's network thread."""
        self._on_message, self._on_link = on_message, on_link
        config = self._config
        client = BufferedClient(
            CallbackAPIVersion.VERSION2,
            client_id=config.client_id,
            # A stable client id gets a persistent session: QoS 1/2 messages published to
            # our subscriptions while we are away wait on the broker for us.
            clean_session=not self._persistent_session,
            protocol=MQTTProtocolVersion.MQTTv311,
        )
        client.max_queued_messages_set(MAX_QUEUED_MESSAGES)
        client.max_inflight_messages_set(MAX_INFLIGHT_MESSAGES)
        self._configure_security(client)
        client.on_socket_open = _set_nodelay
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_connect_fail = self._handle_connect_fail
        client.on_message = self._handle_message
        client.on_subscribe = self._handle_suback
        self._reset_backoff(client)
        self._client = client
        _log.info(
            "messaging %s: connecting to %s:%d as %r%s%s",
            self._name,
            config.host,
            config.port,
            config.client_id,
            " over TLS" if config.tls else "",
            f" ({len(config.failover)} more brokers to fail over to)" if config.failover else "",
        )
        client.connect_async(config.host, config.port, keepalive=config.keepalive_seconds)
        client.loop_start()

    def close(self, timeout: float) -> None:
        """Waits up to `timeout` s for QoS 1/2 acknowledgements, then disconnects."""
        client = self._client
        if client is None or self._closed:
            return
        deadline = self._clock() + timeout
        with self._lock:
            self._closed = True
            self._cancel_retry()
            own_timer, self._own_timer = self._own_timer, None
        if own_timer is not None:
            own_timer.stop()
        # paho's on_publish callback would tell us each acknowledgement, but setting it
        # costs a third of QoS 0 throughput; at shutdown a short bounded poll is cheaper.
        pause = threading.Event()
        while (pending := unacknowledged(client)) and self._connected:
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            pause.wait(min(remaining, 0.02))
        if pending:
            _log.warning(
                "messaging %s: closing with %d publishes unacknowledged", self._name, pending
            )
        client.disconnect()
        client.loop_stop()

    # -- paho callbacks (network thread) ------------------------------------------------

    def _handle_connect(
        self, client: paho.Client, _u: Any, flags: Any, reason: Any, _p: Any
    ) -> None:
        if reason.is_failure:
            _log.warning("messaging %s: broker refused the connection: %s", self._name, reason)
            return
        with self._lock:
            self._attempt = 0
            self._connected_at = self._clock()
            # Acknowledgements of the last connection do not carry over, even when the
            # broker kept the session: readiness waits for this connection's SUBACK.
            self._acknowledged.clear()
            self._awaiting_suback.clear()
            # This SUBSCRIBE carries the refused filters too.
            self._cancel_retry()
            filters = list(self._filters.items())
            if filters:
                self._send_subscribe(client, filters)
            # Only now: a caller that saw the link up publishes after the restore (the
            # reply filter among it), so its request's reply has a subscription to land on.
            self._connected = True
        self._reset_backoff(client)
        _log.info(
            "messaging %s: connected (session present: %s, %d filters restored)",
            self._name,
            flags.session_present,
            len(filters),
        )
        if self._on_link is not None:
            self._on_link(True)

    def _handle_disconnect(
        self, client: paho.Client, _u: Any, _flags: Any, reason: Any, _p: Any
    ) -> None:
        with self._lock:
            was_connected, self._connected = self._connected, False
            self._acknowledged.clear()
            self._awaiting_suback.clear()
            self._cancel_retry()
            now = self._clock()
            stable = (
                self._connected_at is not None
                and now - self._connected_at >= STABLE_CONNECTION_SECS
            )
            self._connected_at = None
            if stable or self._lost_at is None:
                self._lost_at = now
        if self._closed:
            return
        self._fail_over(client)
        delay = self._next_backoff(client)
        _log.warning(
            "messaging %s: link lost (%s); reconnecting to %s in %.1f s",
            self._name,
            reason,
            self.endpoint,
            delay,
        )
        if was_connected and self._on_link is not None:
            self._on_link(False)

    def _handle_connect_fail(self, client: paho.Client, _u: Any) -> None:
        unreachable = self.endpoint
        self._fail_over(client)
        delay = self._next_backoff(client)
        _log.warning(
            "messaging %s: cannot reach %s; trying %s in %.1f s",
            self._name,
            unreachable,
            self.endpoint,
            delay,
        )

    def _handle_message(self, _c: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        if self._on_message is not None:
            self._on_message(message.topic, message.payload)


def _set_nodelay(_client: paho.Client, _userdata: Any, sock: Any) -> None:
    # Without TCP_NODELAY a QoS 1 exchange stalls on delayed ACKs (~40 ms per round trip).
    # A unix socket or an exotic transport has nothing to tune.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
