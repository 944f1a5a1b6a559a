"""The ``messaging`` section, typed: the local broker, the optional northbound one, the
request deadline and the reply topic prefixes.

`messaging_from_section` builds it from a validated document (the schema and
`unskit.config.rules` own its rules); code that talks to a broker of its own (a client tool,
a test) builds `MessagingConfig` and `BrokerConfig` directly.
"""

from __future__ import annotations

import enum
import random
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from unskit.backoff import backoff_window, jittered_delay
from unskit.config.secrets import Secret, SecretRef
from unskit.config.values import (
    DEFAULT_KEEPALIVE_SECONDS,
    DEFAULT_MQTT_PORT,
    DEFAULT_MQTT_TLS_PORT,
    DEFAULT_REQUEST_TIMEOUT_SECONDS,
    EMBEDDED_HOST,
)

__all__ = [
    "BrokerConfig",
    "BrokerCredentials",
    "BrokerEndpoint",
    "IpcConfig",
    "MessagingConfig",
    "OverflowPolicy",
    "QosConfig",
    "ReconnectConfig",
    "StoreAndForwardConfig",
    "messaging_from_section",
    "parse_endpoint",
]

#: Readiness's default patience with a failover between listed endpoints.
DEFAULT_FAILOVER_GRACE_SECONDS = 10.0
#: messaging.*.reconnect defaults (docs/decisions.md, "Reconnect backoff"): a broker back
#: from a restart is found again within maxDelaySeconds.
DEFAULT_RECONNECT_INITIAL_DELAY_SECONDS = 0.5
DEFAULT_RECONNECT_MAX_DELAY_SECONDS = 4.0
#: The schema's bound on both reconnect delays.
RECONNECT_DELAY_LIMIT_SECONDS = 3600.0
#: messaging.northbound.type selecting the edge runtime's cloud MQTT proxy.
RUNTIME_NORTHBOUND = "runtime"
#: messaging.*.publishDegradedAfterSeconds: a publish held this long unacknowledged (or
#: stored) raises message-publish-degraded.
DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS = 30.0
_SCHEMES = {"mqtt": False, "mqtts": True}


@dataclass(frozen=True)
class BrokerEndpoint:
    """One broker address of an ``endpoints`` list: host, port and whether it is TLS."""

    host: str
    port: int
    tls: bool

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(text: str) -> BrokerEndpoint:
    """``mqtt://host[:port]`` or ``mqtts://host[:port]``; ValueError says what is wrong."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"{text!r}: the scheme must be mqtt:// or mqtts://")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{text!r}: only a host and a port, no path, query or user")
    try:
        port = parts.port
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}") from None
    if not parts.hostname:
        raise ValueError(f"{text!r}: no host")
    tls = _SCHEMES[parts.scheme]
    if port is None:
        port = DEFAULT_MQTT_TLS_PORT if tls else DEFAULT_MQTT_PORT
    if port == 0:
        raise ValueError(f"{text!r}: the port must be >= 1")
    return BrokerEndpoint(parts.hostname, port, tls)


@dataclass(frozen=True)
class QosConfig:
    """QoS used on one broker when an operation gives none (0, 1 or 2)."""

    publish: int = 1
    subscribe: int = 1


@dataclass(frozen=True)
class ReconnectConfig:
    """The reconnect backoff of one broker link (``messaging.*.reconnect``): attempt n waits
    a delay drawn uniformly from [initial, min(max, initial * 2**n)] (full jitter, so a fleet
    does not reconnect in step), and a successful connection starts over at attempt 1."""

    initial_delay_seconds: float = DEFAULT_RECONNECT_INITIAL_DELAY_SECONDS
    max_delay_seconds: float = DEFAULT_RECONNECT_MAX_DELAY_SECONDS

    def __post_init__(self) -> None:
        initial, most = self.initial_delay_seconds, self.max_delay_seconds
        for name, value in (("initialDelaySeconds", initial), ("maxDelaySeconds", most)):
            if not 0 < value <= RECONNECT_DELAY_LIMIT_SECONDS:  # NaN fails too
                raise ValueError(
                    f"reconnect.{name} must be above 0 and at most "
                    f"{RECONNECT_DELAY_LIMIT_SECONDS:g} s"
                )
        if initial > most:
            raise ValueError("reconnect.initialDelaySeconds must be at most maxDelaySeconds")

    def window(self, attempt: int) -> float:
        """The upper end of attempt `attempt`'s delay (attempts count from 1)."""
        return backoff_window(self.initial_delay_seconds, self.max_delay_seconds, attempt)

    def delay(self, attempt: int, draw: Callable[[float, float], float] = random.uniform) -> float:
        """The jittered wait before attempt `attempt`, within [initial, window(attempt)]."""
        return jittered_delay(self.initial_delay_seconds, self.max_delay_seconds, attempt, draw)


