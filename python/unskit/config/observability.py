"""The ``health``, ``logging`` and ``metricEmission`` sections, typed; ``unskit.runtime`` acts
on them.

Each type has a `from_section` parser, which `build_config` uses too, and checks itself when
built, so code that builds one directly is held to the rules a document is: the section is
checked against its part of the framework schema and its rules in `unskit.config.rules`
(`unskit.config.schema.check_section`); a value that breaks one raises ValueError naming its
key (``health.port: must be <= 65535``). The only checks written here are about Python
forms a document cannot have (a byte count for ``maxFileSize``, non-string logger names).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from unskit.config.platform import Platform
from unskit.config.schema import _SectionError, check_section
from unskit.config.values import (
    DEFAULT_BACKUP_COUNT,
    DEFAULT_CLOUDMON_NAMESPACE,
    DEFAULT_HEALTH_PORT,
    DEFAULT_LEVEL,
    DEFAULT_LIBRARY_LEVEL,
    DEFAULT_LIVENESS_PATH,
    DEFAULT_MAX_FILE_SIZE,
    DEFAULT_METRIC_INTERVAL_SECONDS,
    DEFAULT_PYTHON_FORMAT,
    DEFAULT_READINESS_PATH,
    DEFAULT_SCRAPE_HOST,
    DEFAULT_SCRAPE_PATH,
    DEFAULT_SCRAPE_PORT,
    DEFAULT_STARTUP_PATH,
    JSON_FORMAT,
    log_level,
    parse_size,
)
from unskit.errors import ConfigIssue

__all__ = [
    "FileLoggingConfig",
    "HealthConfig",
    "LoggingConfig",
    "MetricEmissionConfig",
    "MetricTarget",
    "profile_health_enabled",
]


def _section(section: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """None is an empty section; anything else has passed `check_section`."""
    return {} if section is None else section


class MetricTarget(str, enum.Enum):
    """The ``metricEmission.target`` values."""

    LOG = "log"
    MESSAGING = "messaging"
    CLOUDMON = "cloudmon"
    SCRAPE = "scrape"


@dataclass(frozen=True)
class MetricEmissionConfig:
    """The ``metricEmission`` section: whether, where and how often metrics are emitted.

    `target` selects the emitter (a `MetricTarget` or its name); of ``targetConfig``,
    `destination` (local or cloud) is read by the messaging target, `host`, `port` and
    `path` by scrape, `namespace` by cloudmon.
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
        target = self.target.value if isinstance(self.target, MetricTarget) else self.target
        options = {
            "destination": self.destination,
            "host": self.host,
            "port": self.port,
            "path": self.path,
            "namespace": self.namespace,
        }
        check_section(
            "metricEmission",
            {
                "enabled": self.enabled,
                "target": target,
                "intervalSeconds": self.interval_seconds,
                "targetConfig": options,
            },
        )
        object.__setattr__(self, "target", MetricTarget(target))
        object.__setattr__(self, "interval_seconds", float(self.interval_seconds))

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> MetricEmissionConfig:
        """Parses the ``metricEmission`` section; None means all defaults."""
        check_section("metricEmission", _section(section))
        section = _section(section)
        options = section.get("targetConfig") or {}
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
        size = self.max_file_size
        # A document gives a size as text ("10MB"); here it is a byte count.
        if not isinstance(size, int) or isinstance(size, bool):
            path = "$.logging.fileLogging.maxFileSize"
            raise _SectionError([ConfigIssue(path, "must be a whole number of bytes")])
        block: dict[str, Any] = {
            "enabled": self.enabled,
            "maxFileSize": str(size),
            "backupCount": self.backup_count,
        }
        if self.file_path is not None:
            block["filePath"] = self.file_path
        check_section("logging", {"fileLogging": block})

    @classmethod
    def from_section(cls, block: Mapping[str, Any] | None) -> FileLoggingConfig:
        """Parses the ``logging.fileLogging`` block; None means all defaults."""
        check_section("logging", {"fileLogging": _section(block)})
        block = _section(block)
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
    ``ts_format`` belong to the other variants and are ignored.
    """

    level: str = DEFAULT_LEVEL
    format: str = DEFAULT_PYTHON_FORMAT
    loggers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    file_logging: FileLoggingConfig = field(default_factory=FileLoggingConfig)
    global_control: bool = False
    library_level: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.file_logging, FileLoggingConfig):
            path = "$.logging.fileLogging"
            raise _SectionError([ConfigIssue(path, "must be a FileLoggingConfig")])
        loggers = self.loggers
        if isinstance(loggers, Mapping):
            # A document's keys are always strings; a dict built in code may hold others.
            if not all(isinstance(name, str) for name in loggers):
                path = "$.logging.loggers"
                raise _SectionError([ConfigIssue(path, "logger names must be strings")])
            loggers = dict(loggers)
        section: dict[str, Any] = {
            "level": self.level,
            "python_format": self.format,
            "loggers": loggers,
            "globalControl": self.global_control,
        }
        if self.library_level is not None:
            section["libraryLevel"] = self.library_level
        check_section("logging", section)
        object.__setattr__(self, "level", self.level.upper())
        if self.library_level is not None:
            object.__setattr__(self, "library_level", self.library_level.upper())
        upper = {name: level.upper() for name, level in self.loggers.items()}
        object.__setattr__(self, "loggers", MappingProxyType(upper))

    @classmethod
    def from_section(
        cls, section: Mapping[str, Any] | None, platform: Platform | None = None
    ) -> LoggingConfig:
        """Parses the ``logging`` section; None means all defaults (for `platform`)."""
        check_section("logging", _section(section))
        section = _section(section)
        effective = section.get("python_format")
        if effective is None:
            effective = JSON_FORMAT if platform is Platform.CLUSTER else DEFAULT_PYTHON_FORMAT
        return cls(
            level=section.get("level", DEFAULT_LEVEL),
            format=effective,
            loggers=section.get("loggers") or {},
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


def profile_health_enabled(platform: Platform | None) -> bool:
    """The platform default for the probe server: on for CLUSTER only."""
    return platform is Platform.CLUSTER


@dataclass(frozen=True)
class HealthConfig:
    """The ``health`` section; `enabled` is tri-state (None = use the platform default).

    `enabled_for(platform)` resolves it; `ComponentConfig.health_enabled` does so for the
    component's own platform.
    """

    enabled: bool | None = None
    port: int = DEFAULT_HEALTH_PORT
    liveness_path: str = DEFAULT_LIVENESS_PATH
    readiness_path: str = DEFAULT_READINESS_PATH
    startup_path: str = DEFAULT_STARTUP_PATH

    def __post_init__(self) -> None:
        section: dict[str, Any] = {
            "port": self.port,
            "livenessPath": self.liveness_path,
            "readinessPath": self.readiness_path,
            "startupPath": self.startup_path,
        }
        if self.enabled is not None:
            section["enabled"] = self.enabled
        check_section("health", section)

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> HealthConfig:
        """Parses the ``health`` section; None means all defaults."""
        check_section("health", _section(section))
        section = _section(section)
        return cls(
            enabled=section.get("enabled"),
            port=section.get("port", DEFAULT_HEALTH_PORT),
            liveness_path=section.get("livenessPath", DEFAULT_LIVENESS_PATH),
            readiness_path=section.get("readinessPath", DEFAULT_READINESS_PATH),
            startup_path=section.get("startupPath", DEFAULT_STARTUP_PATH),
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
