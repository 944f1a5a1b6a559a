"""The demo's generated configurations validate as each component loads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unskit.demo.plan import EGRESS_INSTANCE, ROOT, SIGNALS_INSTANCE, THING, demo_documents

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
    instances = {i["id"]: i for i in documents["file-egress"]["component"]["instances"]}
    instance = instances[EGRESS_INSTANCE]
    assert instance["source"]["path"] == storage["outputRoot"]
    # The camera's temporary files are never picked up.
    assert ".partial/*" in instance["source"]["exclude"]
    assert instance["onComplete"]["action"] == "archive"


def test_the_egress_ships_what_the_recorder_writes(tmp_path: Path) -> None:
    documents = dict(demo_documents(tmp_path, 4840, 44818))
    recorder = documents["signal-recorder"]["component"]
    instances = {i["id"]: i for i in documents["file-egress"]["component"]["instances"]}
    signals = instances[SIGNALS_INSTANCE]
    assert signals["source"]["path"] == recorder["output"]["path"]
    # Only closed files (the recorder's open ones are hidden .tmp files).
    assert signals["source"]["include"] == ["*.parquet"]
    (destination,) = signals["egress"]
    assert destination["path"] == str(tmp_path / "delivered" / "signals")
    # The PLC's signals: both instances of the CIP adapter, under the demo's root.
    assert recorder["topics"]["include"] == [f"{ROOT}/{THING}/ethernet-ip-adapter/+/data/#"]
    names = [name for name, _ in demo_documents(tmp_path, 4840, 44818)]
    assert names.index("signal-recorder") < names.index("ethernet-ip-adapter")
