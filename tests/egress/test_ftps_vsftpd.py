"""The `ftps` backend against Debian's vsftpd (issue 16 item 5), beside pyftpdlib in
test_ftps.py: a server real deployments run, which by default refuses a data connection
that does not resume the control connection's TLS session (`require_ssl_reuse=YES`).
Explicit and implicit TLS deliver verified; a SIGKILL mid-transfer resumes with APPE from
the recorded offset; a corrupted remote copy is detected and sent again."""

from __future__ import annotations

import json
import signal
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.egress.test_ftps import base, offset, recorded
from tests.egress.test_process import events as process_events
from tests.egress.test_process import listener
from tests.messaging.test_client import Inbox
from tests.support.adapter import framework_sections
from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki
from tests.support.servers import component_process, wait_until
from tests.support.vsftpd import UPLOADS, Vsftpd

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["explicit", "implicit"])
def vsftpd(
    request: pytest.FixtureRequest, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Vsftpd]:
    server = Vsftpd(tmp_path_factory.mktemp("vsftpd"), pki, implicit=request.param == "implicit")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def explicit(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vsftpd]:
    server = Vsftpd(tmp_path_factory.mktemp("vsftpd"), pki).start()
    yield server
    server.stop()


def test_files_arrive_verified_through_session_reusing_data_connections(
    harness: Harness, vsftpd: Vsftpd
):
    folder = base()
    small = write_file(harness.source / "a.csv", 1000)
    big = write_file(harness.source / "d" / "e" / "big.bin", 9 * MIB + 3)
    empty = write_file(harness.source / "empty.dat", 0)
    _, events = harness.start([vsftpd.destination(folder, checksumAlgorithm="SHA256")])
    wait_until(lambda: len(events.of("file-completed")) == 3, 60, "three files")
    remote = vsftpd.root / folder
    assert (remote / "a.csv").read_bytes() == small
    assert (remote / "d" / "e" / "big.bin").read_bytes() == big
    assert (remote / "empty.dat").read_bytes() == empty
    assert not list(remote.rglob("*.part")), "a temporary file was left behind"
    delivered = {d["file"]: d for d in events.of("file-delivered")}
    assert delivered["d/e/big.bin"]["path"] == f"{UPLOADS}/{folder}/d/e/big.bin"
    assert not (harness.source / "a.csv").exists()
    # vsftpd's own account of it: the uploads, and no data connection refused for want of
    # session reuse.
    log = vsftpd.log.read_text()
    assert log.count("OK UPLOAD") >= 3, log[-2000:]
    assert "session reuse required" not in log


def test_a_client_without_session_reuse_is_refused_by_this_server(explicit: Vsftpd):
    # The control for the test above: stock FTP_TLS fails here, so the server does enforce it.
    import ftplib

    context = ssl.create_default_context(cafile=str(explicit.pki.ca))
    client = ftplib.FTP_TLS(context=context, timeout=10)
    client.connect("127.0.0.1", explicit.port)
    try:
        client.login("anonymous", "x", secure=True)
        client.prot_p()
        with pytest.raises(ftplib.error_perm, match="522"):
            client.nlst()
    finally:
        client.close()


@pytest.mark.slow
def test_a_corrupted_remote_copy_fails_verification_and_is_sent_again(
    harness: Harness, explicit: Vsftpd
):
    folder = base()
    data = write_file(harness.source / "c.bin", 20 * MIB)
    pipeline, events = harness.start(
        [explicit.destination(folder, id="ftps", bandwidthBytesPerSec=8 * MIB)]
    )
    instance = pipeline.instances["line-1"]
    wait_until(lambda: offset(harness, "ftps") >= 8 * MIB, 30, "a recorded offset")
    instance.pause()
    wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
    part = explicit.root / folder / "c.bin.part"
    with part.open("r+b") as copy:
        copy.seek(1000)
        copy.write(bytes(b ^ 0xFF for b in data[1000:1100]))
    instance.resume()
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    failed = events.of("verification-failed")
    assert len(failed) == 1
    assert "differs from the source" in failed[0]["error"]
    assert events.of("file-delivered")[0]["resumedFrom"] == 0
    assert (explicit.root / folder / "c.bin").read_bytes() == data
    assert not part.exists()


@pytest.mark.slow
def test_sigkill_mid_transfer_resumes_with_append(
    broker: Mosquitto, explicit: Vsftpd, tmp_path: Path
):
    source = tmp_path / "source"
    folder = base()
    data = write_file(source / "run.bin", 40 * MIB)
    entry = explicit.destination(folder, id="ftps", bandwidthBytesPerSec=10 * MIB)
    document = {
        "component": {
            "global": {"stateDir": str(tmp_path / "state")},
            "instances": [
                {
                    "id": "line-1",
                    "source": {"path": str(source), "settleSeconds": 0},
                    "egress": [entry],
                }
            ],
        },
        **framework_sections(broker.plain_port, tmp_path),
    }
    config = tmp_path / "egress.json"
    config.write_text(json.dumps(document))
    db = tmp_path / "state" / "gw" / "file-egress" / "egress.sqlite3"
    args = ["-c", str(config), "-t", "gw"]
    remote = explicit.root / folder
    client = listener(broker)
    try:
        inbox = Inbox()
        client.subscribe(f"{document['topic']['root']}/#", inbox)
        first = tmp_path / "first.log"
        with component_process("file-egress", first, *args) as process:
            wait_until(lambda: recorded(db) >= 12 * MIB, 60, "a recorded offset")
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        resumed = recorded(db)
        assert 12 * MIB <= resumed < len(data)
        assert (remote / "run.bin.part").stat().st_size >= resumed
        second = tmp_path / "second.log"
        with component_process("file-egress", second, *args) as process:
            wait_until(lambda: process_events(inbox, "file-completed"), 90, "completion")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, second.read_text()
        delivered = process_events(inbox, "file-delivered")
        assert len(delivered) == 1
        assert delivered[0]["resumedFrom"] == resumed
        assert delivered[0]["bytesSent"] == len(data) - resumed < len(data)
        assert (remote / "run.bin").read_bytes() == data
        assert not (remote / "run.bin.part").exists()
        assert not (source / "run.bin").exists()
    finally:
        client.close(1)