@dataclass(frozen=True)
class BrokerCredentials:
    """TLS material paths and the optional user/password of one broker."""

    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    username: str | SecretRef | None = None
    password: Secret | SecretRef | None = None


class OverflowPolicy(str, enum.Enum):
    """What a full outbox does with a new publish."""

    DROP_OLDEST = "dropOldest"
    REFUSE_NEWEST = "refuseNewest"


#: storeAndForward defaults (docs/configuration.md).
OUTBOX_FILE = "outbox.sqlite3"
DEFAULT_OUTBOX_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_OUTBOX_MAX_AGE_SECONDS = 7 * 24 * 3600.0
DEFAULT_OUTBOX_MAX_IN_FLIGHT = 1000


@dataclass(frozen=True)
class StoreAndForwardConfig:
    """The northbound outbox (``messaging.northbound.storeAndForward``), when enabled."""

    #: The SQLite file; a component defaults it to {stateDir}/{thing}/{component}/outbox.sqlite3.
    path: Path
    max_bytes: int = DEFAULT_OUTBOX_MAX_BYTES
    #: Entries older than this are dropped (counted as expired); 0 keeps them until sent.
    max_age_seconds: float = DEFAULT_OUTBOX_MAX_AGE_SECONDS
    overflow: OverflowPolicy = OverflowPolicy.DROP_OLDEST
    #: Replay pace; 0 sends as fast as the window allows.
    replay_messages_per_second: float = 0.0
    #: Messages sent but not yet acknowledged, at most.
    max_in_flight: int = DEFAULT_OUTBOX_MAX_IN_FLIGHT
    #: synchronous=FULL commits (commands.durableSync): survives a power cut, not only a kill.
    synchronous_full: bool = False


