"""Every shipped example configuration validates as its component loads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.json"))


def test_there_are_examples():
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path):
    component = path.stem
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
