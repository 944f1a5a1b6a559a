"""The chaos suite's report: the table of faults and invariants of each run, shown in the
terminal summary (pytest captures the test's own output)."""

from __future__ import annotations

import pytest

TABLES = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for text in terminalreporter.config.stash.get(TABLES, []):
        terminalreporter.section("chaos: faults injected and invariants held")
        terminalreporter.write_line(text)
