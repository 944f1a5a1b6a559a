"""The `bucketstore` backend against gcp-storage-emulator: small and chunked uploads
verified by CRC32C (and SHA-256 read back), chunkBytes rounding, a persisted session resumed
after a pause, a corrupted session detected and sent again, a session the server lost, a
server that lies about its offset, a server that is down, a missing bucket, and the token
kept out of logs."""

from __future__ import annotations

import http.server
import json
import logging
import signal
import sqlite3
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import requests

from tests.egress.conftest import MIB, Harness, write_file
from tests.egress.test_component import document
from tests.egress.test_component import issues as component_issues
from tests.egress.test_process import events as process_events
from tests.egress.test_process import listener, query
from tests.egress.test_send import config as send_config
from tests.egress.test_send import run_send
from tests.egress.test_sftp import Vault
from tests.messaging.test_client import Inbox
from tests.support.adapter import framework_sections
from tests.support.gcs import TOKEN, GcsEmulator
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, free_port, wait_until
from unskit.egress.backends import Transfer, open_backend
from unskit.egress.backends.bucketstore import CHUNK_UNIT, chunk_bytes, committed_offset
from unskit.egress.records import Part
from unskit.egress.state import EgressState
from unskit.egress.throttle import Throttle
from unskit.errors import ConfigError, DestinationError, VerificationError

KIB = 1024

# Every test here but the last two talks to an emulator process.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    server = GcsEmulator(tmp_path_factory.mktemp("gcs") / "gcs.log").start()
    yield server
    server.stop()


