"""`unskit run file-egress` as a process: SIGKILL in the middle of a 50 MiB transfer to a
local folder and to S3 (moto), restart, and each destination resumes where it stopped; the
source is removed only once both verified. Also the shipped example, run as is."""

from __future__ import annotations

import json
import signal
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.egress.conftest import MIB, write_file
from tests.messaging.test_client import Inbox
from tests.support.adapter import framework_sections
from tests.support.mosquitto import Mosquitto
from tests.support.moto import SECRET_KEY, MotoServer
from tests.support.servers import component_process, wait_until
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

EXAMPLE = Path(__file__).parents[2] / "examples" / "file-egress.json"
PART = 5 * MIB


def listener(broker: Mosquitto) -> MessagingClient:
    client = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=broker.plain_port, client_id=f"x-{uuid.uuid4().hex}"
            )
        ),
        persistent_session=False,
    ).start()
    wait_until(client.connected, 10, "the test client")
    return client


def events(inbox: Inbox, kind: str) -> list[dict[str, Any]]:
    return [
        m.body["context"]
        for _, m in list(inbox.items)
        if isinstance(m.body, dict) and m.body.get("type") == kind
    ]


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def progress(db: Path) -> tuple[int, int]:
    """The local offset and the count of S3 parts recorded so far (0, 0 before any)."""
    try:
        offset = query(db, "SELECT offset FROM deliveries WHERE dest = 'nas'")
        parts = query(db, "SELECT COUNT(*) FROM parts WHERE dest = 's3'")
    except sqlite3.OperationalError:  # the schema is not created yet
        return (0, 0)
    return (offset[0][0] if offset else 0, parts[0][0] if parts else 0)


@pytest.mark.slow
def test_sigkill_mid_transfer_resumes_each_destination(
    broker: Mosquitto, moto: MotoServer, bucket: str, tmp_path: Path
):
    source = tmp_path / "source"
    out = tmp_path / "nas"
    data = write_file(source / "batch" / "run.bin", 50 * MIB)
    limited = 10 * MIB
    document = {
        "component": {
            "global": {"stateDir": str(tmp_path / "state")},
            "instances": [
                {
                    "id": "line-1",
                    "source": {"path": str(source), "settleSeconds": 0},
                    "egress": [
                        {
                            "id": "nas",
                            "type": "local",
                            "path": str(out),
                            "bandwidthBytesPerSec": limited,
                        },
                        moto.destination(
                            bucket,
                            id="s3",
                            bandwidthBytesPerSec=limited,
                            multipart={
                                "thresholdBytes": PART,
                                "partSizeBytes": PART,
                                "maxConcurrentParts": 2,
                            },
                        ),
                    ],
                }
            ],
        },
        **framework_sections(broker.plain_port, tmp_path),
    }
    config = tmp_path / "egress.json"
    config.write_text(json.dumps(document))
    db = tmp_path / "state" / "gw" / "file-egress" / "egress.sqlite3"
    args = ["-c", str(config), "-t", "gw"]
    client = listener(broker)
    try:
        inbox = Inbox()
        client.subscribe(f"{document['topic']['root']}/#", inbox)
        log = tmp_path / "first.log"
        with component_process("file-egress", log, *args) as process:
            wait_until(
                lambda: all(a >= b for a, b in zip(progress(db), (8 * MIB, 2), strict=True)),
                60,
                "progress on both destinations",
            )
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        offset = query(db, "SELECT offset FROM deliveries WHERE dest = 'nas'")[0][0]
        parts = query(db, "SELECT number, size FROM parts WHERE dest = 's3'")
        assert 8 * MIB <= offset < len(data)
        assert 2 <= len(parts) < 10
        assert (source / "batch" / "run.bin").exists()
        assert not events(inbox, "file-delivered")

        second = tmp_path / "second.log"
        with component_process("file-egress", second, *args) as process:
            wait_until(lambda: events(inbox, "file-completed"), 90, "completion")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, second.read_text()
        delivered = {d["destination"]: d for d in events(inbox, "file-delivered")}
        assert delivered["nas"]["resumedFrom"] == offset
        assert delivered["nas"]["bytesSent"] == len(data) - offset
        assert delivered["s3"]["partsResumed"] == len(parts)
        assert delivered["s3"]["resumedFrom"] == sum(size for _, size in parts)
        assert delivered["s3"]["bytesSent"] == len(data) - delivered["s3"]["resumedFrom"]
        kinds = [m.body.get("type") for _, m in list(inbox.items) if isinstance(m.body, dict)]
        assert kinds.index("file-completed") > max(
            i for i, kind in enumerate(kinds) if kind == "file-delivered"
        )
        assert (out / "batch" / "run.bin").read_bytes() == data
        s3 = moto.client()
        assert s3.get_object(Bucket=bucket, Key="batch/run.bin")["Body"].read() == data
        assert not (source / "batch" / "run.bin").exists()
        for path in (log, second):
            assert SECRET_KEY not in path.read_text(), f"a plaintext secret in {path.name}"
    finally:
        client.close(1)


def test_the_example_runs_as_is(broker: Mosquitto, tmp_path: Path):
    document = json.loads(EXAMPLE.read_text())
    instance = document["component"]["instances"][0]
    source = Path(instance["source"]["path"])
    rel = f"t-{uuid.uuid4().hex[:8]}/reading.csv"
    data = write_file(source / rel, 4096)
    destinations = [Path(d["path"]) for d in instance["egress"]]
    archive = Path(instance["onComplete"]["archiveDir"])
    log = tmp_path / "example.log"
    args = ["-c", str(EXAMPLE), "-t", "demo", "--broker", f"127.0.0.1:{broker.plain_port}"]
    with component_process("file-egress", log, *args) as process:
        wait_until(lambda: (archive / rel).exists(), 30, "the file archived")
        wait_until(lambda: b"file-egress running" in log.read_bytes(), 30, "start-up")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
    for destination in destinations:
        assert (destination / rel).read_bytes() == data
    assert (archive / rel).read_bytes() == data
    assert not (source / rel).exists()
