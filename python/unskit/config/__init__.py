"""Component configuration: sources and platforms, schemas, `$secret` references and the vault.

`load_config` (or a `ConfigLoader`) reads the document from the platform's source, validates
it against the JSON Schemas in ``schemas/`` and returns a frozen `ComponentConfig`; a
`ConfigError` lists every broken rule with its JSON path before anything starts.
"""

from unskit.config.loader import (
    CONFIG_ENV,
    CONFIG_SOURCE_ENV,
    THING_ENV_VARS,
    ConfigLoader,
    add_config_arguments,
    load_config,
    resolve_config,
    resolve_thing_name,
)
from unskit.config.model import (
    BrokerConfig,
    BrokerCredentials,
    ComponentConfig,
    CredentialsConfig,
    FileLoggingConfig,
    HealthConfig,
    HeartbeatConfig,
    HierarchyConfig,
    LoggingConfig,
    MessagingConfig,
    MetricEmissionConfig,
    MetricTarget,
    QosConfig,
    TopicConfig,
)
from unskit.config.platform import PLATFORM_ENV, Platform, detect_platform
from unskit.config.schema import load_schema, validate_document, validate_with_schema
from unskit.config.secrets import (
    Secret,
    SecretRef,
    SecretResolver,
    find_secret_refs,
    redact,
    resolve_value,
)
from unskit.config.sources import (
    ConfigProvider,
    ConfigSource,
    FileConfigProvider,
    FileSource,
    MountedDirSource,
    RuntimeConfigSource,
    SourceKind,
    open_source,
    parse_document,
    source_kind_for,
)
from unskit.config.vault import Vault, VaultKey, VaultSecrets

__all__ = [
    "CONFIG_ENV",
    "CONFIG_SOURCE_ENV",
    "PLATFORM_ENV",
    "THING_ENV_VARS",
    "BrokerConfig",
    "BrokerCredentials",
    "ComponentConfig",
    "ConfigLoader",
    "ConfigProvider",
    "ConfigSource",
    "CredentialsConfig",
    "FileConfigProvider",
    "FileLoggingConfig",
    "FileSource",
    "HealthConfig",
    "HeartbeatConfig",
    "HierarchyConfig",
    "LoggingConfig",
    "MessagingConfig",
    "MetricEmissionConfig",
    "MetricTarget",
    "MountedDirSource",
    "Platform",
    "QosConfig",
    "RuntimeConfigSource",
    "Secret",
    "SecretRef",
    "SecretResolver",
    "SourceKind",
    "TopicConfig",
    "Vault",
    "VaultKey",
    "VaultSecrets",
    "add_config_arguments",
    "detect_platform",
    "find_secret_refs",
    "load_config",
    "load_schema",
    "open_source",
    "parse_document",
    "redact",
    "resolve_config",
    "resolve_thing_name",
    "resolve_value",
    "source_kind_for",
    "validate_document",
    "validate_with_schema",
]
