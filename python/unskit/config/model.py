"""The resolved configuration: typed, frozen sections with every default applied.

`build_config` turns a document that already passed validation into a `ComponentConfig`;
`unskit.config.loader` is the entry point that validates first. `ComponentConfig` satisfies
`unskit.envelope.EnvelopeStamp`, so it can be handed to a `MessageBuilder` as it is.

This module is the one place the ``health``, ``logging`` and ``metricEmission`` sections
become typed objects: `HealthConfig`, `LoggingConfig` and `MetricEmissionConfig`, each with a
`from_section` parser that `build_config` uses too; ``unskit.runtime`` acts on them. They
check their values themselves, for programmatic use (a bad one raises ValueError naming its
key); documents are validated by the JSON Schema before they get here.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeGuard

from unskit.config.platform import Platform
from unskit.config.secrets import Secret, SecretRef, find_secret_refs, redact
from unskit.config.vault import DEFAULT_KEY_ENV, VaultSecrets
from unskit.envelope import Identity
from unskit.errors import ConfigError, ConfigIssue, SecretError
from unskit.topics import TopicScope

__all__ = [
    "DEFAULT_BACKUP_COUNT",
    "DEFAULT_CLOUDMON_NAMESPACE",
    "DEFAULT_EMBEDDED_PORT",
    "DEFAULT_HEALTH_PORT",
    "DEFAULT_LEVEL",
    "DEFAULT_LEVELS",
    "DEFAULT_LIBRARY_LEVEL",
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_METRIC_INTERVAL_SECONDS",
    "DEFAULT_MQTT_PORT",
    "DEFAULT_MQTT_TLS_PORT",
    "DEFAULT_PYTHON_FORMAT",
    "DEFAULT_REQUEST_TIMEOUT_SECONDS",
    "DEFAULT_SCRAPE_HOST",
    "DEFAULT_SCRAPE_PATH",
    "DEFAULT_SCRAPE_PORT",
    "DEFAULT_TOPIC_ROOT",
    "EMBEDDED_HOST",
    "JSON_FORMAT",
    "BrokerConfig",
    "BrokerCredentials",
    "CommandsConfig",
    "ComponentConfig",
    "CredentialsConfig",
    "FileLoggingConfig",
    "HealthConfig",
    "HeartbeatConfig",
    "HierarchyConfig",
    "LoggingConfig",
    "MessagingConfig",
    "MetricEmissionConfig",
    "MetricTarget",
    "QosConfig",
    "TopicConfig",
    "build_config",
    "freeze",
    "log_level",
    "parse_size",
    "profile_health_enabled",
    "thaw",
]

_log = logging.getLogger(__name__)

DEFAULT_LEVELS = ("device",)
DEFAULT_TOPIC_ROOT = "uns"
DEFAULT_REQUEST_TIMEOUT_SECONDS = 30.0
DEFAULT_MQTT_PORT = 1883
DEFAULT_MQTT_TLS_PORT = 8883
EMBEDDED_HOST = "embedded"
# The embedded broker's port when `--broker embedded` names none.
DEFAULT_EMBEDDED_PORT = 1883
DEFAULT_HEARTBEAT_INTERVAL_SECONDS = 60.0

DEFAULT_HEALTH_PORT = 8081
_DEFAULT_LIVENESS_PATH = "/livez"
_DEFAULT_READINESS_PATH = "/readyz"
_DEFAULT_STARTUP_PATH = "/startupz"
_HEALTH_KEYS = frozenset({"enabled", "port", "livenessPath", "readinessPath", "startupPath"})

DEFAULT_LEVEL = "INFO"
# Third-party libraries (the embedded broker, the PLC and transfer SDKs) are chatty at INFO.
DEFAULT_LIBRARY_LEVEL = "WARNING"
JSON_FORMAT = "json"
DEFAULT_PYTHON_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"
DEFAULT_MAX_FILE_SIZE = "10MB"
DEFAULT_BACKUP_COUNT = 5
# The configuration schema is shared by four variants, so a level another variant knows
# (Java's TRACE and OFF, log4j's WARN and FATAL) is mapped to the nearest Python level
# rather than refused.
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
    "CRITICAL": logging.CRITICAL,
    "OFF": logging.CRITICAL + 10,
}
# Units are binary, as log4j2's size-based policy reads them for the Java variant.
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([KMGT])I?B?|B)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

DEFAULT_METRIC_INTERVAL_SECONDS = 60.0
# Any address, as the probe server binds: a cluster scraper reaches the pod address.
DEFAULT_SCRAPE_HOST = "0.0.0.0"
# The port Prometheus' registry of exporter ports assigns to OpenTelemetry's exporter, the
# generic "application metrics" choice.
DEFAULT_SCRAPE_PORT = 9464
DEFAULT_SCRAPE_PATH = "/metrics"
DEFAULT_CLOUDMON_NAMESPACE = "unskit"
_DESTINATIONS = ("local", "cloud")


class _SectionError(ValueError):
    """A section value that breaks a rule; `key` is its dotted place (``health.port``)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def parse_size(value: object, key: str = "logging.fileLogging.maxFileSize") -> int:
    """Parses ``10MB``, ``512 KB``, ``1.5GB``, ``10MiB`` or a byte count (powers of 1024).

    Any shape the schema's ``maxFileSize`` pattern admits parses, ``0`` included: whether a
    size of 0 is allowed is the caller's rule. A bad value raises ValueError naming `key`.
    """
    if _is_int(value) and value >= 0:
        return value
    if isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        unit = match.group(2)
        return int(float(match.group(1)) * (_SIZE_UNITS[unit.upper()] if unit else 1))
    raise _SectionError(key, f"{value!r} is not a size such as 10MB, 512KB or 1GB")


