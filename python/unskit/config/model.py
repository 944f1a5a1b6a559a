"""The resolved configuration: typed, frozen sections with every default applied.

`build_config` turns a document that already passed validation into a `ComponentConfig`;
`unskit.config.loader` is the entry point that validates first. `ComponentConfig` satisfies
`unskit.envelope.EnvelopeStamp`, so it can be handed to a `MessageBuilder` as it is.

The sections with more to them live beside this module: ``messaging`` in
`unskit.config.messaging`, ``health``, ``logging`` and ``metricEmission`` in
`unskit.config.observability`, the defaults in `unskit.config.values`; every name stays
importable from here. Who checks what (the schema, `unskit.config.rules`, the types
themselves) is written down in `unskit.config.schema`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from unskit.config.messaging import (
    BrokerConfig,
    BrokerCredentials,
    MessagingConfig,
    QosConfig,
    messaging_from_section,
)
from unskit.config.observability import (
    FileLoggingConfig,
    HealthConfig,
    LoggingConfig,
    MetricEmissionConfig,
    MetricTarget,
    profile_health_enabled,
)
from unskit.config.platform import Platform
from unskit.config.schema import _SectionError
from unskit.config.secrets import SecretRef, find_secret_refs, redact
from unskit.config.values import (
    DEFAULT_BACKUP_COUNT,
    DEFAULT_CLOUDMON_NAMESPACE,
    DEFAULT_EMBEDDED_PORT,
    DEFAULT_HEALTH_PORT,
    DEFAULT_HEARTBEAT_INTERVAL_SECONDS,
    DEFAULT_LEVEL,
    DEFAULT_LEVELS,
    DEFAULT_LIBRARY_LEVEL,
    DEFAULT_MAX_FILE_SIZE,
    DEFAULT_METRIC_INTERVAL_SECONDS,
    DEFAULT_MQTT_PORT,
    DEFAULT_MQTT_TLS_PORT,
    DEFAULT_PYTHON_FORMAT,
    DEFAULT_REQUEST_TIMEOUT_SECONDS,
    DEFAULT_SCRAPE_HOST,
    DEFAULT_SCRAPE_PATH,
    DEFAULT_SCRAPE_PORT,
    DEFAULT_TOPIC_ROOT,
    EMBEDDED_HOST,
    JSON_FORMAT,
    log_level,
    parse_size,
)
from unskit.config.vault import DEFAULT_KEY_ENV, VaultSecrets
from unskit.envelope import Identity
from unskit.errors import ConfigError, SecretError
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
    # The inbox's own defaults (unskit.commands MAX_BODY_BYTES, MAX_BODY_DEPTH): the
    # configuration sits below the inbox and does not import it.
    max_body_bytes: int = 64 * 1024
    max_body_depth: int = 20

    def store_path(self, thing: str, component: str) -> Path:
        """``{stateDir}/{thing}/{component}/commands.journal``; the state directory defaults
        to $UNSKIT_STATE_DIR, else $XDG_STATE_HOME/unskit, else ~/.local/state/unskit."""
        if self.state_dir is not None:
            base = Path(self.state_dir)
        elif os.environ.get("UNSKIT_STATE_DIR"):
            base = Path(os.environ["UNSKIT_STATE_DIR"])
        elif os.environ.get("XDG_STATE_HOME"):
            base = Path(os.environ["XDG_STATE_HOME"]) / "unskit"
        else:
            base = Path.home() / ".local" / "state" / "unskit"
        return base / thing / component / "commands.journal"


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
    commands = _commands(_section(document, "commands"))
    try:
        metric_emission = MetricEmissionConfig.from_section(document.get("metricEmission"))
        logging_config = LoggingConfig.from_section(document.get("logging"), platform)
        health = HealthConfig.from_section(document.get("health"))
    except _SectionError as exc:
        # Only a document that skipped validation gets here; it still fails as a document.
        raise ConfigError(exc.issues, source=source) from None
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
        messaging=messaging_from_section(
            # On the edge runtime the section may be absent: the local link is then IPC.
            document.get("messaging") or {},
            thing,
            component_token,
            state_dir=commands.store_path(thing, component_token).parent,
            durable_sync=commands.durable_sync,
            edge_runtime=platform is Platform.EDGE_RUNTIME,
        ),
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
        commands=commands,
        health=health,
        document=freeze(document),
        source=source,
    )


def _section(document: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = document.get(name)
    return value if isinstance(value, Mapping) else {}


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
        max_body_bytes=section.get("maxBodyBytes", defaults.max_body_bytes),
        max_body_depth=section.get("maxBodyDepth", defaults.max_body_depth),
    )


def _heartbeat(section: Mapping[str, Any]) -> HeartbeatConfig:
    return HeartbeatConfig(
        enabled=section.get("enabled", True),
        interval_seconds=float(section.get("intervalSeconds", DEFAULT_HEARTBEAT_INTERVAL_SECONDS)),
    )
