"""The ``logging`` section applied to the standard library's logging (the Python variant).

The section is parsed in `unskit.config.model` (`LoggingConfig`): ``level`` (INFO),
``python_format`` (``%(asctime)s [%(levelname)s] %(name)s: %(message)s``, or ``json``),
``loggers`` (name to level), ``libraryLevel`` (the level of the third-party loggers in
`LIBRARY_LOGGERS` that ``loggers`` does not name; WARNING, or ``level`` if higher; above
DEBUG their tracebacks and repeats are summarised, see `_LibraryRepeats`),
``fileLogging`` {``enabled`` (false), ``filePath``, ``maxFileSize`` (10MB), ``backupCount``
(5)}, written in the layout of the stream (JSON lines with the JSON sink),
``globalControl`` (parsed, never acted on);
the effective format is an explicit ``python_format``, else the platform default (``json`` on
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

import functools
import json
import logging
import logging.handlers
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from unskit.config.model import LoggingConfig, log_level
from unskit.config.platform import Platform
from unskit.errors import ConfigError, ConfigIssue

__all__ = [
    "LIBRARY_LOGGERS",
    "LIBRARY_REPEAT_WINDOW_S",
    "JsonFormatter",
    "LoggingConfig",
    "configure_logging",
]

#: Third-party loggers held at ``libraryLevel``: the embedded broker (amqtt and its state
#: machine, transitions, which logs every callback at INFO), the PLC driver, the transfer
#: SDKs and their HTTP stack, and libraries a component may load (asyncua, websockets).
LIBRARY_LOGGERS = (
    "amqtt",
    "transitions",
    "websockets",
    "pycomm3",
    "asyncua",
    "paramiko",
    "invoke",
    "boto3",
    "botocore",
    "s3transfer",
    "awscrt",
    "urllib3",
)

#: A third-party line that repeats is written once per window, with the count of the rest.
LIBRARY_REPEAT_WINDOW_S = 60.0
#: Distinct third-party lines remembered; beyond it the oldest window is forgotten.
_REPEAT_KEYS = 1000
#: The clock of the repeat windows (a test moves it).
_now = time.monotonic

# Attributes every LogRecord has; anything else on a record came through ``extra=``.
_BLANK_RECORD = logging.LogRecord("", logging.INFO, "", 0, "", None, None)
_RECORD_ATTRS = frozenset(_BLANK_RECORD.__dict__) | {"message", "asctime", "taskName"}
_JSON_FIELDS = ("timestamp", "level", "logger", "message", "thread", "exc_info", "stack_info")

_lock = threading.Lock()
# Loggers given a level by the previous call, so a reload that drops one resets it.
_configured_loggers: set[str] = set()
# Handlers this module installed: they are closed when replaced, foreign ones only removed.
_own_handlers: list[logging.Handler] = []


def configure_logging(
    config: LoggingConfig | Mapping[str, Any] | None, platform: Platform | None = None
) -> None:
    """Replaces the root handlers with the sinks the ``logging`` configuration asks for.

    `config` is a `LoggingConfig`, or the raw section (None = all defaults), parsed with
    `LoggingConfig.from_section` for `platform`; a bad section raises ValueError naming its
    key, a log file that cannot be opened ConfigError, and either changes nothing. A
    `LoggingConfig` already has its effective format, so `platform` is not consulted for it.
    """
    # Everything is validated before anything changes: a bad reload keeps the old setup.
    settings = (
        config
        if isinstance(config, LoggingConfig)
        else LoggingConfig.from_section(config, platform)
    )
    root_level = log_level(settings.level)
    library_level = log_level(settings.effective_library_level)
    logger_levels = {name: library_level for name in LIBRARY_LOGGERS}
    logger_levels.update((name, log_level(level)) for name, level in settings.loggers.items())
    handlers: list[logging.Handler] = []
    # The file sink writes the layout the stream does: JSON lines with the JSON sink (the
    # CLUSTER default), the text format otherwise.
    layout: Callable[[], logging.Formatter] = (
        JsonFormatter if settings.json else functools.partial(logging.Formatter, settings.format)
    )
    stream_handler = _StreamHandler(stdout=settings.json)
    stream_handler.setFormatter(layout())
    handlers.append(stream_handler)
    files = settings.file_logging
    if files.enabled and files.file_path is not None:
        try:
            file_handler = _file_handler(
                Path(files.file_path), files.max_file_size, files.backup_count
            )
        except ConfigError:
            stream_handler.close()
            raise
        file_handler.setFormatter(layout())
        handlers.append(file_handler)
    # One filter for every sink, so each writes the same lines.
    repeats = _LibraryRepeats()
    for handler in handlers:
        handler.addFilter(repeats)

    root = logging.getLogger()
    with _lock:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in _own_handlers:
            handler.close()
        _own_handlers[:] = handlers
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(root_level)
        for name in _configured_loggers - logger_levels.keys():
            logging.getLogger(name).setLevel(logging.NOTSET)
        for name, level in logger_levels.items():
            logging.getLogger(name).setLevel(level)
        _configured_loggers.clear()
        _configured_loggers.update(logger_levels)


class _LibraryRepeats(logging.Filter):
    """Summarises third-party lines while their logger is above DEBUG: a traceback becomes
    its exception's one-line summary, and a line that repeats (same logger, level and
    message template) is written once per window, the next one carrying how many were
    left out. A device that fails every few hundred milliseconds otherwise fills the log
    with a library's identical tracebacks."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        #: (logger, level, template) -> [end of the window, lines left out in it]
        self._windows: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # Each sink asks; the first answer is kept on the record for the others.
        decided = record.__dict__.get("_unskit_written")
        if decided is None:
            decided = record.__dict__["_unskit_written"] = self._decide(record)
        return bool(decided)

    def _decide(self, record: logging.LogRecord) -> bool:
        if not _is_library(record.name):
            return True
        if logging.getLogger(record.name).getEffectiveLevel() <= logging.DEBUG:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = _now()
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now < window[0]:
                window[1] += 1
                return False
            left_out = 0 if window is None else int(window[1])
            if window is None and len(self._windows) >= _REPEAT_KEYS:
                del self._windows[next(iter(self._windows))]
            self._windows[key] = [now + LIBRARY_REPEAT_WINDOW_S, 0]
        notes = []
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            notes.append(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
            record.exc_info = None
            record.exc_text = None
        if left_out:
            notes.append(f"{left_out} more like it since the last one written")
        if notes:
            record.msg = f"{record.getMessage()} ({'; '.join(notes)})"
            record.args = None
        return True


def _is_library(name: str) -> bool:
    return any(name == lib or name.startswith(lib + ".") for lib in LIBRARY_LOGGERS)


def _file_handler(path: Path, max_bytes: int, backups: int) -> logging.Handler:
    """The rotating file sink; a path that cannot be opened is a configuration error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
    except OSError as error:
        reason = error.strerror or str(error)
        where = f": {error.filename}" if error.filename else ""
        issue = ConfigIssue("$.logging.fileLogging.filePath", f"cannot be opened ({reason}{where})")
        raise ConfigError([issue]) from None


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
