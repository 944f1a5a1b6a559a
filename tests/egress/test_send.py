"""`unskit egress send FILE... --config FILE`: the same pipeline, once, with a summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.egress.conftest import MIB, write_file


def run_send(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unskit.cli", "egress", "send", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def config(tmp_path: Path, *egress: dict) -> Path:
    path = tmp_path / "egress.json"
    path.write_text(
        json.dumps(
            {
                "component": {
                    "global": {"stateDir": str(tmp_path / "state")},
                    "instances": [
                        {
                            "id": "line-1",
                            "source": {"path": str(tmp_path / "unused")},
                            "egress": list(egress),
                        }
                    ],
                },
                "messaging": {"local": {"host": "embedded"}},
            }
        )
    )
    return path


def test_send_delivers_to_every_destination_and_keeps_the_files(tmp_path, moto, bucket):
    data = {
        name: write_file(tmp_path / "in" / name, size)
        for name, size in (("a.csv", 1000), ("b.bin", 6 * MIB))
    }
    out = tmp_path / "out"
    cfg = config(
        tmp_path,
        {"type": "local", "path": str(out), "id": "nas"},
        moto.destination(
            bucket,
            id="s3",
            prefix="sent",
            multipart={"thresholdBytes": 5 * MIB, "partSizeBytes": 5 * MIB},
        ),
    )
    files = [str(tmp_path / "in" / name) for name in data]
    result = run_send(*files, "--config", str(cfg), "-t", "gw", "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    s3 = moto.client()
    for name, content in data.items():
        assert (out / name).read_bytes() == content
        assert s3.get_object(Bucket=bucket, Key=f"sent/{name}")["Body"].read() == content
        assert (tmp_path / "in" / name).exists()
    assert result.stdout.count("verified") == 4


@pytest.mark.integration
def test_send_reports_a_destination_that_failed(tmp_path):
    write_file(tmp_path / "in" / "a.csv", 100)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    cfg = config(
        tmp_path,
        {"type": "local", "path": str(tmp_path / "ok"), "id": "ok"},
        {"type": "local", "path": str(blocked), "id": "blocked"},
    )
    result = run_send(
        str(tmp_path / "in" / "a.csv"), "--config", str(cfg), "--attempts", "1", "--no-progress"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed" in result.stdout
    assert (tmp_path / "ok" / "a.csv").exists()


@pytest.mark.integration
def test_send_refuses_a_file_outside_its_base(tmp_path):
    write_file(tmp_path / "elsewhere.csv", 10)
    cfg = config(tmp_path, {"type": "local", "path": str(tmp_path / "ok")})
    result = run_send(
        str(tmp_path / "elsewhere.csv"), "--base", str(tmp_path / "in"), "--config", str(cfg)
    )
    assert result.returncode == 2
    assert "not a plain relative path" in result.stderr
