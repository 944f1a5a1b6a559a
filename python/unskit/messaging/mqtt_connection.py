"""The MQTT transport's base layer: one broker link's state, the failover list it walks (the
endpoint tried next, the grace a failover is given), the TLS context and credentials of its
CONNECT, and the reconnect backoff the link's `reconnect` configuration sets. `MqttTransport`
(`mqtt.py`) joins it with the publish and subscription layers."""

from __future__ import annotations

import collections
import logging
import ssl
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as paho

from unskit.config.model import BrokerConfig
from unskit.config.secrets import SecretResolver, resolve_value
from unskit.errors import MessagingError
from unskit.messaging.paho_adapter import retarget
from unskit.messaging.requests import DeadlineTimer
from unskit.messaging.transport import LinkCallback, MessageCallback, QoS

# The logger keeps the name it had before this module was split out of mqtt.py.
_log = logging.getLogger("unskit.messaging.mqtt")


class _ClosingSSLSocket(ssl.SSLSocket):
    """Closes itself when the handshake fails: paho drops such a socket unclosed, one per
    reconnect attempt to a broker whose certificate is refused."""

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


class _Connection:
    """The base layer of `MqttTransport`: the link's state, endpoints, TLS and backoff."""

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
        self._changed = threading.Condition(self._lock)
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

    def is_connected(self) -> bool:
        """Whether the broker accepted our CONNECT and the link has not dropped since."""
        return self._connected

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

    def _require_client(self) -> paho.Client:
        if self._client is None:
            raise MessagingError(f"messaging {self._name}: not started")
        if self._closed:
            raise MessagingError(f"messaging {self._name}: closed")
        return self._client

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
