"""The resolved configuration: typed, frozen sections with every default applied.

`build_config` turns a document that already passed validation into a `ComponentConfig`;
`unskit.config.loader` is the entry point that validates first. `ComponentConfig` satisfies
`unskit.envelope.EnvelopeStamp`, so it can be handed to a `MessageBuilder` as it is.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn

from unskit.config.platform import Platform
from unskit.config.secrets import Secret, SecretRef, find_secret_refs, redact
from unskit.config.vault import DEFAULT_KEY_ENV, VaultSecrets
from unskit.envelope import Identity
from unskit.errors import SecretError

__all__ = [
    "DEFAULT_HEALTH_PORT",
    "DEFAULT_LEVELS",
    "DEFAULT_MQTT_PORT",
    "DEFAULT_MQTT_TLS_PORT",
    "DEFAULT_PYTHON_FORMAT",
    "DEFAULT_REQUEST_TIMEOUT_SECONDS",
    "DEFAULT_TOPIC_ROOT",
    "EMBEDDED_HOST",
    "JSON_FORMAT",
    "BrokerConfig",
    "BrokerCredentials",
    "ComponentConfig",
    "CredentialsConfig",
    "FileLoggingConfig",
    "HealthConfig",
    "HeartbeatConfig",
    "HierarchyConfig",
    "LoggingConfig",
    "MessagingConfig",
    "MetricEmissionConfig",
    "QosConfig",
    "ReadOnlyDict",
    "TopicConfig",
    "build_config",
    "parse_size",
]

_log = logging.getLogger(__name__)

DEFAULT_LEVELS = ("device",)
DEFAULT_TOPIC_ROOT = "uns"
DEFAULT_REQUEST_TIMEOUT_SECONDS = 30.0
DEFAULT_HEALTH_PORT = 8081
DEFAULT_MQTT_PORT = 1883
DEFAULT_MQTT_TLS_PORT = 8883
EMBEDDED_HOST = "embedded"
JSON_FORMAT = "json"
DEFAULT_PYTHON_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"
DEFAULT_METRIC_INTERVAL_SECONDS = 60.0
DEFAULT_HEARTBEAT_INTERVAL_SECONDS = 60.0

_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(?:([KMGT])I?B?|B)?$", re.IGNORECASE)
_SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


@dataclass(frozen=True)
class HierarchyConfig:
    """The ordered level names; the last level is the device (the thing name)."""

    levels: tuple[str, ...] = DEFAULT_LEVELS

    @property
    def device_level(self) -> str:
        """The last level's name."""
        return self.levels[-1]


@dataclass(frozen=True)
class TopicConfig:
    """The UNS topic root; `include_root` inserts the first hierarchy value after it."""

    root: str = DEFAULT_TOPIC_ROOT
    include_root: bool = False


@dataclass(frozen=True)
class QosConfig:
    """QoS used on one broker when an operation gives none (0, 1 or 2)."""

    publish: int = 1
    subscribe: int = 1


@dataclass(frozen=True)
class BrokerCredentials:
    """TLS material paths and the optional user/password of one broker."""

    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    username: str | SecretRef | None = None
    password: Secret | SecretRef | None = None


@dataclass(frozen=True)
class BrokerConfig:
    """One broker: host (or endpoint), port, client id, default QoS, credentials."""

    host: str
    port: int
    client_id: str
    qos: QosConfig = QosConfig()
    credentials: BrokerCredentials = BrokerCredentials()

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
class MessagingConfig:
    """The local broker (None means the edge-runtime IPC bus) and the optional northbound one."""

    local: BrokerConfig | None
    northbound: BrokerConfig | None = None
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS

    @property
    def ipc(self) -> bool:
        """True when local messaging goes over the edge-runtime IPC bus."""
        return self.local is None


@dataclass(frozen=True)
class CredentialsConfig:
    """The encrypted vault `$secret` references resolve from, and where its key comes from."""

    vault_path: str
    key_file: str | None = None
    key_env: str = DEFAULT_KEY_ENV

    def secrets(self, environ: Mapping[str, str] | None = None) -> VaultSecrets:
        """A resolver over this vault; opens nothing until `resolve` is called."""
        return VaultSecrets(
            self.vault_path, key_file=self.key_file, key_env=self.key_env, environ=environ
        )


@dataclass(frozen=True)
class MetricEmissionConfig:
    """Where metrics go: target log, messaging, cloudmon or scrape; destination local or cloud."""

    enabled: bool = True
    target: str = "log"
    interval_seconds: float = DEFAULT_METRIC_INTERVAL_SECONDS
    destination: str = "local"
    target_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class FileLoggingConfig:
    """Rotating file output."""

    enabled: bool = False
    file_path: str | None = None
    max_file_size: str = "10MB"
    backup_count: int = 5

    @property
    def max_file_size_bytes(self) -> int:
        """`max_file_size` in bytes (KB, MB, GB are powers of 1024)."""
        return parse_size(self.max_file_size)


