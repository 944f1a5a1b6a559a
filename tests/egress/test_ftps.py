"""The `ftps` backend against pyftpdlib's TLS_FTPHandler, explicit and implicit TLS: a
verified delivery, a SIGKILL mid-transfer resumed with APPE, a corrupted remote copy
detected and sent again, an untrusted certificate refused, a server that is down holding
only its own delivery."""

from __future__ import annotations

import json
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.egress.test_process import events as process_events
from tests.egress.test_process import listener, query
from tests.messaging.test_client import Inbox
from tests.support.adapter import framework_sections
from tests.support.ftps import PASSWORD, USER, FtpsServer
from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki
from tests.support.servers import component_process, free_port, wait_until
from tests.support.tiers import server_fixture


@server_fixture(scope="module", params=["explicit", "implicit"])
def ftps(request: pytest.FixtureRequest, pki: Pki, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ftproot")
    server = FtpsServer(root, pki, implicit=request.param == "implicit").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def explicit(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FtpsServer]:
    server = FtpsServer(tmp_path_factory.mktemp("ftproot"), pki).start()
    yield server
    server.stop()


def base() -> str:
    return f"t-{uuid.uuid4().hex[:8]}/in"


def offset(harness: Harness, dest: str) -> int:
    try:
        with sqlite3.connect(harness.tmp_path / "state" / "egress.sqlite3") as db:
            rows = db.execute("SELECT offset FROM deliveries WHERE dest = ?", (dest,)).fetchall()
    except sqlite3.OperationalError:
        return 0
    return int(rows[0][0]) if rows else 0


def test_files_arrive_verified_and_the_source_goes_only_then(harness: Harness, ftps: FtpsServer):
    folder = base()
    small = write_file(harness.source / "a.csv", 1000)
    big = write_file(harness.source / "d" / "e" / "big.bin", 9 * MIB + 3)
    empty = write_file(harness.source / "empty.dat", 0)
    _, events = harness.start([ftps.destination(folder, checksumAlgorithm="CRC32C")])
    wait_until(lambda: len(events.of("file-completed")) == 3, 60, "three files")
    remote = ftps.root / folder
    assert (remote / "a.csv").read_bytes() == small
    assert (remote / "d" / "e" / "big.bin").read_bytes() == big
    assert (remote / "empty.dat").read_bytes() == empty
    assert not list(remote.rglob("*.part")), "a temporary file was left behind"
    delivered = {d["file"]: d for d in events.of("file-delivered")}
    assert delivered["d/e/big.bin"]["path"] == f"{folder}/d/e/big.bin"
    assert delivered["d/e/big.bin"]["bytesSent"] == len(big)
    assert not (harness.source / "a.csv").exists()
    assert not (harness.source / "d" / "e" / "big.bin").exists()


def test_a_certificate_from_an_untrusted_ca_is_refused(harness: Harness, ftps: FtpsServer):
    folder = base()
    write_file(harness.source / "x.bin", 1000)
    _, events = harness.start([ftps.destination(folder, caPath=str(ftps.pki.other_ca))])
    wait_until(lambda: events.of("delivery-retry"), 30, "the refusal")
    error = events.of("delivery-retry")[0]["error"]
    assert "TLS handshake refused: certificate verify failed" in error, error
    assert not events.of("file-delivered")
    assert not (ftps.root / folder).exists()
    assert (harness.source / "x.bin").exists()


@pytest.mark.slow
def test_a_corrupted_remote_copy_fails_verification_and_is_sent_again(
    harness: Harness, explicit: FtpsServer
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
    assert part.stat().st_size >= offset(harness, "ftps")
    with part.open("r+b") as copy:
        copy.seek(1000)
        copy.write(bytes(b ^ 0xFF for b in data[1000:1100]))
    instance.resume()
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    failed = events.of("verification-failed")
    assert len(failed) == 1
    assert "differs from the source" in failed[0]["error"]
    delivered = events.of("file-delivered")[0]
    # The resumed attempt failed verification; the next one sent the whole file again.
    assert delivered["resumedFrom"] == 0
    assert delivered["bytesSent"] == len(data)
    assert (explicit.root / folder / "c.bin").read_bytes() == data
    assert not part.exists()


def test_a_server_that_is_down_holds_only_its_own_delivery(
    harness: Harness, pki: Pki, tmp_path: Path
):
    data = write_file(harness.source / "f.bin", 2 * MIB)
    later = FtpsServer(tmp_path / "later", pki, port=free_port())
    out = tmp_path / "out"
    _, events = harness.start(
        [{"type": "local", "path": str(out)}, later.destination("in", id="ftps")]
    )
    wait_until(lambda: events.of("file-delivered"), 30, "the local delivery")
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 30, "retries of the ftps server")
    assert (out / "f.bin").read_bytes() == data
    assert (harness.source / "f.bin").exists()
    later.start()
    try:
        wait_until(lambda: events.of("file-completed"), 60, "completion once the server is up")
    finally:
        later.stop()
    assert (tmp_path / "later" / "in" / "f.bin").read_bytes() == data
    assert [d["destination"] for d in events.of("file-delivered")] == ["local-1", "ftps"]
    assert not (harness.source / "f.bin").exists()


@pytest.mark.slow
def test_sigkill_mid_transfer_resumes_from_the_recorded_offset(
    broker: Mosquitto, explicit: FtpsServer, tmp_path: Path
):
    source = tmp_path / "source"
    folder = base()
    data = write_file(source / "batch" / "run.bin", 50 * MIB)
    document = {
        "component": {
            "global": {"stateDir": str(tmp_path / "state")},
            "instances": [
                {
                    "id": "line-1",
                    "source": {"path": str(source), "settleSeconds": 0},
                    "egress": [
                        explicit.destination(folder, id="ftps", bandwidthBytesPerSec=10 * MIB)
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
    remote = explicit.root / folder / "batch"
    client = listener(broker)
    try:
        inbox = Inbox()
        client.subscribe(f"{document['topic']['root']}/#", inbox)
        first = tmp_path / "first.log"
        with component_process("file-egress", first, *args) as process:
            wait_until(lambda: recorded(db) >= 16 * MIB, 60, "a recorded offset")
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        resumed = recorded(db)
        assert 16 * MIB <= resumed < len(data)
        # The segment in flight may have left more than was recorded.
        assert (remote / "run.bin.part").stat().st_size >= resumed
        assert not (remote / "run.bin").exists()
        assert (source / "batch" / "run.bin").exists()
        assert not process_events(inbox, "file-delivered")

        second = tmp_path / "second.log"
        with component_process("file-egress", second, *args) as process:
            wait_until(lambda: process_events(inbox, "file-completed"), 90, "completion")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, second.read_text()
        delivered = process_events(inbox, "file-delivered")
        assert len(delivered) == 1
        assert delivered[0]["resumedFrom"] == resumed
        assert delivered[0]["bytesSent"] == len(data) - resumed
        kinds = [m.body.get("type") for _, m in list(inbox.items) if isinstance(m.body, dict)]
        assert kinds.index("file-completed") > kinds.index("file-delivered")
        assert (remote / "run.bin").read_bytes() == data
        assert not (source / "batch" / "run.bin").exists()
        for path in (first, second):
            assert PASSWORD not in path.read_text(), f"the password in {path.name}"
    finally:
        client.close(1)


def recorded(db: Path) -> int:
    try:
        rows = query(db, "SELECT offset FROM deliveries WHERE dest = 'ftps'")
    except sqlite3.OperationalError:  # the schema is not created yet
        return 0
    return int(rows[0][0]) if rows else 0


def test_active_mode_delivers_too(harness: Harness, explicit: FtpsServer):
    folder = base()
    data = write_file(harness.source / "a.bin", 3 * MIB)
    _, events = harness.start([explicit.destination(folder, passive=False)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert (explicit.root / folder / "a.bin").read_bytes() == data


def test_data_connections_resume_the_control_connections_tls_session(ftps: FtpsServer):
    import ssl

    from unskit.egress.backends.ftps import _Client

    client = _Client(ssl.create_default_context(cafile=str(ftps.pki.ca)), ftps.implicit)
    client.connect("127.0.0.1", ftps.port)
    try:
        # Implicit TLS wraps the socket before the greeting; explicit only at AUTH TLS.
        assert isinstance(client.sock, ssl.SSLSocket) == ftps.implicit
        client.login(USER, PASSWORD, secure=True)
        assert isinstance(client.sock, ssl.SSLSocket)
        client.prot_p()
        for _ in range(2):
            conn = client.transfercmd("LIST")
            try:
                while conn.recv(4096):
                    pass
                assert isinstance(conn, ssl.SSLSocket)
                assert conn.session_reused
            finally:
                conn.close()
            client.voidresp()
    finally:
        client.close()


@pytest.mark.integration
def test_a_credentials_bundle_logs_in(explicit: FtpsServer, tmp_path: Path):
    from tests.egress.test_sftp import Vault
    from unskit.egress.backends import open_backend
    from unskit.errors import DestinationError

    settings = explicit.destination("in")
    del settings["username"], settings["password"]
    settings["credentials"] = {"$secret": "ftp-login"}
    vault = Vault({"ftp-login": {"username": USER, "password": PASSWORD}})
    backend = open_backend(settings, vault)
    try:
        assert backend.connect().pwd() == "/"  # type: ignore[attr-defined]
    finally:
        backend.close()
    wrong = Vault({"ftp-login": {"username": USER, "password": "wrong-password-value"}})
    backend = open_backend(settings, wrong)
    try:
        with pytest.raises(DestinationError, match="530") as refused:
            backend.connect()  # type: ignore[attr-defined]
        assert "wrong-password-value" not in str(refused.value)
    finally:
        backend.close()


@pytest.mark.parametrize("intact", [True, False])
def test_a_copy_renamed_before_a_crash_is_verified_not_sent_again(
    harness: Harness, explicit: FtpsServer, tmp_path: Path, intact: bool
):
    from unskit.egress.state import EgressState

    folder = base()
    data = write_file(harness.source / "m.bin", 3 * MIB)
    remote = explicit.root / folder
    remote.mkdir(parents=True)
    # The crash came after the rename and before the verification was recorded.
    (remote / "m.bin").write_bytes(data if intact else data[:-1] + b"\0")
    st = (harness.source / "m.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "m.bin", st.st_size, st.st_mtime_ns, ["ftps"])
    state.save_offset(file_id, "ftps", st.st_size, st.st_size)
    state.close()
    _, events = harness.start([explicit.destination(folder, id="ftps")])
    wait_until(lambda: events.of("file-completed"), 30, "the completion")
    delivered = events.of("file-delivered")[0]
    assert delivered["bytesSent"] == (0 if intact else len(data))
    assert delivered.get("alreadyDelivered", False) is intact
    assert (remote / "m.bin").read_bytes() == data