class Journal:
    """What a backend recorded, in order."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.uploads: list[str | None] = []
        self.total = 0

    def offset(self, offset: int) -> None:
        self.offsets.append(offset)

    def upload(self, upload_id: str | None) -> None:
        self.uploads.append(upload_id)

    def part(self, part: Part) -> None:
        raise AssertionError("bucketstore records no parts")

    def forget_part(self, number: int) -> None:
        raise AssertionError("bucketstore records no parts")

    def sent(self, amount: int) -> None:
        self.total += amount


def transfer(path: Path, relative: str, upload_id: str | None = None) -> Transfer:
    st = path.stat()
    cancel = threading.Event()
    return Transfer(
        source=path,
        relative=PurePosixPath(relative),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        offset=0,
        upload_id=upload_id,
        parts={},
        throttle=Throttle([], cancel),
        cancel=cancel,
        journal=Journal(),
    )


def delivery(harness: Harness, dest: str) -> tuple[int, str | None]:
    """The recorded offset and session URI of the one delivery to `dest` (0, None before)."""
    try:
        with sqlite3.connect(harness.tmp_path / "state" / "egress.sqlite3") as db:
            rows = db.execute(
                "SELECT offset, upload_id FROM deliveries WHERE dest = ?", (dest,)
            ).fetchall()
    except sqlite3.OperationalError:
        return 0, None
    return (int(rows[0][0]), rows[0][1]) if rows else (0, None)


def start_session(gcs: GcsEmulator, name: str, size: int) -> str:
    """A resumable session opened outside the backend (as a crashed run left it)."""
    reply = requests.post(
        f"{gcs.url}/upload/storage/v1/b/{gcs.bucket}/o",
        params={"uploadType": "resumable", "name": name},
        headers={"X-Upload-Content-Length": str(size)},
        json={},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text
    return str(reply.headers["Location"])


def put_range(session: str, data: bytes, start: int, total: int | str) -> requests.Response:
    end = start + len(data) - 1
    return requests.put(
        session, data=data, headers={"Content-Range": f"bytes {start}-{end}/{total}"}, timeout=10
    )


def test_small_chunked_and_empty_files_arrive_verified(
    harness: Harness, gcs: GcsEmulator, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    small = write_file(harness.source / "a.csv", 1000)
    big = write_file(harness.source / "d" / "e" / "big.bin", 5 * MIB + 3)
    empty = write_file(harness.source / "empty.dat", 0)
    _, events = harness.start([gcs.destination(id="gcs", prefix="run-1", chunkBytes=MIB + 12345)])
    wait_until(lambda: len(events.of("file-completed")) == 3, 60, "three files")
    assert gcs.read("run-1/a.csv") == small
    assert gcs.read("run-1/d/e/big.bin") == big
    assert gcs.read("run-1/empty.dat") == empty
    delivered = {d["file"]: d for d in events.of("file-delivered")}
    assert delivered["d/e/big.bin"]["object"] == "run-1/d/e/big.bin"
    assert delivered["d/e/big.bin"]["bytesSent"] == len(big)
    assert not (harness.source / "a.csv").exists()
    assert not (harness.source / "d" / "e" / "big.bin").exists()
    # The session is cleared once the object is verified.
    assert delivery(harness, "gcs")[1] is None
    assert TOKEN not in caplog.text


def test_chunks_are_whole_multiples_of_256_kib(gcs: GcsEmulator, tmp_path: Path):
    assert chunk_bytes(None) == 8 * MIB
    assert chunk_bytes(MIB + 12345) == MIB
    assert chunk_bytes(CHUNK_UNIT + 1) == CHUNK_UNIT
    assert chunk_bytes(1) == CHUNK_UNIT
    data = write_file(tmp_path / "r.bin", 3 * CHUNK_UNIT + 17)
    backend = open_backend(gcs.destination(chunkBytes=CHUNK_UNIT + 100 * KIB), None)
    try:
        job = transfer(tmp_path / "r.bin", "round/r.bin")
        outcome = backend.deliver(job)
    finally:
        backend.close()
    journal = job.journal
    assert isinstance(journal, Journal)
    # Each recorded offset is where a 256 KiB chunk ended; the last chunk finished it.
    assert journal.offsets == [CHUNK_UNIT, 2 * CHUNK_UNIT, 3 * CHUNK_UNIT]
    assert journal.uploads[0] is not None
    assert journal.uploads[-1] is None
    assert outcome.bytes_sent == journal.total == len(data)
    assert gcs.read("round/r.bin") == data


@pytest.mark.parametrize("algorithm", ["CRC32C", "SHA256"])
def test_both_checksum_algorithms_verify(harness: Harness, gcs: GcsEmulator, algorithm: str):
    small = write_file(harness.source / "s.bin", 3000)
    big = write_file(harness.source / "b.bin", 2 * MIB + 5)
    _, events = harness.start(
        [gcs.destination(prefix=algorithm, checksumAlgorithm=algorithm, chunkBytes=MIB)]
    )
    wait_until(lambda: len(events.of("file-completed")) == 2, 60, "both files")
    assert gcs.read(f"{algorithm}/s.bin") == small
    assert gcs.read(f"{algorithm}/b.bin") == big
    assert not events.of("verification-failed")


@pytest.mark.slow
def test_a_pause_resumes_the_recorded_session(harness: Harness, gcs: GcsEmulator):
    data = write_file(harness.source / "p.bin", 12 * MIB)
    pipeline, events = harness.start(
        [gcs.destination(id="gcs", prefix="pause", chunkBytes=MIB, bandwidthBytesPerSec=4 * MIB)]
    )
    instance = pipeline.instances["line-1"]
    wait_until(lambda: delivery(harness, "gcs")[0] >= 3 * MIB, 30, "a recorded offset")
    instance.pause()
    wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
    offset, session = delivery(harness, "gcs")
    assert session is not None
    assert offset < len(data)
    instance.resume()
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    delivered = events.of("file-delivered")[0]
    assert delivered["resumedFrom"] >= offset > 0
    assert delivered["bytesSent"] == len(data) - delivered["resumedFrom"]
    assert gcs.read("pause/p.bin") == data


@pytest.mark.slow
def test_a_corrupted_session_fails_verification_and_is_sent_again(
    harness: Harness, gcs: GcsEmulator
):
    data = write_file(harness.source / "c.bin", 12 * MIB)
    pipeline, events = harness.start(
        [gcs.destination(id="gcs", prefix="bad", chunkBytes=MIB, bandwidthBytesPerSec=4 * MIB)]
    )
    instance = pipeline.instances["line-1"]
    wait_until(lambda: delivery(harness, "gcs")[0] >= 2 * MIB, 30, "a recorded offset")
    instance.pause()
    wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
    offset, session = delivery(harness, "gcs")
    assert session is not None
    # Someone else's bytes land in the session where the source's next chunk belongs.
    wrong = bytes(b ^ 0xFF for b in data[offset : offset + MIB])
    assert put_range(session, wrong, offset, len(data)).status_code == 308
    instance.resume()
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    failed = events.of("verification-failed")
    assert len(failed) == 1
    assert "differs from the source" in failed[0]["error"]
    delivered = events.of("file-delivered")[0]
    assert delivered["resumedFrom"] == 0
    assert delivered["bytesSent"] == len(data)
    assert gcs.read("bad/c.bin") == data


@pytest.mark.parametrize("intact", [True, False])
def test_a_session_finished_before_a_crash_is_verified_not_sent_again(
    harness: Harness, gcs: GcsEmulator, tmp_path: Path, intact: bool
):
    data = write_file(harness.source / "m.bin", 3 * MIB)
    name = f"done-{intact}/m.bin"
    session = start_session(gcs, name, len(data))
    # The crash came after the last chunk and before the verification was recorded; this
    # server then forgets the finished session, so the object itself is checked.
    stored = data if intact else data[:-1] + b"\0"
    assert put_range(session, stored, 0, len(data)).status_code == 200
    st = (harness.source / "m.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "m.bin", st.st_size, st.st_mtime_ns, ["gcs"])
    state.save_upload(file_id, "gcs", session)
    state.save_offset(file_id, "gcs", 2 * MIB, 2 * MIB)
    state.close()
    _, events = harness.start([gcs.destination(id="gcs", prefix=f"done-{intact}", chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the completion")
    delivered = events.of("file-delivered")[0]
    assert delivered["bytesSent"] == (0 if intact else len(data))
    assert delivered["resumedFrom"] == (len(data) if intact else 0)
    assert delivered.get("alreadyDelivered", False) is intact
    assert gcs.read(name) == data


@pytest.mark.slow
def test_a_session_the_server_lost_starts_again_from_zero(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    server = GcsEmulator(tmp_path / "lost.log").start()
    try:
        data = write_file(harness.source / "l.bin", 10 * MIB)
        pipeline, events = harness.start(
            [server.destination(id="gcs", chunkBytes=MIB, bandwidthBytesPerSec=4 * MIB)]
        )
        instance = pipeline.instances["line-1"]
        wait_until(lambda: delivery(harness, "gcs")[0] >= 2 * MIB, 30, "a recorded offset")
        instance.pause()
        wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
        assert delivery(harness, "gcs")[1] is not None
        # In memory: the restarted server knows no session.
        server.stop()
        server.start()
        instance.resume()
        wait_until(lambda: events.of("file-completed"), 60, "completion")
        delivered = events.of("file-delivered")[0]
        assert delivered["resumedFrom"] == 0
        assert delivered["bytesSent"] == len(data)
        assert server.read("l.bin") == data
        assert server.names() == ["l.bin"]
    finally:
        server.stop()
    lost = [r for r in caplog.records if "no longer known" in r.getMessage()]
    assert len(lost) == 1


def test_a_server_that_lies_about_its_offset_gets_a_new_session(
    harness: Harness, gcs: GcsEmulator, tmp_path: Path
):
    data = write_file(harness.source / "o.bin", 2 * MIB)
    # A session that holds nothing: this server answers the status query with
    # "Range: bytes=0-0" (one byte it does not have), then refuses the chunk that follows.
    session = start_session(gcs, "lie/o.bin", len(data))
    st = (harness.source / "o.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "o.bin", st.st_size, st.st_mtime_ns, ["gcs"])
    state.save_upload(file_id, "gcs", session)
    state.close()
    _, events = harness.start([gcs.destination(id="gcs", prefix="lie", chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the completion")
    retries = events.of("delivery-retry")
    assert len(retries) == 1
    assert "chunk refused" in retries[0]["error"]
    assert "starting a new session" in retries[0]["error"]
    # The session URI is a capability: not in the event.
    assert urllib.parse.urlsplit(session).query.split("upload_id=")[1] not in retries[0]["error"]
    delivered = events.of("file-delivered")[0]
    assert delivered["resumedFrom"] == 0
    assert gcs.read("lie/o.bin") == data


def test_a_session_holding_more_than_the_file_is_not_taken_for_it(gcs: GcsEmulator, tmp_path: Path):
    data = write_file(tmp_path / "x.bin", 600 * KIB)
    session = start_session(gcs, "beyond/x.bin", 2 * MIB)
    assert put_range(session, bytes(MIB), 0, "*").status_code == 308
    backend = open_backend(gcs.destination(chunkBytes=CHUNK_UNIT), None)
    try:
        job = transfer(tmp_path / "x.bin", "beyond/x.bin", upload_id=session)
        # This server finishes the object from the first 600 KiB it holds when asked for
        # the status of a 600 KiB upload: verification catches it; the worker resets it.
        with pytest.raises(VerificationError, match="differs from the source"):
            backend.deliver(job)
        assert isinstance(job.journal, Journal)
        assert job.journal.uploads == [None]
        outcome = backend.deliver(transfer(tmp_path / "x.bin", "beyond/x.bin"))
    finally:
        backend.close()
    assert outcome.bytes_sent == len(data)
    assert gcs.read("beyond/x.bin") == data


def test_a_server_that_is_down_holds_only_its_own_delivery(harness: Harness, tmp_path: Path):
    data = write_file(harness.source / "f.bin", 2 * MIB)
    later = GcsEmulator(tmp_path / "later.log", port=free_port())
    out = tmp_path / "out"
    _, events = harness.start(
        [{"type": "local", "path": str(out)}, later.destination(id="gcs", chunkBytes=MIB)]
    )
    wait_until(lambda: events.of("file-delivered"), 30, "the local delivery")
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 30, "retries of the server")
    assert "ConnectionError" in events.of("delivery-retry")[0]["error"]
    assert (out / "f.bin").read_bytes() == data
    assert (harness.source / "f.bin").exists()
    later.start()
    try:
        wait_until(lambda: events.of("file-completed"), 60, "completion once the server is up")
        assert later.read("f.bin") == data
    finally:
        later.stop()
    assert [d["destination"] for d in events.of("file-delivered")] == ["local-1", "gcs"]
    assert not (harness.source / "f.bin").exists()


def test_a_missing_bucket_is_a_clear_retried_error(harness: Harness, gcs: GcsEmulator):
    write_file(harness.source / "small.bin", 100)
    write_file(harness.source / "large.bin", MIB + 1)
    _, events = harness.start([gcs.destination(id="gcs", bucket="no-such-bucket", chunkBytes=MIB)])
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 30, "retries of both files")
    for retry in events.of("delivery-retry"):
        assert "bucket 'no-such-bucket' not found" in retry["error"]
    assert not events.of("file-delivered")
    assert (harness.source / "small.bin").exists()


def test_a_credentials_bundle_holds_the_token_and_no_log_shows_it(
    gcs: GcsEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    secret = "ya29.bundle-token-never-shown"
    settings = gcs.destination(credentials={"$secret": "gcs-login"})
    del settings["accessToken"]
    backend = open_backend(settings, Vault({"gcs-login": {"accessToken": secret}}))
    try:
        assert secret not in repr(backend)
        assert secret not in repr(vars(backend))
        data = write_file(tmp_path / "t.bin", MIB + 5)
        backend.deliver(transfer(tmp_path / "t.bin", "bundle/t.bin"))
        assert gcs.read("bundle/t.bin") == data
    finally:
        backend.close()
    assert secret not in caplog.text


def test_configuration_rules_and_a_missing_extra(monkeypatch: pytest.MonkeyPatch):
    def issues(**entry: Any) -> list[str]:
        return component_issues(document({"type": "bucketstore", "bucket": "bkt", **entry}))

    at = "$.component.instances[0].egress[0]"
    assert issues(accessToken="t") == []
    assert issues(anonymous=True, chunkBytes=CHUNK_UNIT) == []
    assert issues() == [f"{at}.accessToken: required unless credentials or anonymous is set"]
    assert issues(anonymous=True, accessToken="t") == [
        f"{at}.accessToken: not allowed with anonymous"
    ]
    assert issues(accessToken="t", chunkBytes=1000) == [
        f"{at}.chunkBytes: must be an integer of at least 262144 (256 KiB)"
    ]
    assert issues(accessToken="t", credentials="plain") == [
        f"{at}.credentials: must be an object, not a string"
    ]
    # Without its extra, the backend is refused at start with the command that installs it.
    monkeypatch.setitem(sys.modules, "requests", None)
    monkeypatch.delitem(sys.modules, "unskit.egress.backends.bucketstore", raising=False)
    assert issues(accessToken="t") == [
        f"{at}.type: backend 'bucketstore' needs the 'requests' package, which is not "
        "installed: pip install 'unskit[bucketstore]'"
    ]
    with pytest.raises(ConfigError, match=r"pip install 'unskit\[bucketstore\]'"):
        open_backend({"type": "bucketstore", "bucket": "bkt", "anonymous": True}, None)


def test_the_committed_range_is_read_from_the_reply():
    reply = requests.Response()
    reply.status_code = 308
    assert committed_offset(reply) == 0
    reply.headers["Range"] = "bytes=0-262143"
    assert committed_offset(reply) == CHUNK_UNIT
    reply.headers["Range"] = "bytes=5-9"
    with pytest.raises(DestinationError, match="unreadable Range"):
        committed_offset(reply)


@pytest.mark.slow
def test_sigkill_mid_transfer_continues_the_persisted_session(
    broker: Mosquitto, gcs: GcsEmulator, tmp_path: Path
):
    source = tmp_path / "source"
    data = write_file(source / "batch" / "run.bin", 40 * MIB)
    document = {
        "component": {
            "global": {"stateDir": str(tmp_path / "state")},
            "instances": [
                {
                    "id": "line-1",
                    "source": {"path": str(source), "settleSeconds": 0},
                    "egress": [
                        gcs.destination(
                            id="gcs", prefix="kill", chunkBytes=MIB, bandwidthBytesPerSec=8 * MIB
                        )
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

    def recorded() -> tuple[int, str | None]:
        try:
            rows = query(db, "SELECT offset, upload_id FROM deliveries WHERE dest = 'gcs'")
        except sqlite3.OperationalError:  # the schema is not created yet
            return 0, None
        return (int(rows[0][0]), rows[0][1]) if rows else (0, None)

    client = listener(broker)
    try:
        inbox = Inbox()
        client.subscribe(f"{document['topic']['root']}/#", inbox)
        first = tmp_path / "first.log"
        with component_process("file-egress", first, *args) as process:
            wait_until(lambda: recorded()[0] >= 8 * MIB, 60, "a recorded offset")
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        resumed, session = recorded()
        assert 8 * MIB <= resumed < len(data)
        assert session is not None
        # An unfinished session is no object: nothing half-written is visible.
        assert "kill/batch/run.bin" not in gcs.names()
        assert (source / "batch" / "run.bin").exists()
        assert not process_events(inbox, "file-delivered")

        second = tmp_path / "second.log"
        with component_process("file-egress", second, *args) as process:
            wait_until(lambda: process_events(inbox, "file-completed"), 90, "completion")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, second.read_text()
        delivered = process_events(inbox, "file-delivered")
        assert len(delivered) == 1
        # The server may hold one chunk more than was recorded before the kill.
        assert resumed <= delivered[0]["resumedFrom"] <= resumed + MIB
        assert delivered[0]["bytesSent"] == len(data) - delivered[0]["resumedFrom"]
        assert delivered[0]["bytesSent"] < len(data)
        assert gcs.read("kill/batch/run.bin") == data
        assert [n for n in gcs.names() if n.startswith("kill/")] == ["kill/batch/run.bin"]
        assert not (source / "batch" / "run.bin").exists()
        assert recorded()[1] is None
        for path in (first, second):
            assert TOKEN not in path.read_text(), f"the token in {path.name}"
    finally:
        client.close(1)


def test_send_delivers_to_the_bucket_and_keeps_the_files(gcs: GcsEmulator, tmp_path: Path):
    data = {
        name: write_file(tmp_path / "in" / name, size)
        for name, size in (("a.csv", 1000), ("b.bin", 3 * MIB + 1))
    }
    cfg = send_config(tmp_path, gcs.destination(id="gcs", prefix="sent", chunkBytes=MIB))
    files = [str(tmp_path / "in" / name) for name in data]
    result = run_send(*files, "--config", str(cfg), "-t", "gw", "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    for name, content in data.items():
        assert gcs.read(f"sent/{name}") == content
        assert (tmp_path / "in" / name).exists()
    assert result.stdout.count("verified") == 2
    assert TOKEN not in result.stdout + result.stderr


class Refuser:
    """A loopback HTTP server that answers every request with one status and records the
    Authorization headers: the emulator checks no credentials and never fails on purpose."""

    def __init__(self, status: int, message: str) -> None:
        seen: list[str | None] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append(self.headers.get("Authorization"))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps({"error": {"code": status, "message": message}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815 (http.server's names)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Refuser:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def test_refused_credentials_are_a_clear_error_without_the_token(tmp_path: Path):
    write_file(tmp_path / "w.bin", 1000)
    with Refuser(401, "Invalid Credentials") as server:
        backend = open_backend(
            {
                "type": "bucketstore",
                "bucket": "bkt",
                "endpointUrl": server.url,
                "accessToken": TOKEN,
            },
            None,
        )
        try:
            with pytest.raises(DestinationError) as refused:
                backend.deliver(transfer(tmp_path / "w.bin", "w.bin"))
        finally:
            backend.close()
        anonymous = open_backend(
            {"type": "bucketstore", "bucket": "bkt", "endpointUrl": server.url, "anonymous": True},
            None,
        )
        try:
            with pytest.raises(DestinationError):
                anonymous.deliver(transfer(tmp_path / "w.bin", "w.bin"))
        finally:
            anonymous.close()
    assert "the credentials were refused (401 Unauthorized: Invalid Credentials)" in str(
        refused.value
    )
    assert TOKEN not in str(refused.value)
    assert server.seen == [f"Bearer {TOKEN}", None]


def test_a_server_error_keeps_the_session_for_the_next_attempt(gcs: GcsEmulator, tmp_path: Path):
    write_file(tmp_path / "e.bin", 2 * MIB)
    with Refuser(503, "Backend Error") as server:
        # A session the emulator started, continued through a server that answers 503.
        session = start_session(gcs, "storm/e.bin", 2 * MIB).replace(gcs.url, server.url)
        backend = open_backend(
            {"type": "bucketstore", "bucket": "bkt", "endpointUrl": server.url, "anonymous": True},
            None,
        )
        try:
            job = transfer(tmp_path / "e.bin", "storm/e.bin", upload_id=session)
            with pytest.raises(DestinationError, match="503 Service Unavailable: Backend Error"):
                backend.deliver(job)
        finally:
            backend.close()
    # Nothing was forgotten: the next attempt asks the session again.
    assert isinstance(job.journal, Journal)
    assert job.journal.uploads == []


@pytest.mark.slow
@pytest.mark.parametrize("where", ["destination", "instance"])
def test_the_bandwidth_limits_hold(harness: Harness, gcs: GcsEmulator, where: str):
    data = write_file(harness.source / "bw.bin", 6 * MIB)
    limit = 2 * MIB
    settings = {"bandwidthBytesPerSec": limit} if where == "destination" else {}
    started = time.monotonic()
    _, events = harness.start(
        [gcs.destination(prefix=f"bw-{where}", chunkBytes=CHUNK_UNIT, **settings)],
        bandwidth=limit if where == "instance" else 0,
    )
    wait_until(lambda: events.of("file-completed"), 30, "completion")
    elapsed = time.monotonic() - started
    # The bucket starts empty and lets a quarter second of burst through.
    assert elapsed >= (len(data) - limit / 4) / limit * 0.95, elapsed
    # Progress was reported while it went, not only at the end.
    partial = [p["bytesSent"] for p in events.of("file-progress") if p["bytesSent"] < len(data)]
    assert len(partial) >= 3
    assert partial == sorted(partial)
    assert gcs.read(f"bw-{where}/bw.bin") == data