@dataclass(frozen=True)
class LoggingConfig:
    """The logging section as the Python variant reads it; other variants' formats are ignored."""

    level: str = "INFO"
    python_format: str | None = None
    format: str = DEFAULT_PYTHON_FORMAT
    loggers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    file_logging: FileLoggingConfig = FileLoggingConfig()
    global_control: bool = False

    @property
    def json(self) -> bool:
        """True when the effective format selects the stdout JSON sink."""
        return self.format.lower() == JSON_FORMAT


@dataclass(frozen=True)
class HeartbeatConfig:
    """The periodic liveness message on the state class."""

    enabled: bool = True
    interval_seconds: float = DEFAULT_HEARTBEAT_INTERVAL_SECONDS


@dataclass(frozen=True)
class HealthConfig:
    """The probe server: resolved on/off, whether `enabled` was explicit, port and paths."""

    enabled: bool = False
    enabled_explicit: bool = False
    port: int = DEFAULT_HEALTH_PORT
    liveness_path: str = "/livez"
    readiness_path: str = "/readyz"
    startup_path: str = "/startupz"


@dataclass(frozen=True)
class ComponentConfig:
    """A validated component configuration with defaults applied and the identity built."""

    platform: Platform
    thing_name: str
    component_token: str
    component: Mapping[str, Any]
    hierarchy: HierarchyConfig
    identity_values: Mapping[str, str]
    identity: Identity
    tags: Mapping[str, str]
    topic: TopicConfig
    messaging: MessagingConfig
    credentials: CredentialsConfig | None
    metric_emission: MetricEmissionConfig
    logging: LoggingConfig
    heartbeat: HeartbeatConfig
    health: HealthConfig
    document: Mapping[str, Any] = field(repr=False)
    source: str | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        return (
            f"ComponentConfig(platform={self.platform.value}, thing={self.thing_name!r}, "
            f"component={self.component_token!r}, identity={self.identity.path!r}, "
            f"source={self.source!r})"
        )

    @property
    def topic_root(self) -> str:
        """The topic root; with includeRoot, followed by the first hierarchy value."""
        if self.topic.include_root:
            return f"{self.topic.root}/{self.identity_values[self.hierarchy.levels[0]]}"
        return self.topic.root

    def topic_base(self, instance: str | None = None) -> str:
        """``{root}/{device}/{component}[/{instance}]``, the prefix of this component's topics."""
        base = f"{self.topic_root}/{self.thing_name}/{self.component_token}"
        return base if instance is None else f"{base}/{instance}"

    def redacted(self) -> dict[str, Any]:
        """The document as it may be logged: every secret and credential field is ``***``."""
        redacted: dict[str, Any] = redact(self.document)
        return redacted

    def describe(self) -> str:
        """The redacted document as indented JSON."""
        return json.dumps(self.redacted(), indent=2, sort_keys=True)

    def secret_refs(self) -> list[tuple[str, SecretRef]]:
        """Every `$secret` reference in the document with its JSON path (nothing resolved)."""
        return find_secret_refs(self.document)

    def secrets(self, environ: Mapping[str, str] | None = None) -> VaultSecrets:
        """The resolver for `$secret` references; raises `SecretError` without a vault."""
        if self.credentials is None:
            raise SecretError("the configuration has no credentials section, so no vault")
        return self.credentials.secrets(environ)


class ReadOnlyDict(dict[str, str]):
    """A dict that refuses changes: the envelope binding reads tags only from a real dict."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("the configuration is read-only")

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __repr__(self) -> str:
        return f"ReadOnlyDict({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[type[ReadOnlyDict], tuple[dict[str, str]]]:
        return (ReadOnlyDict, (dict(self),))

    def __copy__(self) -> ReadOnlyDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ReadOnlyDict:
        return self


def parse_size(text: str) -> int:
    """Parses ``10MB``, ``512 KB``, ``1.5GB``, ``10MiB`` or a plain byte count (powers of 1024)."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    unit = match.group(2)
    return int(float(match.group(1)) * (_SIZE_UNITS[unit.upper()] if unit else 1))


def freeze(value: Any) -> Any:
    """A read-only deep copy: objects become mapping proxies, arrays tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """A plain JSON-shaped copy of a frozen value."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(item) for item in value]
    return value


