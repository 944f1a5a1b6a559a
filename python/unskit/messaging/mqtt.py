"""The MQTT transport over paho-mqtt's public API; paho's internals stay in `paho_adapter`."""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from unskit.config.messaging import ReconnectConfig
from unskit.config.model import BrokerConfig
from unskit.config.secrets import SecretResolver, resolve_value
from unskit.errors import MessagingError, PublishError
from unskit.messaging.paho_adapter import (
    BufferedClient,
    awaits_acknowledgement,
    retarget,
    unacknowledged,
)
from unskit.messaging.requests import DeadlineTimer
from unskit.messaging.transport import LinkCallback, MessageCallback, QoS

__all__ = ["MAX_QUEUED_MESSAGES", "MqttTransport"]

_log = logging.getLogger(__name__)

# Publishes (QoS 1 and 2) held while the link is down; beyond this a publish raises.
MAX_QUEUED_MESSAGES = 10_000
# QoS 1/2 messages on the wire awaiting acknowledgement: 0, no limit of its own (MQTT 3.1.1
# has no Receive Maximum; MAX_QUEUED_MESSAGES bounds sent and queued together). Any limit
# makes paho rescan its whole out-queue on every PUBACK once the limit is reached (its
# `_update_inflight`), which took half of the OPC UA adapter's CPU at 10,000 changes/s; its
# default of 20 throttles a fast link besides.
MAX_INFLIGHT_MESSAGES = 0
# The retry of refused subscriptions: full jitter over an exponentially growing window.
# (Reconnects follow the link's `reconnect` configuration, ReconnectConfig.)
BACKOFF_BASE_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
# QoS 1/2 publishes remembered for the age of the oldest unacknowledged one, beyond which
# the acknowledged ones are swept out (a link nobody asks the age of must not grow).
_SENT_SWEEP_AT = 2 * MAX_QUEUED_MESSAGES
_RESUBSCRIBE_BACKOFF = ReconnectConfig(BACKOFF_BASE_SECS, BACKOFF_MAX_SECS)
#: A connection that drops sooner than this was a flap, not a recovery: readiness's failover
#: grace keeps counting from the first loss (the backoff still starts over, since a cluster
#: node that just took a session over drops it once while it loads it).
STABLE_CONNECTION_SECS = 5.0


class _ClosingSSLSocket(ssl.SSLSocket):
    """Closes itself when the handshake fails: paho drops such a socket unclosed, one per
    reconnect attempt to a broker whose certificate is refused."""

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


