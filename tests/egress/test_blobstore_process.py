"""The `blobstore` backend in the component process and in `unskit egress send`: SIGKILL in
the middle of a staged upload, restart, and only the blocks not recorded are staged again;
no uncommitted block is left once the block list is committed."""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.egress.conftest import MIB, write_file
from tests.egress.test_blobstore import blob_bytes, block_lists
from tests.egress.test_process import events, listener, query
from tests.egress.test_send import config, run_send
from tests.messaging.test_client import Inbox
from tests.support.adapter import framework_sections
from tests.support.azurite import ACCOUNT_KEY, Azurite
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until

pytestmark = pytest.mark.integration

BLOCK = 4 * MIB


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite")).start()
    yield server
    server.stop()


def recorded_blocks(db: Path) -> list[tuple[int, int]]:
    try:
        return [(int(n), int(s)) for n, s in query(db, "SELECT number, size FROM parts")]
    except sqlite3.OperationalError:  # the schema is not created yet
        return []


@pytest.mark.slow
def test_sigkill_mid_upload_resumes_from_the_staged_blocks(
    broker: Mosquitto, azurite: Azurite, tmp_path: Path
):
    container = azurite.container()
    source = tmp_path / "source"
    data = write_file(source / "batch" / "run.bin", 50 * MIB)
    document = {
        "component": {
            "global": {"stateDir": str(tmp_path / "state")},
            "instances": [
                {
                    "id": "line-1",
                    "source": {"path": str(source), "settleSeconds": 0},
                    "egress": [
                        azurite.destination(
                            container,
                            id="blob",
                            bandwidthBytesPerSec=10 * MIB,
                            blocks={
                                "thresholdBytes": BLOCK,
                                "blockSizeBytes": BLOCK,
                                "maxConcurrentBlocks": 2,
                            },
                        )
                    ],
                }
            ],
        },
        **framework_sections(broker.plain_port, tmp_path),
    }
    cfg = tmp_path / "egress.json"
    cfg.write_text(json.dumps(document))
    db = tmp_path / "state" / "gw" / "file-egress" / "egress.sqlite3"
    args = ["-c", str(cfg), "-t", "gw"]
    client = listener(broker)
    try:
        inbox = Inbox()
        client.subscribe(f"{document['topic']['root']}/#", inbox)
        first = tmp_path / "first.log"
        with component_process("file-egress", first, *args) as process:
            wait_until(lambda: len(recorded_blocks(db)) >= 4, 60, "four recorded blocks")
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        blocks = recorded_blocks(db)
        resumed = sum(size for _, size in blocks)
        assert 4 <= len(blocks) < 13
        committed, uncommitted = block_lists(azurite, container, "batch/run.bin")
        # Staged, not committed: no blob is visible under the name yet.
        assert committed == []
        assert len(uncommitted) >= len(blocks)
        assert (source / "batch" / "run.bin").exists()
        assert not events(inbox, "file-delivered")

        second = tmp_path / "second.log"
        with component_process("file-egress", second, *args) as process:
            wait_until(lambda: events(inbox, "file-completed"), 90, "completion")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, second.read_text()
        delivered = events(inbox, "file-delivered")
        assert len(delivered) == 1
        assert delivered[0]["blocksResumed"] == len(blocks)
        assert delivered[0]["resumedFrom"] == resumed
        assert delivered[0]["bytesSent"] == len(data) - resumed
        assert delivered[0]["bytesSent"] < len(data)
        assert blob_bytes(azurite, container, "batch/run.bin") == data
        committed, uncommitted = block_lists(azurite, container, "batch/run.bin")
        assert len(committed) == 13
        assert uncommitted == []
        assert not (source / "batch" / "run.bin").exists()
        for path in (first, second):
            assert ACCOUNT_KEY not in path.read_text(), f"the account key in {path.name}"
    finally:
        client.close(1)


def test_send_delivers_to_a_blobstore_and_keeps_the_files(tmp_path: Path, azurite: Azurite):
    container = azurite.container()
    data = {
        name: write_file(tmp_path / "in" / name, size)
        for name, size in (("a.csv", 1000), ("b.bin", 6 * MIB))
    }
    cfg = config(
        tmp_path,
        azurite.destination(
            container,
            id="azure",
            prefix="sent",
            blocks={"thresholdBytes": BLOCK, "blockSizeBytes": BLOCK},
        ),
    )
    files = [str(tmp_path / "in" / name) for name in data]
    result = run_send(*files, "--config", str(cfg), "-t", "gw", "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    for name, content in data.items():
        assert blob_bytes(azurite, container, f"sent/{name}") == content
        assert (tmp_path / "in" / name).exists()
    assert result.stdout.count("verified") == 2
    assert ACCOUNT_KEY not in result.stdout + result.stderr


def test_the_example_sends_to_azurite(tmp_path: Path, azurite: Azurite):
    example = Path(__file__).parents[2] / "examples" / "file-egress-blobstore.json"
    document = json.loads(example.read_text())
    # Pointed at this emulator (the example says port 10000) and at tmp_path for its state.
    [blob] = [d for d in document["component"]["instances"][0]["egress"] if d["id"] == "azure"]
    assert blob["endpointUrl"] == "http://127.0.0.1:10000/devstoreaccount1"
    blob["endpointUrl"] = azurite.url
    document["component"]["instances"][0]["egress"] = [blob]
    document["commands"]["stateDir"] = str(tmp_path / "state")
    cfg = tmp_path / "example.json"
    cfg.write_text(json.dumps(document))
    with azurite.service() as service:
        service.create_container(blob["container"])
    data = write_file(tmp_path / "in" / "run.bin", 9 * MIB)
    result = run_send(str(tmp_path / "in" / "run.bin"), "--config", str(cfg), "-t", "gw")
    assert result.returncode == 0, result.stdout + result.stderr
    assert blob_bytes(azurite, blob["container"], "plant-1/line-1/run.bin") == data