def build_config(
    document: Mapping[str, Any],
    *,
    thing: str,
    platform: Platform,
    component_token: str,
    source: str | None = None,
) -> ComponentConfig:
    """Builds the model from a document that already passed `validate_document`."""
    levels = tuple(_section(document, "hierarchy").get("levels", DEFAULT_LEVELS))
    identity_section = _section(document, "identity")
    values = {level: identity_section[level] for level in levels[:-1]}
    values[levels[-1]] = thing
    identity = Identity(
        "/".join(levels), "/".join(values[level] for level in levels), component_token
    )
    topic = _section(document, "topic")
    credentials = document.get("credentials")
    return ComponentConfig(
        platform=platform,
        thing_name=thing,
        component_token=component_token,
        component=freeze(document["component"]),
        hierarchy=HierarchyConfig(levels),
        identity_values=ReadOnlyDict(values),
        identity=identity,
        tags=ReadOnlyDict(_section(document, "tags")),
        topic=TopicConfig(
            root=topic.get("root", DEFAULT_TOPIC_ROOT),
            include_root=topic.get("includeRoot", False),
        ),
        messaging=_messaging(_section(document, "messaging"), thing, component_token),
        credentials=None
        if credentials is None
        else CredentialsConfig(
            vault_path=credentials["vaultPath"],
            key_file=credentials.get("keyFile"),
            key_env=credentials.get("keyEnv", DEFAULT_KEY_ENV),
        ),
        metric_emission=_metric_emission(_section(document, "metricEmission")),
        logging=_logging(_section(document, "logging"), platform),
        heartbeat=_heartbeat(_section(document, "heartbeat")),
        health=_health(_section(document, "health"), platform),
        document=freeze(document),
        source=source,
    )


def _section(document: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = document.get(name)
    return value if isinstance(value, Mapping) else {}


def _messaging(section: Mapping[str, Any], thing: str, token: str) -> MessagingConfig:
    local = section.get("local")
    northbound = section.get("northbound")
    return MessagingConfig(
        local=None if local is None else _broker(local, "local", thing, token),
        northbound=None if northbound is None else _broker(northbound, "northbound", thing, token),
        request_timeout_seconds=float(
            section.get("requestTimeoutSeconds", DEFAULT_REQUEST_TIMEOUT_SECONDS)
        ),
    )


def _broker(block: Mapping[str, Any], role: str, thing: str, token: str) -> BrokerConfig:
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
    if credentials.ca_path is None and credentials.cert_path is not None:
        _log.warning(
            "messaging.%s.credentials: certPath and keyPath are ignored without caPath "
            "(the connection stays plaintext)",
            role,
        )
    if role == "local" and credentials.ca_path is not None and (username or password):
        _log.warning(
            "messaging.local.credentials: username and password are ignored with caPath (TLS)"
        )
    qos = block.get("qos", {})
    tls = credentials.ca_path is not None
    return BrokerConfig(
        host=block.get("host") or block["endpoint"],
        port=block.get("port", DEFAULT_MQTT_TLS_PORT if tls else DEFAULT_MQTT_PORT),
        client_id=block.get("clientId", f"{thing}-{token}"),
        qos=QosConfig(publish=qos.get("publish", 1), subscribe=qos.get("subscribe", 1)),
        credentials=credentials,
    )


def _metric_emission(section: Mapping[str, Any]) -> MetricEmissionConfig:
    target_config = dict(section.get("targetConfig", {}))
    destination = target_config.pop("destination", "local")
    return MetricEmissionConfig(
        enabled=section.get("enabled", True),
        target=section.get("target", "log"),
        interval_seconds=float(section.get("intervalSeconds", DEFAULT_METRIC_INTERVAL_SECONDS)),
        destination=destination,
        target_config=freeze(target_config),
    )


def _logging(section: Mapping[str, Any], platform: Platform) -> LoggingConfig:
    explicit = section.get("python_format")
    if explicit is not None:
        effective = explicit
    elif platform is Platform.CLUSTER:
        effective = JSON_FORMAT
    else:
        effective = DEFAULT_PYTHON_FORMAT
    files = section.get("fileLogging", {})
    loggers = {name: level.upper() for name, level in section.get("loggers", {}).items()}
    return LoggingConfig(
        level=section.get("level", "INFO").upper(),
        python_format=explicit,
        format=effective,
        loggers=ReadOnlyDict(loggers),
        file_logging=FileLoggingConfig(
            enabled=files.get("enabled", False),
            file_path=files.get("filePath"),
            max_file_size=files.get("maxFileSize", "10MB"),
            backup_count=files.get("backupCount", 5),
        ),
        global_control=section.get("globalControl", False),
    )


def _heartbeat(section: Mapping[str, Any]) -> HeartbeatConfig:
    return HeartbeatConfig(
        enabled=section.get("enabled", True),
        interval_seconds=float(section.get("intervalSeconds", DEFAULT_HEARTBEAT_INTERVAL_SECONDS)),
    )


def _health(section: Mapping[str, Any], platform: Platform) -> HealthConfig:
    explicit = section.get("enabled")
    return HealthConfig(
        enabled=explicit if explicit is not None else platform is Platform.CLUSTER,
        enabled_explicit=explicit is not None,
        port=section.get("port", DEFAULT_HEALTH_PORT),
        liveness_path=section.get("livenessPath", "/livez"),
        readiness_path=section.get("readinessPath", "/readyz"),
        startup_path=section.get("startupPath", "/startupz"),
    )
