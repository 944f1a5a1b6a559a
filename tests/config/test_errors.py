"""ConfigError and SecretError in the unskit exception tree."""

from __future__ import annotations

import unskit.errors
from unskit.errors import ConfigError, ConfigIssue, SecretError, UnskitError


def test_config_error_carries_every_issue() -> None:
    issues = [ConfigIssue("$.a", "is required"), ConfigIssue("$.b.c", "must be >= 0")]
    error = ConfigError(issues, source="plant.json")
    assert error.issues == tuple(issues)
    assert error.source == "plant.json"
    assert str(error) == (
        "2 configuration errors in plant.json:\n  $.a: is required\n  $.b.c: must be >= 0"
    )


def test_single_issue_renders_on_one_line() -> None:
    error = ConfigError([ConfigIssue("$.x", "unknown key")])
    assert str(error) == "configuration error: $.x: unknown key"
    assert str(error.issues[0]) == "$.x: unknown key"


def test_tree() -> None:
    assert issubclass(ConfigError, UnskitError)
    assert issubclass(SecretError, UnskitError)
    assert not issubclass(ConfigError, SecretError)
    doc = unskit.errors.__doc__ or ""
    assert "ConfigError" in doc
    assert "SecretError" in doc


def test_issues_sort_by_path() -> None:
    issues = [ConfigIssue("$.b", "x"), ConfigIssue("$.a", "y")]
    assert [i.path for i in sorted(issues)] == ["$.a", "$.b"]
