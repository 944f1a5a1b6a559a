"""The demo's generated configurations validate as each component loads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unskit.demo.plan import THING, demo_documents

NAMES = [name for name, _ in demo_documents(Path("/unused"), 4840, 44818)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.integration
def test_the_generated_configuration_validates(name: str, tmp_path: Path) -> None:
    document = dict(demo_documents(tmp_path, 4840, 44818))[name]
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps(document))
    command = [sys.executable, "-m", "unskit.cli", "validate", "-c", str(config), "-t", THING]
    result = subprocess.run(
        [*command, "--component", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_egress_watches_what_the_camera_writes(tmp_path: Path) -> None:
    documents = dict(demo_documents(tmp_path, 4840, 44818))
    storage = documents["camera-adapter"]["component"]["storage"]
    (instance,) = documents["file-egress"]["component"]["instances"]
    assert instance["source"]["path"] == storage["outputRoot"]
    # The camera's temporary files are never picked up.
    assert ".partial/*" in instance["source"]["exclude"]
    assert instance["onComplete"]["action"] == "archive"
