"""scripts/greengrass_pom.py: the pom edits the nucleus build records, on a small pom."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "greengrass_pom.py"
NS = {"m": "http://maven.apache.org/POM/4.0.0"}
pytestmark = pytest.mark.integration

POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <dependencies>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>greengrassv2</artifactId>
      <version>2.0.0</version></dependency>
    <dependency><groupId>com.example</groupId><artifactId>logback-fork</artifactId>
      <version>9</version></dependency>
    <dependency><groupId>com.aws.greengrass</groupId><artifactId>nucleus</artifactId>
      <version>1</version><type>test-jar</type></dependency>
  </dependencies>
</project>
"""


def edit(pom: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(pom), *args], capture_output=True, text=True, check=False
    )


def artifacts(pom: Path) -> dict[str, tuple[str | None, str | None, str | None]]:
    root = ET.parse(pom).getroot()
    return {
        dep.findtext("m:artifactId", namespaces=NS) or "": (
            dep.findtext("m:groupId", namespaces=NS),
            dep.findtext("m:version", namespaces=NS),
            dep.findtext("m:scope", namespaces=NS),
        )
        for dep in root.iterfind(".//m:dependency", NS)
    }


@pytest.fixture
def pom(tmp_path: Path) -> Path:
    path = tmp_path / "pom.xml"
    path.write_text(POM)
    return path


def test_each_edit_changes_only_its_dependency(pom: Path) -> None:
    assert edit(pom, "version", "greengrassv2", "2.42.33").returncode == 0
    assert edit(pom, "replace", "logback", "ch.qos.logback:logback-classic:1.3.14").returncode == 0
    assert edit(pom, "provided", "greengrassv2").returncode == 0
    assert edit(pom, "drop-test-jars").returncode == 0
    assert artifacts(pom) == {
        "greengrassv2": ("software.amazon.awssdk", "2.42.33", "provided"),
        "logback-classic": ("ch.qos.logback", "1.3.14", None),
    }


def test_a_coordinate_that_is_not_there_fails_naming_the_pom(pom: Path) -> None:
    before = pom.read_text()
    done = edit(pom, "version", "no-such-artifact", "1")
    assert done.returncode == 3
    assert str(pom) in done.stderr
    assert "no-such-artifact" in done.stderr
    assert pom.read_text() == before
