"""The ``logging`` section applied to the standard library's logging (the Python variant).

Keys: ``level`` (INFO), ``python_format`` (``%(asctime)s [%(levelname)s] %(name)s: %(message)s``,
or ``json``), ``loggers`` (name to level), ``fileLogging`` {``enabled`` (false), ``filePath``,
``maxFileSize`` (10MB), ``backupCount`` (5)}, ``globalControl`` (parsed, never acted on).
``java_format``, ``rust_format`` and ``ts_format`` belong to the other variants and are ignored.

Effective format: an explicit ``python_format``, else the platform default (``json`` on
CLUSTER), else the built-in default. Text goes to stderr; the JSON sink writes to stdout, one
object per line::

    {"timestamp": "2024-05-01T12:00:00.123Z", "level": "INFO", "logger": "unskit.cip",
     "message": "connected", "thread": "MainThread", ...extra fields...,
     "exc_info": "Traceback ...", "stack_info": "Stack (most recent call last): ..."}

``timestamp`` is RFC 3339 in UTC with milliseconds; ``exc_info`` and ``stack_info`` appear
only when the record has them; fields given through ``extra=`` are added at top level (an
extra whose name is one of the fixed fields is written as ``extra_<name>``) and values JSON
cannot hold are written as their ``str()``.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from unskit.config.platform import Platform

__all__ = [
    "DEFAULT_BACKUP_COUNT",
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_PYTHON_FORMAT",
    "JSON_FORMAT",
    "FileLoggingSettings",
    "JsonFormatter",
    "LoggingSettings",
    "configure_logging",
    "parse_logging_config",
    "parse_size",
]

DEFAULT_LEVEL = "INFO"
DEFAULT_PYTHON_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"
DEFAULT_MAX_FILE_SIZE = "10MB"
DEFAULT_BACKUP_COUNT = 5
JSON_FORMAT = "json"

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
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])i?b?|b)?\s*", re.IGNORECASE)
_UNIT = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_PLATFORM_FORMAT = {Platform.CLUSTER: JSON_FORMAT}

# Attributes every LogRecord has; anything else on a record came through ``extra=``.
_BLANK_RECORD = logging.LogRecord("", logging.INFO, "", 0, "", None, None)
_RECORD_ATTRS = frozenset(_BLANK_RECORD.__dict__) | {"message", "asctime", "taskName"}
_JSON_FIELDS = ("timestamp", "level", "logger", "message", "thread", "exc_info", "stack_info")

_lock = threading.Lock()
# Loggers given a level by the previous call, so a reload that drops one resets it.
_configured_loggers: set[str] = set()
# Handlers this module installed: they are closed when replaced, foreign ones only removed.
_own_handlers: list[logging.Handler] = []


@dataclass(frozen=True)
class FileLoggingSettings:
    """The parsed ``logging.fileLogging`` block."""

    enabled: bool = False
    file_path: str | None = None
    max_bytes: int = 10 * 1024**2
    backup_count: int = DEFAULT_BACKUP_COUNT


@dataclass(frozen=True)
class LoggingSettings:
    """The parsed ``logging`` section with the effective format resolved."""

    level: int = logging.INFO
    format: str = DEFAULT_PYTHON_FORMAT
    json: bool = False
    loggers: Mapping[str, int] = field(default_factory=dict)
    file_logging: FileLoggingSettings = field(default_factory=FileLoggingSettings)
    global_control: bool = False


def parse_size(value: object, key: str = "logging.fileLogging.maxFileSize") -> int:
    """Parses a size such as ``10MB``, ``512KB``, ``1GB`` or ``4096`` into bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        unit = match.group(2)
        size = int(float(match.group(1)) * (_UNIT[unit.lower()] if unit else 1))
    else:
        raise ValueError(f"{key}: {value!r} is not a size such as 10MB, 512KB or 1GB")
    # RotatingFileHandler never rotates at 0, which would make the limit a silent no-op.
    if size <= 0:
        raise ValueError(f"{key}: {value!r} must be greater than zero")
    return size