def log_level(name: str) -> int:
    """The standard library's level for a level name of any variant (TRACE, WARN, FATAL, OFF)."""
    return _LEVELS[_level_name(name, "level")]


def _level_name(value: object, key: str) -> str:
    """The upper-cased level name, or ValueError naming `key`."""
    if isinstance(value, str) and value.strip().upper() in _LEVELS:
        return value.strip().upper()
    raise _SectionError(key, f"{value!r} is not a level ({', '.join(_LEVELS)})")


def _object(value: object, key: str) -> Mapping[str, Any]:
    """A section or block: None is an empty one, anything else but an object is refused."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _SectionError(key, "must be an object")
    return value


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, and `true` where a number belongs is a typo.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_port(value: object) -> bool:
    return _is_int(value) and 0 <= value <= 65535


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
    #: Topic prefixes replies may go to besides ``lib/reply-`` (replyTopicPrefixes).
    reply_topic_prefixes: tuple[str, ...] = ()

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


class MetricTarget(str, enum.Enum):
    """The ``metricEmission.target`` values."""

    LOG = "log"
    MESSAGING = "messaging"
    CLOUDMON = "cloudmon"
    SCRAPE = "scrape"


@dataclass(frozen=True)
class MetricEmissionConfig:
    """The ``metricEmission`` section: whether, where and how often metrics are emitted.

    `target` selects the emitter; of ``targetConfig``, `destination` (local or cloud) is read by
    the messaging target, `host`, `port` and `path` by scrape, `namespace` by cloudmon. A
    value that breaks a rule raises ValueError naming its key.
    """

    enabled: bool = True
    target: MetricTarget = MetricTarget.LOG
    interval_seconds: float = DEFAULT_METRIC_INTERVAL_SECONDS
    destination: str = "local"
    host: str = DEFAULT_SCRAPE_HOST
    port: int = DEFAULT_SCRAPE_PORT
    path: str = DEFAULT_SCRAPE_PATH
    namespace: str = DEFAULT_CLOUDMON_NAMESPACE

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise _SectionError("metricEmission.enabled", "must be a boolean")
        try:
            object.__setattr__(self, "target", MetricTarget(self.target))
        except ValueError:
            names = ", ".join(t.value for t in MetricTarget)
            raise _SectionError(
                "metricEmission.target", f"{self.target!r} is not one of {names}"
            ) from None
        interval = self.interval_seconds
        if not _is_number(interval) or not math.isfinite(interval) or interval <= 0:
            raise _SectionError(
                "metricEmission.intervalSeconds", f"{interval!r} must be a number > 0"
            )
        object.__setattr__(self, "interval_seconds", float(interval))
        if self.destination not in _DESTINATIONS:
            raise _SectionError(
                "metricEmission.targetConfig.destination",
                f"{self.destination!r} is not local or cloud",
            )
        if not isinstance(self.host, str) or not self.host:
            raise _SectionError("metricEmission.targetConfig.host", "must be a non-empty string")
        if not _is_port(self.port):
            raise _SectionError(
                "metricEmission.targetConfig.port", "must be an integer from 0 to 65535"
            )
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise _SectionError(
                "metricEmission.targetConfig.path", "must be a string starting with /"
            )
        if not isinstance(self.namespace, str) or not self.namespace:
            raise _SectionError(
                "metricEmission.targetConfig.namespace", "must be a non-empty string"
            )

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> MetricEmissionConfig:
        """Parses the ``metricEmission`` section; None means all defaults."""
        section = _object(section, "metricEmission")
        options = _object(section.get("targetConfig"), "metricEmission.targetConfig")
        if "topic" in options:
            raise _SectionError(
                "metricEmission.targetConfig.topic",
                "is not allowed: the library mints the metric topic; use "
                "targetConfig.destination (local or cloud)",
            )
        return cls(
            enabled=section.get("enabled", True),
            target=section.get("target", MetricTarget.LOG),
            interval_seconds=section.get("intervalSeconds", DEFAULT_METRIC_INTERVAL_SECONDS),
            destination=options.get("destination", "local"),
            host=options.get("host", DEFAULT_SCRAPE_HOST),
            port=options.get("port", DEFAULT_SCRAPE_PORT),
            path=options.get("path", DEFAULT_SCRAPE_PATH),
            namespace=options.get("namespace", DEFAULT_CLOUDMON_NAMESPACE),
        )


@dataclass(frozen=True)
class FileLoggingConfig:
    """Rotating file output (``logging.fileLogging``); `max_file_size` is in bytes."""

    enabled: bool = False
    file_path: str | None = None
    max_file_size: int = parse_size(DEFAULT_MAX_FILE_SIZE)
    backup_count: int = DEFAULT_BACKUP_COUNT

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise _SectionError("logging.fileLogging.enabled", "must be a boolean")
        if self.file_path is not None and (
            not isinstance(self.file_path, str) or not self.file_path
        ):
            raise _SectionError("logging.fileLogging.filePath", "must be a non-empty string")
        if self.enabled and self.file_path is None:
            raise _SectionError(
                "logging.fileLogging.filePath", "is required when fileLogging is enabled"
            )
        # RotatingFileHandler never rotates at 0, which would make the limit a silent no-op.
        if not _is_int(self.max_file_size) or self.max_file_size <= 0:
            raise _SectionError(
                "logging.fileLogging.maxFileSize",
                f"{self.max_file_size!r} must be greater than zero (a file never rotates at 0)",
            )
        # At 0 RotatingFileHandler reopens the same file on rollover and it grows without bound.
        if not _is_int(self.backup_count) or self.backup_count < 1:
            raise _SectionError(
                "logging.fileLogging.backupCount", f"{self.backup_count!r} must be at least 1"
            )

    @classmethod
    def from_section(cls, block: Mapping[str, Any] | None) -> FileLoggingConfig:
        """Parses the ``logging.fileLogging`` block; None means all defaults."""
        block = _object(block, "logging.fileLogging")
        return cls(
            enabled=block.get("enabled", False),
            file_path=block.get("filePath"),
            max_file_size=parse_size(block.get("maxFileSize", DEFAULT_MAX_FILE_SIZE)),
            backup_count=block.get("backupCount", DEFAULT_BACKUP_COUNT),
        )


@dataclass(frozen=True)
class LoggingConfig:
    """The ``logging`` section as the Python variant reads it, the effective format resolved.

    `format` is the effective format: an explicit ``python_format``, else the platform's
    default (``json`` on CLUSTER), else `DEFAULT_PYTHON_FORMAT`; ``json`` (any case) selects
    the stdout JSON sink. `level`, `library_level` and the `loggers` values are level names,
    upper-cased (`log_level` gives the standard library's number). `library_level`
    (``libraryLevel``) is the level of the third-party loggers that `loggers` does not name,
    None for the default (`effective_library_level`). ``java_format``, ``rust_format`` and
    ``ts_format`` belong to the other variants and are ignored. A value that breaks a rule
    raises ValueError naming its key.
    """

    level: str = DEFAULT_LEVEL
    format: str = DEFAULT_PYTHON_FORMAT
    loggers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    file_logging: FileLoggingConfig = FileLoggingConfig()
    global_control: bool = False
    library_level: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", _level_name(self.level, "logging.level"))
        if self.library_level is not None:
            object.__setattr__(
                self, "library_level", _level_name(self.library_level, "logging.libraryLevel")
            )
        if not isinstance(self.format, str) or not self.format.strip():
            raise _SectionError("logging.python_format", "must be a non-empty string")
        if not self.json:
            try:
                logging.Formatter(self.format, validate=True)
            except ValueError as exc:
                raise _SectionError("logging.python_format", str(exc)) from None
        if not isinstance(self.loggers, Mapping):
            raise _SectionError(
                "logging.loggers", "must be an object mapping logger names to levels"
            )
        loggers = {}
        for name, value in self.loggers.items():
            if not isinstance(name, str) or not name:
                raise _SectionError(
                    "logging.loggers", f"logger name {name!r} must be a non-empty string"
                )
            loggers[name] = _level_name(value, f"logging.loggers.{name}")
        object.__setattr__(self, "loggers", MappingProxyType(loggers))
        if not isinstance(self.file_logging, FileLoggingConfig):
            raise _SectionError("logging.fileLogging", "must be a FileLoggingConfig")
        if not isinstance(self.global_control, bool):
            raise _SectionError("logging.globalControl", "must be a boolean")

    @classmethod
    def from_section(
        cls, section: Mapping[str, Any] | None, platform: Platform | None = None
    ) -> LoggingConfig:
        """Parses the ``logging`` section; None means all defaults (for `platform`)."""
        section = _object(section, "logging")
        effective = section.get("python_format")
        if effective is None:
            effective = JSON_FORMAT if platform is Platform.CLUSTER else DEFAULT_PYTHON_FORMAT
        loggers = section.get("loggers")
        return cls(
            level=section.get("level", DEFAULT_LEVEL),
            format=effective,
            loggers={} if loggers is None else loggers,
            file_logging=FileLoggingConfig.from_section(section.get("fileLogging")),
            global_control=section.get("globalControl", False),
            library_level=section.get("libraryLevel"),
        )

    @property
    def effective_library_level(self) -> str:
        """`library_level` when given, else WARNING or the root `level` if that is higher,
        so that ``level: ERROR`` quiets the libraries too."""
        if self.library_level is not None:
            return self.library_level
        return max(DEFAULT_LIBRARY_LEVEL, self.level, key=log_level)

    @property
    def json(self) -> bool:
        """True when the effective format selects the stdout JSON sink."""
        return self.format.strip().lower() == JSON_FORMAT


@dataclass(frozen=True)
class HeartbeatConfig:
    """The periodic liveness message on the state class."""

    enabled: bool = True
    interval_seconds: float = DEFAULT_HEARTBEAT_INTERVAL_SECONDS


@dataclass(frozen=True)
class CommandsConfig:
    """The ``commands`` section: where the inbox keeps idempotency records, and its bounds."""

    state_dir: str | None = None
    max_concurrency: int = 8
    max_queued: int = 1000
    idempotency_retention_hours: float = 24.0
    max_idempotency_records: int = 100_000
    cursor_ttl_seconds: float = 300.0
    durable_sync: bool = False

    def store_path(self, thing: str, component: str) -> Path:
        """``{stateDir}/{thing}/{component}/commands.sqlite3``; the state directory defaults
        to $UNSKIT_STATE_DIR, else $XDG_STATE_HOME/unskit, else ~/.local/state/unskit."""
        if self.state_dir is not None:
            base = Path(self.state_dir)
        elif os.environ.get("UNSKIT_STATE_DIR"):
            base = Path(os.environ["UNSKIT_STATE_DIR"])
        elif os.environ.get("XDG_STATE_HOME"):
            base = Path(os.environ["XDG_STATE_HOME"]) / "unskit"
        else:
            base = Path.home() / ".local" / "state" / "unskit"
        return base / thing / component / "commands.sqlite3"


def profile_health_enabled(platform: Platform | None) -> bool:
    """The platform default for the probe server: on for CLUSTER only."""
    return platform is Platform.CLUSTER


@dataclass(frozen=True)
class HealthConfig:
    """The ``health`` section; `enabled` is tri-state (None = use the platform default).

    `enabled_for(platform)` resolves it; `ComponentConfig.health_enabled` does so for the
    component's own platform. A value that breaks a rule raises ValueError naming its key.
    """

    enabled: bool | None = None
    port: int = DEFAULT_HEALTH_PORT
    liveness_path: str = _DEFAULT_LIVENESS_PATH
    readiness_path: str = _DEFAULT_READINESS_PATH
    startup_path: str = _DEFAULT_STARTUP_PATH

    def __post_init__(self) -> None:
        if self.enabled is not None and not isinstance(self.enabled, bool):
            raise _SectionError("health.enabled", f"must be a boolean, got {self.enabled!r}")
        # bool is an int subclass; `port: true` is a typo, not port 1.
        if not _is_int(self.port):
            raise _SectionError("health.port", f"must be an integer, got {self.port!r}")
        if not _is_port(self.port):
            raise _SectionError("health.port", f"must be within 0..65535, got {self.port}")
        paths = {
            "livenessPath": self.liveness_path,
            "readinessPath": self.readiness_path,
            "startupPath": self.startup_path,
        }
        for key, path in paths.items():
            if not isinstance(path, str) or not path.startswith("/") or "?" in path:
                raise _SectionError(
                    f"health.{key}", f"must be a path starting with '/', got {path!r}"
                )
        # Two probes on one path would make one of them unreachable.
        if len(set(paths.values())) != len(paths):
            raise _SectionError(
                "health", f"probe paths must be distinct, got {sorted(paths.values())}"
            )

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> HealthConfig:
        """Parses the ``health`` section; None means all defaults."""
        section = _object(section, "health")
        unknown = sorted(set(section) - _HEALTH_KEYS)
        if unknown:
            raise _SectionError("health", f"unknown key(s): {', '.join(map(str, unknown))}")
        return cls(
            enabled=section.get("enabled"),
            port=section.get("port", DEFAULT_HEALTH_PORT),
            liveness_path=section.get("livenessPath", _DEFAULT_LIVENESS_PATH),
            readiness_path=section.get("readinessPath", _DEFAULT_READINESS_PATH),
            startup_path=section.get("startupPath", _DEFAULT_STARTUP_PATH),
        )

    @property
    def enabled_explicitly_set(self) -> bool:
        """True when the section gave `enabled` (either way)."""
        return self.enabled is not None

    def enabled_for(self, platform: Platform | None) -> bool:
        """The resolved on/off: an explicit `enabled` wins, else the platform default."""
        if self.enabled is not None:
            return self.enabled
        return profile_health_enabled(platform)


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
    commands: CommandsConfig
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
    def health_enabled(self) -> bool:
        """Whether the probe server runs: `health.enabled`, else this platform's default."""
        return self.health.enabled_for(self.platform)

    @property
    def topics(self) -> TopicScope:
        """This component's topics; with includeRoot, the first hierarchy value follows the
        root."""
        root_level = None
        if self.topic.include_root:
            root_level = self.identity_values[self.hierarchy.levels[0]]
        return TopicScope(
            self.topic.root, self.thing_name, self.component_token, root_level=root_level
        )

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
    try:
        metric_emission = MetricEmissionConfig.from_section(document.get("metricEmission"))
        logging_config = LoggingConfig.from_section(document.get("logging"), platform)
        health = HealthConfig.from_section(document.get("health"))
    except _SectionError as exc:
        # The schema admits a few values these sections refuse (fileLogging.backupCount 0).
        raise ConfigError([ConfigIssue(f"$.{exc.key}", exc.reason)], source=source) from None
    return ComponentConfig(
        platform=platform,
        thing_name=thing,
        component_token=component_token,
        component=freeze(document["component"]),
        hierarchy=HierarchyConfig(levels),
        identity_values=MappingProxyType(values),
        identity=identity,
        tags=MappingProxyType(dict(_section(document, "tags"))),
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
        metric_emission=metric_emission,
        logging=logging_config,
        heartbeat=_heartbeat(_section(document, "heartbeat")),
        commands=_commands(_section(document, "commands")),
        health=health,
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
        reply_topic_prefixes=tuple(section.get("replyTopicPrefixes", ())),
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


def _commands(section: Mapping[str, Any]) -> CommandsConfig:
    defaults = CommandsConfig()
    return CommandsConfig(
        state_dir=section.get("stateDir"),
        max_concurrency=section.get("maxConcurrency", defaults.max_concurrency),
        max_queued=section.get("maxQueued", defaults.max_queued),
        idempotency_retention_hours=float(
            section.get("idempotencyRetentionHours", defaults.idempotency_retention_hours)
        ),
        max_idempotency_records=section.get(
            "maxIdempotencyRecords", defaults.max_idempotency_records
        ),
        cursor_ttl_seconds=float(section.get("cursorTtlSeconds", defaults.cursor_ttl_seconds)),
        durable_sync=section.get("durableSync", defaults.durable_sync),
    )


def _heartbeat(section: Mapping[str, Any]) -> HeartbeatConfig:
    return HeartbeatConfig(
        enabled=section.get("enabled", True),
        interval_seconds=float(section.get("intervalSeconds", DEFAULT_HEARTBEAT_INTERVAL_SECONDS)),
    )
