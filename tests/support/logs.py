"""Log records of a test, for asserting that bad input logs warnings and never a traceback."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator


class LogRecorder(logging.Handler):
    """Every record at INFO or above, whichever thread logs it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def tracebacks(self) -> list[str]:
        return [
            f"{r.name}: {r.getMessage()}"
            for r in self.records
            if r.exc_info or r.stack_info or "Traceback" in r.getMessage()
        ]

    def warnings(self, text: str) -> list[str]:
        return [
            r.getMessage()
            for r in self.records
            if r.levelno >= logging.WARNING and text in r.getMessage()
        ]


@contextlib.contextmanager
def recording_logs() -> Iterator[LogRecorder]:
    """Records what reaches the root logger (added after a Runtime configured logging, so
    it is not swept away) and fails when an exception escapes a thread meanwhile."""
    recorder = LogRecorder()
    escaped: list[str] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: escaped.append(f"{args.exc_type}: {args.exc_value}")
    root = logging.getLogger()
    root.addHandler(recorder)
    try:
        yield recorder
    finally:
        root.removeHandler(recorder)
        threading.excepthook = previous
    assert escaped == [], f"an exception escaped a thread: {escaped}"
