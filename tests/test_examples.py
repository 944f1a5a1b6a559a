"""Every shipped example configuration validates as its component loads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.json"))


def test_there_are_examples():
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.integration
def test_example_validates(path):
    # The component is the file's name, or its token (ethernet-ip-adapter-push.json).
    component = json.loads(path.read_text())["component"].get("token", path.stem)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "unskit.cli",
            "validate",
            "-c",
            str(path),
            "-t",
            "gw-01",
            "--component",
            component,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_an_installed_components_schema_checks_its_section(tmp_path):
    bad = tmp_path / "echo.json"
    bad.write_text('{"component": {"colour": "red"}, "messaging": {"local": {"host": "embedded"}}}')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "unskit.cli",
            "validate",
            "-c",
            str(bad),
            "-t",
            "gw-01",
            "--component",
            "echo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "$.component" in result.stdout + result.stderr
