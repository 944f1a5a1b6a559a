"""The framework sections' defaults, as docs/configuration.md lists them, and the value forms
they share: sizes (`parse_size`) and level names of any variant (`log_level`).

Nothing here checks a document: that is the schema's and `unskit.config.rules`' work. This
module imports nothing of the package, so both (and the typed sections) can use it.
"""

from __future__ import annotations

import logging
import re

__all__ = [
    "DEFAULT_BACKUP_COUNT",
    "DEFAULT_CLOUDMON_NAMESPACE",
    "DEFAULT_EMBEDDED_PORT",
    "DEFAULT_HEALTH_PORT",
    "DEFAULT_HEARTBEAT_INTERVAL_SECONDS",
    "DEFAULT_KEEPALIVE_SECONDS",
    "DEFAULT_LEVEL",
    "DEFAULT_LEVELS",
    "DEFAULT_LIBRARY_LEVEL",
    "DEFAULT_LIVENESS_PATH",
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_METRIC_INTERVAL_SECONDS",
    "DEFAULT_MQTT_PORT",
    "DEFAULT_MQTT_TLS_PORT",
    "DEFAULT_PYTHON_FORMAT",
    "DEFAULT_READINESS_PATH",
    "DEFAULT_REQUEST_TIMEOUT_SECONDS",
    "DEFAULT_SCRAPE_HOST",
    "DEFAULT_SCRAPE_PATH",
    "DEFAULT_SCRAPE_PORT",
    "DEFAULT_STARTUP_PATH",
    "DEFAULT_TOPIC_ROOT",
    "EMBEDDED_HOST",
    "JSON_FORMAT",
    "LEVEL_NAMES",
    "MAX_DEPTH",
    "log_level",
    "parse_size",
]

# The deepest nesting a document may have (objects and arrays; the deepest configuration
# key is about 10 levels down). Parsing, validation and the frozen model all recurse per
# level, so a deeper document is refused before any of them runs.
MAX_DEPTH = 64

# hierarchy, topic
DEFAULT_LEVELS = ("device",)
DEFAULT_TOPIC_ROOT = "uns"

# messaging
DEFAULT_REQUEST_TIMEOUT_SECONDS = 30.0
DEFAULT_MQTT_PORT = 1883
#: messaging.*.keepAliveSeconds
DEFAULT_KEEPALIVE_SECONDS = 30
DEFAULT_MQTT_TLS_PORT = 8883
EMBEDDED_HOST = "embedded"
# The embedded broker's port when `--broker embedded` names none.
DEFAULT_EMBEDDED_PORT = 1883

# heartbeat
DEFAULT_HEARTBEAT_INTERVAL_SECONDS = 60.0

# health
DEFAULT_HEALTH_PORT = 8081
DEFAULT_LIVENESS_PATH = "/livez"
DEFAULT_READINESS_PATH = "/readyz"
DEFAULT_STARTUP_PATH = "/startupz"

# logging
DEFAULT_LEVEL = "INFO"
# Third-party libraries (the embedded broker, the PLC and transfer SDKs) are chatty at INFO.
DEFAULT_LIBRARY_LEVEL = "WARNING"
JSON_FORMAT = "json"
DEFAULT_PYTHON_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"
DEFAULT_MAX_FILE_SIZE = "10MB"
DEFAULT_BACKUP_COUNT = 5

# metricEmission
DEFAULT_METRIC_INTERVAL_SECONDS = 60.0
# Any address, as the probe server binds: a cluster scraper reaches the pod address.
DEFAULT_SCRAPE_HOST = "0.0.0.0"
# The port Prometheus' registry of exporter ports assigns to OpenTelemetry's exporter, the
# generic "application metrics" choice.
DEFAULT_SCRAPE_PORT = 9464
DEFAULT_SCRAPE_PATH = "/metrics"
DEFAULT_CLOUDMON_NAMESPACE = "unskit"

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
#: The level names every variant reads (upper case), in the schema's ``logLevel``.
LEVEL_NAMES = tuple(_LEVELS)

# Units are binary, as log4j2's size-based policy reads them for the Java variant.
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([KMGT])I?B?|B)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(value: object, key: str = "logging.fileLogging.maxFileSize") -> int:
    """Parses ``10MB``, ``512 KB``, ``1.5GB``, ``10MiB`` or a byte count (powers of 1024).

    Any shape the schema's ``maxFileSize`` pattern admits parses, ``0`` included: whether a
    size of 0 is allowed is the caller's rule. A bad value raises ValueError naming `key`.
    """
    # bool is an int subclass, and `true` where a size belongs is a typo.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        unit = match.group(2)
        return int(float(match.group(1)) * (_SIZE_UNITS[unit.upper()] if unit else 1))
    raise ValueError(f"{key}: {value!r} is not a size such as 10MB, 512KB or 1GB")


def log_level(name: str) -> int:
    """The standard library's level for a level name of any variant (TRACE, WARN, FATAL, OFF)."""
    if isinstance(name, str) and name.strip().upper() in _LEVELS:
        return _LEVELS[name.strip().upper()]
    raise ValueError(f"level: {name!r} is not a level ({', '.join(_LEVELS)})")