@dataclass(frozen=True)
class BrokerConfig:
    """One broker: host (or endpoint), port, client id, default QoS, credentials."""

    host: str
    port: int
    client_id: str
    qos: QosConfig = QosConfig()
    credentials: BrokerCredentials = BrokerCredentials()
    #: The northbound outbox; None (the default) publishes straight to the link.
    store_and_forward: StoreAndForwardConfig | None = None
    #: MQTT keepalive: a broker silent for about this long (or up to twice it) is taken as
    #: gone and the client reconnects.
    keepalive_seconds: int = DEFAULT_KEEPALIVE_SECONDS
    #: Further brokers after (host, port), tried in turn when the link is lost.
    failover: tuple[tuple[str, int], ...] = ()
    #: With a failover list, readiness stays up this long after the link drops.
    failover_grace_seconds: float = DEFAULT_FAILOVER_GRACE_SECONDS
    #: The jittered backoff between connection attempts.
    reconnect: ReconnectConfig = ReconnectConfig()
    #: message-publish-degraded rises when a publish waited this long unacknowledged.
    publish_degraded_after_seconds: float = DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every broker to try, in order: (host, port) first, then the failover list."""
        return ((self.host, self.port), *self.failover)

    @property
    def embedded(self) -> bool:
        """True when the in-process broker is to be started (``"host": "embedded"``)."""
        return self.host == EMBEDDED_HOST

    @property
    def tls(self) -> bool:
        """TLS is keyed on caPath alone."""
        return self.credentials.ca_path is not None

    @property
    def mutual_tls(self) -> bool:
        """caPath with certPath and keyPath gives mutual TLS."""
        c = self.credentials
        return c.ca_path is not None and c.cert_path is not None and c.key_path is not None


@dataclass(frozen=True)
class IpcConfig:
    """The local link over the edge runtime's IPC bus (``messaging.local`` with ``"type":
    "ipc"``, or no ``messaging.local`` on EDGE_RUNTIME): the nucleus's socket and token come
    from the variables the runtime hands the component, not from configuration."""

    #: Names this link's reply filter (``lib/reply-{token}/#``); never sent to the nucleus,
    #: which knows the component by its token.
    client_id: str
    #: QoS 0 or 1 (the IPC bus has no QoS 2).
    qos: QosConfig = QosConfig()
    #: True: subscriptions receive every message, the component's own included
    #: (RECEIVE_ALL_MESSAGES); False: only other components' (RECEIVE_MESSAGES_FROM_OTHERS).
    receive_own_messages: bool = True
    reconnect: ReconnectConfig = ReconnectConfig()
    publish_degraded_after_seconds: float = DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS
    #: The outbox of a northbound link over the nucleus's cloud MQTT proxy
    #: (``messaging.northbound`` with ``"type": "runtime"``); never on the local link.
    store_and_forward: StoreAndForwardConfig | None = None


@dataclass(frozen=True)
class MessagingConfig:
    """The local link (an MQTT broker, or the edge runtime's IPC bus) and the optional
    northbound broker.

    A configuration document gives `local` or `local_ipc`; both None is left for code that
    hands `MessagingClient` its local transport itself.
    """

    local: BrokerConfig | None
    northbound: BrokerConfig | None = None
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS
    #: Topic prefixes replies may go to besides ``lib/reply-`` (replyTopicPrefixes).
    reply_topic_prefixes: tuple[str, ...] = ()
    #: The local link over the edge runtime's IPC bus, instead of `local`.
    local_ipc: IpcConfig | None = None
    #: The northbound link over the edge runtime's cloud MQTT proxy (``"type": "runtime"``),
    #: instead of `northbound`.
    northbound_runtime: IpcConfig | None = None

    @property
    def ipc(self) -> bool:
        """True when the local link is the edge runtime's IPC bus."""
        return self.local_ipc is not None

    @property
    def has_northbound(self) -> bool:
        """True when a northbound link is configured (a broker or the runtime's proxy)."""
        return self.northbound is not None or self.northbound_runtime is not None

    @property
    def northbound_settings(self) -> BrokerConfig | IpcConfig | None:
        """The northbound link's settings: its broker's, or the runtime proxy's."""
        return self.northbound if self.northbound is not None else self.northbound_runtime


def messaging_from_section(
    section: Mapping[str, Any],
    thing: str,
    token: str,
    *,
    state_dir: Path | None = None,
    durable_sync: bool = False,
    edge_runtime: bool = False,
) -> MessagingConfig:
    """The ``messaging`` section of a validated document; client ids default to
    ``{thing}-{token}``, the outbox file to ``{state_dir}/outbox.sqlite3``. The local link
    is IPC with ``"type": "ipc"``, or without ``local`` on the edge runtime (`edge_runtime`)."""
    northbound = section.get("northbound")
    northbound_config = northbound_runtime = None
    if northbound is not None:
        outbox = _store_and_forward(northbound.get("storeAndForward", {}), state_dir, durable_sync)
        if northbound.get("type") == RUNTIME_NORTHBOUND:
            northbound_runtime = replace(_ipc(northbound, thing, token), store_and_forward=outbox)
        else:
            broker = _broker(northbound, thing, token)
            northbound_config = (
                broker if outbox is None else replace(broker, store_and_forward=outbox)
            )
    local = section.get("local")
    ipc = local.get("type") == "ipc" if local is not None else edge_runtime
    return MessagingConfig(
        local=None if ipc else _broker(section["local"], thing, token),
        local_ipc=_ipc(local or {}, thing, token) if ipc else None,
        northbound=northbound_config,
        northbound_runtime=northbound_runtime,
        request_timeout_seconds=float(
            section.get("requestTimeoutSeconds", DEFAULT_REQUEST_TIMEOUT_SECONDS)
        ),
        reply_topic_prefixes=tuple(section.get("replyTopicPrefixes", ())),
    )


def _ipc(block: Mapping[str, Any], thing: str, token: str) -> IpcConfig:
    qos = block.get("qos", {})
    return IpcConfig(
        client_id=f"{thing}-{token}",
        qos=QosConfig(publish=qos.get("publish", 1), subscribe=qos.get("subscribe", 1)),
        receive_own_messages=bool(block.get("receiveOwnMessages", True)),
        reconnect=_reconnect(block.get("reconnect", {})),
        publish_degraded_after_seconds=float(
            block.get("publishDegradedAfterSeconds", DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS)
        ),
    )


def _reconnect(block: Mapping[str, Any]) -> ReconnectConfig:
    return ReconnectConfig(
        initial_delay_seconds=float(
            block.get("initialDelaySeconds", DEFAULT_RECONNECT_INITIAL_DELAY_SECONDS)
        ),
        max_delay_seconds=float(block.get("maxDelaySeconds", DEFAULT_RECONNECT_MAX_DELAY_SECONDS)),
    )


def _broker(block: Mapping[str, Any], thing: str, token: str) -> BrokerConfig:
    creds = block.get("credentials", {})
    password = creds.get("password")
    username = creds.get("username")
    credentials = BrokerCredentials(
        ca_path=creds.get("caPath"),
        cert_path=creds.get("certPath"),
        key_path=creds.get("keyPath"),
        username=SecretRef.parse(username) or username,
        password=SecretRef.parse(password) or (None if password is None else Secret(password)),
    )
    # Keys spec 1 ignores (certPath/keyPath without caPath, username/password with it) are
    # logged by the transport when it connects, for a configuration built in code too.
    qos = block.get("qos", {})
    tls = credentials.ca_path is not None
    # The rules refused a list that mixes schemes or disagrees with caPath.
    endpoints = [parse_endpoint(text) for text in block.get("endpoints", ())]
    addresses = [(e.host, e.port) for e in endpoints] or [
        (
            block.get("host") or block["endpoint"],
            block.get("port", DEFAULT_MQTT_TLS_PORT if tls else DEFAULT_MQTT_PORT),
        )
    ]
    return BrokerConfig(
        host=addresses[0][0],
        port=addresses[0][1],
        failover=tuple(addresses[1:]),
        failover_grace_seconds=float(
            block.get("failoverGraceSeconds", DEFAULT_FAILOVER_GRACE_SECONDS)
        ),
        client_id=block.get("clientId", f"{thing}-{token}"),
        qos=QosConfig(publish=qos.get("publish", 1), subscribe=qos.get("subscribe", 1)),
        credentials=credentials,
        keepalive_seconds=block.get("keepAliveSeconds", DEFAULT_KEEPALIVE_SECONDS),
        reconnect=_reconnect(block.get("reconnect", {})),
        publish_degraded_after_seconds=float(
            block.get("publishDegradedAfterSeconds", DEFAULT_PUBLISH_DEGRADED_AFTER_SECONDS)
        ),
    )


def _store_and_forward(
    block: Mapping[str, Any], state_dir: Path | None, durable_sync: bool
) -> StoreAndForwardConfig | None:
    if not block.get("enabled", False):
        return None
    path = block.get("path")
    if path is None:
        if state_dir is None:
            raise ValueError("messaging.northbound.storeAndForward: no path and no state directory")
        resolved = state_dir / OUTBOX_FILE
    else:
        resolved = Path(path)
    return StoreAndForwardConfig(
        path=resolved,
        max_bytes=int(block.get("maxBytes", DEFAULT_OUTBOX_MAX_BYTES)),
        max_age_seconds=float(block.get("maxAgeSeconds", DEFAULT_OUTBOX_MAX_AGE_SECONDS)),
        overflow=OverflowPolicy(block.get("overflow", OverflowPolicy.DROP_OLDEST.value)),
        replay_messages_per_second=float(block.get("replayMessagesPerSecond", 0)),
        max_in_flight=int(block.get("maxInFlight", DEFAULT_OUTBOX_MAX_IN_FLIGHT)),
        synchronous_full=durable_sync,
    )