class MqttTransport:
    """One MQTT broker link: TLS keyed on caPath, jittered reconnects, filters restored."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        name: str = "local",
        secrets: SecretResolver | None = None,
        persistent_session: bool = True,
        clock: Callable[[], float] = time.monotonic,
        timer: DeadlineTimer | None = None,
    ) -> None:
        self._config = config
        self._persistent_session = persistent_session
        self._name = name
        self._secrets = secrets
        self._clock = clock
        self._lock = threading.Lock()
        # Notified (under the lock) whenever a SUBACK is recorded.
        self._subacks = threading.Condition(self._lock)
        self._filters: dict[str, QoS] = {}
        # Filters the broker acknowledged (SUBACK) on the current connection, and the
        # filters of each SUBSCRIBE still awaiting its SUBACK, by packet id.
        self._acknowledged: set[str] = set()
        self._awaiting_suback: dict[int, list[str]] = {}
        self._connected = False
        self._attempt = 0
        self._closed = False
        self._dropped_qos0 = 0
        self._refused = 0
        self._subscribes_sent = 0
        # Filters the broker refused, each with the refusals of its current streak, and the
        # one scheduled re-SUBSCRIBE of them all. The timer is the messaging client's, else
        # one of our own made at the first refusal.
        self._retrying: dict[str, int] = {}
        self._retry: int | None = None
        self._timer = timer
        self._own_timer: DeadlineTimer | None = None
        self._subscribe_refusals = 0
        self._client: paho.Client | None = None
        self._on_message: MessageCallback | None = None
        self._on_link: LinkCallback | None = None
        # The failover list and where we are in it; `_lost_at` is when the link last went
        # down after a stable connection (None while up or never connected).
        self._addresses = config.addresses
        self._address_index = 0
        self._failovers = 0
        self._connected_at: float | None = None
        self._lost_at: float | None = None
        # QoS 1/2 publishes in order, each with when it was made: the first one paho still
        # holds is the oldest unacknowledged. The acknowledged ones are swept from the head
        # when the age is asked for, and from anywhere past _SENT_SWEEP_AT.
        self._sent: collections.deque[tuple[float, paho.MQTTMessageInfo]] = collections.deque()
        self._sent_lock = threading.Lock()

    @property
    def name(self) -> str:
        """`local` or `northbound`, for logs and errors."""
        return self._name

    @property
    def endpoint(self) -> str:
        """The broker this link is connected to, or tries next, as ``host:port``."""
        host, port = self._addresses[self._address_index]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def failovers(self) -> int:
        """How many times a lost or refused link moved on to the next listed broker."""
        return self._failovers

    def within_failover_grace(self) -> bool:
        """True while a link with a failover list is down for less than its grace period
        (counted from the last loss of a stable connection): a failover is not an outage."""
        config = self._config
        with self._lock:
            lost_at = self._lost_at
        return (
            bool(config.failover)
            and lost_at is not None
            and self._clock() - lost_at < config.failover_grace_seconds
        )

    @property
    def dropped_while_disconnected(self) -> int:
        """QoS 0 publishes dropped because the link was down (QoS 0 is at most once)."""
        return self._dropped_qos0

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

    def _configure_security(self, client: paho.Client) -> None:
        creds = self._config.credentials
        login = creds.username is not None or creds.password is not None
        if creds.ca_path is not None:
            mutual = creds.cert_path is not None and creds.key_path is not None
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=creds.ca_path)
            # Fail closed: the broker's certificate and host name are always checked.
            context.check_hostname = True
            context.verify_mode = ssl.CERT_REQUIRED
            context.sslsocket_class = _ClosingSSLSocket
            if mutual:
                context.load_cert_chain(creds.cert_path, creds.key_path)  # type: ignore[arg-type]
            client.tls_set_context(context)
            if login:
                self._warn_unused("username and password are not sent with caPath (TLS)")
            return
        if creds.cert_path is not None or creds.key_path is not None:
            self._warn_unused("certPath and keyPath are not used without caPath (plaintext)")
        # username/password only ever go to a plaintext local broker (spec 1); validation
        # refuses them on the northbound link, so only a BrokerConfig built in code has them.
        if self._name != "local":
            if login:
                self._warn_unused(
                    "username and password are not sent: they go only to a plaintext local broker"
                )
            return
        username = resolve_value(creds.username, self._secrets)
        password = resolve_value(creds.password, self._secrets)
        if username is not None:
            client.username_pw_set(
                username.reveal(), None if password is None else password.reveal()
            )

    def _warn_unused(self, what: str) -> None:
        # Spec 1 ignores these keys; the log says so, once per start, never with a value.
        _log.warning("messaging.%s.credentials: %s", self._name, what)

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

    def is_connected(self) -> bool:
        """Whether the broker accepted our CONNECT and the link has not dropped since."""
        return self._connected

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
    def filters(self) -> dict[str, QoS]:
        """The filters this link keeps subscribed (a copy)."""
        with self._lock:
            return dict(self._filters)

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

    def _require_client(self) -> paho.Client:
        if self._client is None:
            raise MessagingError(f"messaging {self._name}: not started")
        if self._closed:
            raise MessagingError(f"messaging {self._name}: closed")
        return self._client

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

    def _fail_over(self, client: paho.Client) -> None:
        """Points the next reconnect at the next listed broker (round robin)."""
        if len(self._addresses) < 2:
            return
        self._address_index = (self._address_index + 1) % len(self._addresses)
        self._failovers += 1
        retarget(client, *self._addresses[self._address_index])

    def _reset_backoff(self, client: paho.Client) -> None:
        """paho's own schedule, used only before our first callback: the configured bounds."""
        backoff = self._config.reconnect
        client.reconnect_delay_set(
            backoff.initial_delay_seconds,  # type: ignore[arg-type]
            backoff.max_delay_seconds,  # type: ignore[arg-type]
        )

    def _next_backoff(self, client: paho.Client) -> float:
        with self._lock:
            self._attempt += 1
            attempt = self._attempt
        backoff = self._config.reconnect
        delay = backoff.delay(attempt)
        # paho waits its minimum delay before the next attempt (its doubling starts over
        # with each call): we set it per attempt, so paho's wait is exactly ours.
        client.reconnect_delay_set(delay, backoff.max_delay_seconds)  # type: ignore[arg-type]
        return delay

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

    def _handle_message(self, _c: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        if self._on_message is not None:
            self._on_message(message.topic, message.payload)


def _set_nodelay(_client: paho.Client, _userdata: Any, sock: Any) -> None:
    # Without TCP_NODELAY a QoS 1 exchange stalls on delayed ACKs (~40 ms per round trip).
    # A unix socket or an exotic transport has nothing to tune.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
