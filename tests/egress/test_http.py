"""The `http` backend against Apache httpd with mod_dav (ranged PUT, Basic authentication)
and a small in-process upload server (POST, a server that cannot resume or lies about its
offset, a 5xx storm, bearer tokens, digest headers): verified deliveries, resume after
SIGKILL, a server down then back, a corrupted remote copy sent again, odd file names."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.egress.test_process import events as process_events
from tests.egress.test_process import listener, query
from tests.egress.test_send import config as send_config
from tests.egress.test_send import run_send
from tests.egress.test_sftp import Vault
from tests.messaging.test_client import Inbox
from tests.support.adapter import framework_sections
from tests.support.httpd import PASSWORD, TOKEN, USER, Httpd, UploadServer
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, free_port, wait_until
from tests.support.tiers import server_fixture
from unskit.egress.backends import open_backend
from unskit.egress.state import EgressState


@server_fixture(scope="module")
def httpd() -> Iterator[Httpd]:
    server = Httpd().start()
    yield server
    server.remove()


@server_fixture
def upload() -> Iterator[UploadServer]:
    server = UploadServer().start()
    yield server
    server.stop()


@pytest.fixture
def area(httpd: Httpd, request: pytest.FixtureRequest) -> str:
    """A fresh folder under /dav/ for one test (the server is shared by the module)."""
    name = request.node.name.replace("[", "-").replace("]", "")[:60]
    (httpd.www / "dav" / name).mkdir()
    shutil.chown(httpd.www / "dav" / name, *_owner(httpd.www / "dav"))
    return f"dav/{name}"


def offset(harness: Harness, dest: str) -> int:
    try:
        with sqlite3.connect(harness.tmp_path / "state" / "egress.sqlite3") as db:
            rows = db.execute("SELECT offset FROM deliveries WHERE dest = ?", (dest,)).fetchall()
    except sqlite3.OperationalError:
        return 0
    return int(rows[0][0]) if rows else 0


def seed(tmp_path: Path, source: Path, rel: str, dest: str, recorded: int) -> None:
    """A delivery queued before with `recorded` bytes recorded as at the destination."""
    st = (source / rel).stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", rel, st.st_size, st.st_mtime_ns, [dest])
    state.save_offset(file_id, dest, recorded, recorded)
    state.close()


def test_put_in_chunks_arrives_verified_and_the_source_goes_only_then(
    harness: Harness, httpd: Httpd, area: str
):
    small = write_file(harness.source / "a.csv", 1000)
    big = write_file(harness.source / "d" / "e" / "big.bin", 9 * MIB + 3)
    empty = write_file(harness.source / "empty.dat", 0)
    _, events = harness.start([httpd.destination(area, id="web", chunkBytes=2 * MIB)])
    wait_until(lambda: len(events.of("file-completed")) == 3, 60, "three files")
    root = httpd.www / area
    assert (root / "a.csv").read_bytes() == small
    assert (root / "d" / "e" / "big.bin").read_bytes() == big
    assert (root / "empty.dat").read_bytes() == empty
    assert not httpd.leftovers()
    delivered = {d["file"]: d for d in events.of("file-delivered")}
    assert delivered["d/e/big.bin"]["url"] == f"{httpd.url}/{area}/d/e/big.bin"
    assert delivered["d/e/big.bin"]["bytesSent"] == len(big)
    assert not (harness.source / "a.csv").exists()
    assert not (harness.source / "d" / "e" / "big.bin").exists()


@pytest.mark.parametrize("algorithm", ["CRC32C", "SHA256"])
@pytest.mark.parametrize("digest", [True, False])
def test_verification_uses_a_reported_digest_or_reads_the_copy_back(
    harness: Harness, upload: UploadServer, algorithm: str, digest: bool
):
    data = write_file(harness.source / "v.bin", 3 * MIB + 5)
    upload.behaviour.digest = digest
    _, events = harness.start([upload.destination(checksumAlgorithm=algorithm, chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert upload.files["/up/v.bin"] == data
    assert upload.count("PUT") == 4
    # With a digest header the copy is not read back; without, it is read in ranges
    # (behind the upload) that cover it exactly once.
    gets = [h["Range"] for m, _, h in upload.requests if m == "GET"]
    if digest:
        assert gets == []
    else:
        ranges = [tuple(map(int, g.removeprefix("bytes=").split("-"))) for g in gets]
        assert ranges[0][0] == 0
        assert ranges[-1][1] == len(data) - 1
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))


def test_a_server_ignoring_ranged_gets_is_read_back_whole(harness: Harness, upload: UploadServer):
    data = write_file(harness.source / "g.bin", 3 * MIB)
    upload.behaviour.whole_gets = True
    _, events = harness.start([upload.destination(chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert upload.files["/up/g.bin"] == data
    gets = [h.get("Range") for m, _, h in upload.requests if m == "GET"]
    # The read-back behind the upload got a 200 for its first range and stopped; the copy
    # was then read whole.
    assert gets[-1] == f"bytes=0-{len(data) - 1}"
    assert len(gets) == 2


@pytest.mark.parametrize("algorithm", ["CRC32C", "SHA256"])
def test_a_server_reporting_a_wrong_digest_fails_verification(
    harness: Harness, upload: UploadServer, algorithm: str
):
    write_file(harness.source / "w.bin", 100_000)
    upload.behaviour.digest = True
    upload.behaviour.corrupt = True  # stores (and digests) a copy with its first byte flipped
    _, events = harness.start(
        [upload.destination(id="web", checksumAlgorithm=algorithm)],
    )
    wait_until(lambda: len(events.of("verification-failed")) >= 2, 30, "failed verifications")
    error = events.of("verification-failed")[0]["error"]
    assert f"the copy's {algorithm} (reported by the server) differs" in error
    assert not events.of("file-delivered")
    assert (harness.source / "w.bin").exists()
    # Each failed copy was deleted before the next attempt.
    assert upload.count("DELETE") >= 1


def test_post_is_single_shot(harness: Harness, upload: UploadServer):
    data = write_file(harness.source / "p" / "post.bin", 3 * MIB)
    _, events = harness.start([upload.destination(method="POST", chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert upload.files["/up/p/post.bin"] == data
    assert upload.count("POST") == 1
    assert upload.count("PUT") == 0
    delivered = events.of("file-delivered")[0]
    assert delivered["bytesSent"] == len(data)
    assert delivered["resumedFrom"] == 0


def test_post_ignores_a_recorded_offset(harness: Harness, upload: UploadServer, tmp_path: Path):
    data = write_file(harness.source / "r.bin", 2 * MIB)
    seed(tmp_path, harness.source, "r.bin", "web", MIB)
    _, events = harness.start([upload.destination(id="web", method="POST")])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert upload.files["/up/r.bin"] == data
    assert events.of("file-delivered")[0]["bytesSent"] == len(data)


def test_odd_file_names_are_percent_encoded(harness: Harness, httpd: Httpd, area: str):
    names = ["a b#c?d%e&f+g.bin", "dir with space/x;y=z @ü.csv", "100%/[x].txt"]
    data = {name: write_file(harness.source / name, 1000 + i) for i, name in enumerate(names)}
    _, events = harness.start([httpd.destination(area)])
    wait_until(lambda: len(events.of("file-completed")) == 3, 30, "three files")
    for name, content in data.items():
        assert (httpd.www / area / name).read_bytes() == content
    urls = {d["file"]: d["url"] for d in events.of("file-delivered")}
    assert urls["a b#c?d%e&f+g.bin"].endswith("/a%20b%23c%3Fd%25e%26f%2Bg.bin")
    assert urls["dir with space/x;y=z @ü.csv"].endswith(
        "/dir%20with%20space/x%3By%3Dz%20%40%C3%BC.csv"
    )


def test_basic_credentials_deliver_and_wrong_ones_are_refused_clearly(
    harness: Harness, httpd: Httpd, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    data = write_file(harness.source / "s.bin", 2 * MIB)
    wrong = "not-the-password-value"
    _, events = harness.start(
        [
            httpd.destination("secure", id="good", username=USER, password=PASSWORD),
            httpd.destination("secure/", id="bad", username=USER, password=wrong),
        ]
    )
    wait_until(lambda: events.of("file-delivered"), 30, "the good delivery")
    wait_until(
        lambda: len([r for r in events.of("delivery-retry") if r["destination"] == "bad"]) >= 2,
        30,
        "retries of the refused one",
    )
    error = next(r for r in events.of("delivery-retry") if r["destination"] == "bad")["error"]
    assert "HTTP 401" in error
    assert "check the credentials" in error
    assert (httpd.www / "secure" / "s.bin").read_bytes() == data
    assert (harness.source / "s.bin").exists(), "completed although one destination refused"
    assert not events.of("file-completed")
    text = caplog.text + json.dumps(events.items)
    assert PASSWORD not in text
    assert wrong not in text


def test_bearer_tokens_and_bundles_authenticate_and_never_show(
    harness: Harness, upload: UploadServer, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    upload.behaviour.authorization = f"Bearer {TOKEN}"
    backend = open_backend(upload.destination(bearerToken=TOKEN), None)
    bundled = open_backend(
        upload.destination(credentials={"$secret": "web"}),
        Vault({"web": {"bearerToken": TOKEN}}),
    )
    for item in (backend, bundled):
        text = repr(item) + repr(vars(item))
        assert TOKEN not in text
        item.close()
    data = write_file(harness.source / "t.bin", 1000)
    _, events = harness.start([upload.destination(bearerToken=TOKEN)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert upload.files["/up/t.bin"] == data
    assert TOKEN not in caplog.text + json.dumps(events.items)


def test_a_5xx_storm_is_retried_until_the_server_recovers(harness: Harness, upload: UploadServer):
    data = write_file(harness.source / "s.bin", 3 * MIB)
    upload.behaviour.storm = 5
    _, events = harness.start([upload.destination(id="web", chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 60, "the file after the storm")
    retries = events.of("delivery-retry")
    assert len(retries) == 5
    assert all("HTTP 503" in r["error"] for r in retries)
    assert upload.files["/up/s.bin"] == data


def test_a_5xx_in_the_middle_keeps_the_recorded_offset(harness: Harness, upload: UploadServer):
    data = write_file(harness.source / "m.bin", 4 * MIB)
    upload.behaviour.storm_status = 500
    _, events = harness.start(
        [upload.destination(id="web", chunkBytes=MIB, bandwidthBytesPerSec=2 * MIB)]
    )
    wait_until(lambda: upload.count("PUT") >= 2, 30, "two chunks")
    with upload.lock:
        upload.behaviour.storm = 1
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert upload.files["/up/m.bin"] == data
    delivered = events.of("file-delivered")[0]
    assert "HTTP 500" in events.of("delivery-retry")[0]["error"]
    # The retry resumed where the server had stopped, not from 0.
    assert delivered["resumedFrom"] > 0
    assert delivered["bytesSent"] < len(data)


def test_the_destination_bandwidth_limit_holds(harness: Harness, upload: UploadServer):
    data = write_file(harness.source / "b.bin", 3 * MIB)
    _, events = harness.start([upload.destination(chunkBytes=MIB, bandwidthBytesPerSec=MIB)])
    started = time.monotonic()
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    # The bucket starts empty with a quarter second of burst: 3 MiB at 1 MiB/s.
    assert time.monotonic() - started >= 2.5
    assert upload.files["/up/b.bin"] == data


def test_a_server_that_cannot_resume_gets_whole_files_logged_once(
    harness: Harness, upload: UploadServer, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="unskit.egress.backends.http")
    names = ("a.bin", "b.bin", "c.bin", "d.bin")
    data = {n: write_file(harness.source / n, 3 * MIB) for n in names}
    upload.behaviour.refuse_ranges = 400
    _, events = harness.start([upload.destination(chunkBytes=MIB)])
    wait_until(lambda: len(events.of("file-completed")) == len(names), 30, "every file")
    for name, content in data.items():
        assert upload.files[f"/up/{name}"] == content
    warnings = [r for r in caplog.records if "cannot resume" in r.getMessage()]
    assert len(warnings) == 1
    assert "HTTP 400" in warnings[0].getMessage()
    # At most one refused ranged PUT per worker (maxConcurrentFiles, default 2): the
    # finding is shared, so the files after went whole at once.
    ranged = [h for m, _, h in upload.requests if m == "PUT" and "Content-Range" in h]
    assert 1 <= len(ranged) <= 2


def test_a_server_lying_about_its_offset_is_caught_by_verification(
    harness: Harness, upload: UploadServer, tmp_path: Path
):
    data = write_file(harness.source / "l.bin", 4 * MIB)
    # The server holds only the first MiB, yet claims two; two MiB were recorded.
    upload.files["/up/l.bin"] = bytearray(data[:MIB])
    upload.behaviour.lie_offset = MIB
    seed(tmp_path, harness.source, "l.bin", "web", 2 * MIB)
    _, events = harness.start([upload.destination(id="web", chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    failed = events.of("verification-failed")
    assert len(failed) == 1
    assert "(read back) differs from the source" in failed[0]["error"]
    delivered = events.of("file-delivered")[0]
    assert delivered["resumedFrom"] == 0
    assert delivered["bytesSent"] == len(data)
    assert upload.files["/up/l.bin"] == data


@pytest.mark.parametrize("intact", [True, False])
def test_a_copy_complete_before_a_crash_is_verified_not_sent_again(
    harness: Harness, upload: UploadServer, tmp_path: Path, intact: bool
):
    data = write_file(harness.source / "m.bin", 3 * MIB)
    # The crash came after the last PUT and before the verification was recorded.
    upload.files["/up/m.bin"] = bytearray(data if intact else data[:-1] + b"\0")
    seed(tmp_path, harness.source, "m.bin", "web", len(data))
    _, events = harness.start([upload.destination(id="web", chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    delivered = events.of("file-delivered")[0]
    assert delivered["bytesSent"] == (0 if intact else len(data))
    assert delivered["resumedFrom"] == (len(data) if intact else 0)
    assert len(events.of("verification-failed")) == (0 if intact else 1)
    # Nothing was left to send: no empty ranged PUT either.
    assert upload.count("PUT") == (0 if intact else 3)
    assert upload.files["/up/m.bin"] == data


def test_a_server_claiming_more_than_the_file_starts_over(
    harness: Harness, upload: UploadServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    data = write_file(harness.source / "o.bin", 2 * MIB)
    upload.files["/up/o.bin"] = bytearray(data[:MIB])
    upload.behaviour.lie_offset = 5 * MIB
    seed(tmp_path, harness.source, "o.bin", "web", MIB)
    _, events = harness.start([upload.destination(id="web", chunkBytes=MIB)])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert "more than the file's" in caplog.text
    assert events.of("file-delivered")[0]["resumedFrom"] == 0
    assert upload.files["/up/o.bin"] == data


@pytest.mark.slow
def test_a_corrupted_remote_copy_fails_verification_and_is_sent_again(
    harness: Harness, httpd: Httpd, area: str
):
    data = write_file(harness.source / "c.bin", 20 * MIB)
    pipeline, events = harness.start(
        [httpd.destination(area, id="web", chunkBytes=2 * MIB, bandwidthBytesPerSec=8 * MIB)]
    )
    instance = pipeline.instances["line-1"]
    wait_until(lambda: offset(harness, "web") >= 8 * MIB, 30, "a recorded offset")
    instance.pause()
    wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
    copy = httpd.www / area / "c.bin"
    assert copy.stat().st_size >= offset(harness, "web")
    with copy.open("r+b") as remote:
        remote.seek(1000)
        remote.write(bytes(b ^ 0xFF for b in data[1000:1100]))
    instance.resume()
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    failed = events.of("verification-failed")
    assert len(failed) == 1
    assert "differs from the source" in failed[0]["error"]
    delivered = events.of("file-delivered")[0]
    assert delivered["resumedFrom"] == 0
    assert delivered["bytesSent"] == len(data)
    assert copy.read_bytes() == data
    assert not httpd.leftovers()


def test_a_server_that_is_down_holds_only_its_own_delivery(harness: Harness, tmp_path: Path):
    data = write_file(harness.source / "f.bin", 2 * MIB)
    later = Httpd(port=free_port())
    out = tmp_path / "out"
    try:
        _, events = harness.start(
            [{"type": "local", "path": str(out)}, later.destination("dav", id="web")]
        )
        wait_until(lambda: events.of("file-delivered"), 30, "the local delivery")
        wait_until(lambda: len(events.of("delivery-retry")) >= 2, 30, "retries of the server")
        assert "ConnectionError" in events.of("delivery-retry")[0]["error"]
        assert (out / "f.bin").read_bytes() == data
        assert (harness.source / "f.bin").exists()
        later.start()
        wait_until(lambda: events.of("file-completed"), 60, "completion once the server is up")
        assert (later.www / "dav" / "f.bin").read_bytes() == data
    finally:
        later.remove()
    assert [d["destination"] for d in events.of("file-delivered")] == ["local-1", "web"]
    assert not (harness.source / "f.bin").exists()


@pytest.mark.slow
def test_a_server_stopped_mid_transfer_is_resumed_when_it_returns(harness: Harness, tmp_path: Path):
    data = write_file(harness.source / "s.bin", 24 * MIB)
    server = Httpd().start()
    try:
        _, events = harness.start(
            [server.destination("dav", id="web", chunkBytes=2 * MIB, bandwidthBytesPerSec=8 * MIB)]
        )
        wait_until(lambda: offset(harness, "web") >= 6 * MIB, 30, "a recorded offset")
        server.stop()
        wait_until(lambda: events.of("delivery-retry"), 30, "a retry while it is down")
        assert not events.of("file-delivered")
        assert (harness.source / "s.bin").exists()
        recorded = offset(harness, "web")
        server.start()
        wait_until(lambda: events.of("file-completed"), 60, "completion once it is back")
        delivered = events.of("file-delivered")[0]
        assert delivered["resumedFrom"] >= recorded >= 6 * MIB
        assert delivered["bytesSent"] == len(data) - delivered["resumedFrom"]
        assert (server.www / "dav" / "s.bin").read_bytes() == data
        assert not server.leftovers()
        assert not (harness.source / "s.bin").exists()
    finally:
        server.remove()


def test_a_missing_extra_is_refused_with_the_pip_command(monkeypatch: pytest.MonkeyPatch):
    from tests.egress.test_component import document, issues
    from unskit.errors import ConfigError

    monkeypatch.setitem(sys.modules, "requests", None)  # import requests -> ImportError
    found = issues(document({"type": "http", "url": "http://h/"}))
    assert any(
        "egress[0].type: backend 'http' needs the 'requests' package" in issue
        and "pip install 'unskit[http]'" in issue
        for issue in found
    ), found
    monkeypatch.setitem(sys.modules, "unskit.egress.backends.http", None)
    with pytest.raises(ConfigError, match=r"pip install 'unskit\[http\]'"):
        open_backend({"type": "http", "url": "http://h/"}, None)


@pytest.mark.integration
def test_unskit_egress_send_delivers_over_http(tmp_path: Path, httpd: Httpd, area: str):
    data = {n: write_file(tmp_path / "in" / n, s) for n, s in (("a.csv", 1000), ("b.bin", 3 * MIB))}
    cfg = send_config(tmp_path, httpd.destination(area, id="web", chunkBytes=MIB))
    files = [str(tmp_path / "in" / name) for name in data]
    result = run_send(*files, "--config", str(cfg), "-t", "gw", "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    for name, content in data.items():
        assert (httpd.www / area / name).read_bytes() == content
        assert (tmp_path / "in" / name).exists()
    assert result.stdout.count("verified") == 2


@pytest.mark.slow
def test_sigkill_mid_transfer_resumes_from_the_recorded_offset(
    broker: Mosquitto, httpd: Httpd, tmp_path: Path
):
    source = tmp_path / "source"
    data = write_file(source / "batch" / "run.bin", 50 * MIB)
    document: dict[str, Any] = {
        "component": {
            "global": {"stateDir": str(tmp_path / "state")},
            "instances": [
                {
                    "id": "line-1",
                    "source": {"path": str(source), "settleSeconds": 0},
                    "egress": [
                        httpd.destination(
                            "secure",
                            id="web",
                            username=USER,
                            password=PASSWORD,
                            chunkBytes=4 * MIB,
                            bandwidthBytesPerSec=10 * MIB,
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
    remote = httpd.www / "secure" / "batch" / "run.bin"
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
        assert remote.stat().st_size >= resumed
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
        assert delivered[0]["bytesSent"] < len(data)
        assert remote.read_bytes() == data
        assert not httpd.leftovers(), "a temporary object remains"
        assert not (source / "batch" / "run.bin").exists()
        for path in (first, second):
            assert PASSWORD not in path.read_text(), f"the password in {path.name}"
    finally:
        client.close(1)


def recorded(db: Path) -> int:
    try:
        rows = query(db, "SELECT offset FROM deliveries WHERE dest = 'web'")
    except sqlite3.OperationalError:  # the schema is not created yet
        return 0
    return int(rows[0][0]) if rows else 0


def test_the_example_configuration_validates_and_delivers(
    harness: Harness, httpd: Httpd, upload: UploadServer
):
    from tests.egress.test_component import issues

    example = Path(__file__).parents[2] / "examples" / "file-egress-http.json"
    document = json.loads(example.read_text())
    assert issues(document) == []
    entries = document["component"]["instances"][0]["egress"]
    # The example's servers, moved to this test's ports.
    (httpd.www / "dav" / "incoming").mkdir(exist_ok=True)
    shutil.chown(httpd.www / "dav" / "incoming", *_owner(httpd.www / "dav"))
    dav, ingest = (dict(entry) for entry in entries)
    dav["url"] = dav["url"].replace("http://127.0.0.1:8080", httpd.url)
    ingest["url"] = ingest["url"].replace("http://127.0.0.1:8081", upload.url)
    upload.behaviour.authorization = f"Bearer {ingest['bearerToken']}"
    data = write_file(harness.source / "r" / "reading.csv", 4096)
    _, events = harness.start([dav, ingest])
    wait_until(lambda: events.of("file-completed"), 30, "the file at both servers")
    assert (httpd.www / "dav" / "incoming" / "r" / "reading.csv").read_bytes() == data
    assert upload.files["/upload/r/reading.csv"] == data


def _owner(path: Path) -> tuple[str, str]:
    return path.owner(), path.group()