def parse_logging_config(
    config: Mapping[str, Any] | None, platform: Platform | None = None
) -> LoggingSettings:
    """Validates the ``logging`` section; a bad value raises ValueError naming its key."""
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ValueError("logging must be an object")

    level = _level(config.get("level", DEFAULT_LEVEL), "logging.level")

    explicit = config.get("python_format")
    if explicit is not None and (not isinstance(explicit, str) or not explicit.strip()):
        raise ValueError("logging.python_format must be a non-empty string")
    chosen = explicit or (_PLATFORM_FORMAT.get(platform) if platform else None)
    chosen = chosen or DEFAULT_PYTHON_FORMAT
    use_json = chosen.strip().lower() == JSON_FORMAT
    text_format = DEFAULT_PYTHON_FORMAT if use_json else chosen
    if not use_json:
        try:
            logging.Formatter(text_format, validate=True)
        except ValueError as exc:
            raise ValueError(f"logging.python_format: {exc}") from None

    raw_loggers = config.get("loggers")
    if raw_loggers is None:
        raw_loggers = {}
    if not isinstance(raw_loggers, Mapping):
        raise ValueError("logging.loggers must be an object mapping logger names to levels")
    loggers = {}
    for name, value in raw_loggers.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"logging.loggers: logger name {name!r} must be a non-empty string")
        loggers[name] = _level(value, f"logging.loggers.{name}")

    global_control = config.get("globalControl", False)
    if not isinstance(global_control, bool):
        raise ValueError("logging.globalControl must be a boolean")

    return LoggingSettings(
        level=level,
        format=text_format,
        json=use_json,
        loggers=loggers,
        file_logging=_file_logging(config.get("fileLogging")),
        global_control=global_control,
    )


def configure_logging(config: Mapping[str, Any] | None, platform: Platform | None = None) -> None:
    """Replaces the root handlers with the sinks the ``logging`` section asks for."""
    # Everything is validated before anything changes: a bad reload keeps the old setup.
    settings = parse_logging_config(config, platform)
    handlers: list[logging.Handler] = []
    if settings.json:
        json_handler = _StreamHandler(stdout=True)
        json_handler.setFormatter(JsonFormatter())
        handlers.append(json_handler)
    else:
        text_handler = _StreamHandler(stdout=False)
        text_handler.setFormatter(logging.Formatter(settings.format))
        handlers.append(text_handler)
        files = settings.file_logging
        if files.enabled and files.file_path is not None:
            path = Path(files.file_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            file_handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=files.max_bytes, backupCount=files.backup_count, encoding="utf-8"
            )
            file_handler.setFormatter(logging.Formatter(settings.format))
            handlers.append(file_handler)

    root = logging.getLogger()
    with _lock:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in _own_handlers:
            handler.close()
        _own_handlers[:] = handlers
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(settings.level)
        for name in _configured_loggers - settings.loggers.keys():
            logging.getLogger(name).setLevel(logging.NOTSET)
        for name, level in settings.loggers.items():
            logging.getLogger(name).setLevel(level)
        _configured_loggers.clear()
        _configured_loggers.update(settings.loggers)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (the layout in this module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """Returns the record as a single line of JSON."""
        created = datetime.fromtimestamp(record.created, tz=timezone.utc)
        out: dict[str, Any] = {
            "timestamp": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        for key, value in record.__dict__.items():
            if key in _RECORD_ATTRS or key.startswith("_"):
                continue
            out[f"extra_{key}" if key in _JSON_FIELDS else key] = value
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
            out["exc_info"] = record.exc_text
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        # json.dumps escapes newlines, so a traceback stays on its one line.
        return json.dumps(out, default=str, ensure_ascii=False)


class _StreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stdout or sys.stderr is at emit time, so a redirected
    stream (a test capture, contextlib.redirect_stdout) is honoured and a replaced one
    is never written to after it was closed."""

    def __init__(self, *, stdout: bool) -> None:
        super().__init__()
        self._stdout = stdout

    @property
    def stream(self) -> TextIO:
        return sys.stdout if self._stdout else sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        # StreamHandler.__init__ assigns a stream; the live lookup above replaces it.
        pass


def _level(value: object, key: str) -> int:
    if isinstance(value, str) and value.strip().upper() in _LEVELS:
        return _LEVELS[value.strip().upper()]
    names = ", ".join(_LEVELS)
    raise ValueError(f"{key}: {value!r} is not a level ({names})")


def _file_logging(block: object) -> FileLoggingSettings:
    if block is None:
        return FileLoggingSettings()
    if not isinstance(block, Mapping):
        raise ValueError("logging.fileLogging must be an object")
    enabled = block.get("enabled", False)
    if not isinstance(enabled, bool):
        raise ValueError("logging.fileLogging.enabled must be a boolean")
    file_path = block.get("filePath")
    if file_path is not None and (not isinstance(file_path, str) or not file_path):
        raise ValueError("logging.fileLogging.filePath must be a non-empty string")
    if enabled and file_path is None:
        raise ValueError("logging.fileLogging.filePath is required when fileLogging is enabled")
    max_bytes = parse_size(block.get("maxFileSize", DEFAULT_MAX_FILE_SIZE))
    backup_count = block.get("backupCount", DEFAULT_BACKUP_COUNT)
    # At 0 RotatingFileHandler reopens the same file on rollover and it grows without bound.
    if not isinstance(backup_count, int) or isinstance(backup_count, bool) or backup_count < 1:
        raise ValueError(f"logging.fileLogging.backupCount: {backup_count!r} must be at least 1")
    return FileLoggingSettings(enabled, file_path, max_bytes, backup_count)
