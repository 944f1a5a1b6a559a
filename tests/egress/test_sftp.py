"""The `sftp` backend against Debian's OpenSSH sshd: a verified delivery, host-key pinning
that fails closed, a corrupted remote copy detected and sent again, a server that is down
holding only its own delivery."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.egress.test_process import events as process_events
from tests.egress.test_process import listener, query
from tests.messaging.test_client import Inbox
from tests.support.adapter import framework_sections
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, free_port, wait_until
from tests.support.sshd import PASSPHRASE, PasswordAccount, Sshd, password_account
from tests.support.tiers import server_fixture
from unskit.config.secrets import Secret, SecretRef
from unskit.egress.config import parse_host_key


@server_fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


def offset(harness: Harness, dest: str) -> int:
    try:
        with sqlite3.connect(harness.tmp_path / "state" / "egress.sqlite3") as db:
            rows = db.execute("SELECT offset FROM deliveries WHERE dest = ?", (dest,)).fetchall()
    except sqlite3.OperationalError:
        return 0
    return int(rows[0][0]) if rows else 0


def test_files_arrive_verified_and_the_source_goes_only_then(
    harness: Harness, sshd: Sshd, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    remote = tmp_path / "remote"
    small = write_file(harness.source / "a.csv", 1000)
    big = write_file(harness.source / "d" / "e" / "big.bin", 9 * MIB + 3)
    empty = write_file(harness.source / "empty.dat", 0)
    _, events = harness.start(
        [sshd.destination(remote / "in", checksumAlgorithm="CRC32C", fsync=True)]
    )
    wait_until(lambda: len(events.of("file-completed")) == 3, 60, "three files")
    assert (remote / "in" / "a.csv").read_bytes() == small
    assert (remote / "in" / "d" / "e" / "big.bin").read_bytes() == big
    assert (remote / "in" / "empty.dat").read_bytes() == empty
    assert not list(remote.rglob("*.part")), "a temporary file was left behind"
    delivered = {d["file"]: d for d in events.of("file-delivered")}
    assert delivered["d/e/big.bin"]["path"] == str(remote / "in" / "d" / "e" / "big.bin")
    assert delivered["d/e/big.bin"]["bytesSent"] == len(big)
    assert not (harness.source / "a.csv").exists()
    assert not (harness.source / "d" / "e" / "big.bin").exists()
    # OpenSSH has fsync@openssh.com: the fsync at each checkpoint was not skipped.
    assert "fsync is not available" not in caplog.text


def test_an_unknown_host_key_is_refused(harness: Harness, sshd: Sshd, tmp_path: Path):
    remote = tmp_path / "remote"
    write_file(harness.source / "x.bin", 1000)
    wrong = sshd.destination(remote, id="wrong", hostKey=sshd.host_key_line(sshd.other_key))
    unpinned = sshd.destination(remote, id="unpinned")
    del unpinned["hostKey"]
    _, events = harness.start([wrong, unpinned])
    wait_until(
        lambda: {"wrong", "unpinned"} <= {r["destination"] for r in events.of("delivery-retry")},
        30,
        "both destinations refused",
    )
    errors = {r["destination"]: r["error"] for r in events.of("delivery-retry")}
    assert "Handshake refused" in errors["wrong"]
    assert "is not the pinned" in errors["wrong"]
    assert "Handshake refused" in errors["unpinned"]
    assert "insecureAcceptAnyHostKey" in errors["unpinned"]
    assert not events.of("file-delivered")
    assert not remote.exists()
    assert (harness.source / "x.bin").exists()


def test_insecure_accept_any_host_key_connects_without_a_pin(
    harness: Harness, sshd: Sshd, tmp_path: Path
):
    remote = tmp_path / "remote"
    data = write_file(harness.source / "x.bin", 1000)
    destination = sshd.destination(remote, insecureAcceptAnyHostKey=True)
    del destination["hostKey"]
    _, events = harness.start([destination])
    wait_until(lambda: events.of("file-completed"), 30, "the file")
    assert (remote / "x.bin").read_bytes() == data


@pytest.mark.slow
def test_a_corrupted_remote_copy_fails_verification_and_is_sent_again(
    harness: Harness, sshd: Sshd, tmp_path: Path
):
    remote = tmp_path / "remote"
    data = write_file(harness.source / "c.bin", 20 * MIB)
    pipeline, events = harness.start(
        [sshd.destination(remote, id="sftp", bandwidthBytesPerSec=8 * MIB)]
    )
    instance = pipeline.instances["line-1"]
    wait_until(lambda: offset(harness, "sftp") >= 8 * MIB, 30, "a recorded offset")
    instance.pause()
    wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
    recorded = offset(harness, "sftp")
    part = remote / "c.bin.part"
    assert part.stat().st_size >= recorded
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
    assert (remote / "c.bin").read_bytes() == data
    assert not part.exists()


def test_a_server_that_is_down_holds_only_its_own_delivery(harness: Harness, tmp_path: Path):
    data = write_file(harness.source / "f.bin", 2 * MIB)
    later = Sshd(tmp_path / "later", port=free_port())
    out = tmp_path / "out"
    remote = tmp_path / "remote"
    _, events = harness.start(
        [{"type": "local", "path": str(out)}, later.destination(remote, id="sftp")]
    )
    wait_until(lambda: events.of("file-delivered"), 30, "the local delivery")
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 30, "retries of the sftp server")
    assert (out / "f.bin").read_bytes() == data
    assert (harness.source / "f.bin").exists()
    later.start()
    try:
        wait_until(lambda: events.of("file-completed"), 60, "completion once the server is up")
    finally:
        later.stop()
    assert (remote / "f.bin").read_bytes() == data
    assert [d["destination"] for d in events.of("file-delivered")] == ["local-1", "sftp"]
    assert not (harness.source / "f.bin").exists()


class Vault:
    def __init__(self, bundles: dict[str, dict[str, str]]) -> None:
        self.bundles = bundles

    def resolve(self, ref: SecretRef) -> Secret:
        from unskit.errors import SecretError

        try:
            return Secret(self.bundles[ref.name][ref.field or ""])
        except KeyError as exc:
            raise SecretError(f"{ref} is not in the vault") from exc


def test_a_credentials_bundle_holds_the_key_itself(sshd: Sshd, tmp_path: Path):
    from unskit.egress.backends import open_backend

    vault = Vault(
        {
            "sftp-login": {
                "username": sshd.user,
                "privateKey": sshd.client_key.read_text(),
                "passphrase": PASSPHRASE,
            }
        }
    )
    settings = sshd.destination(tmp_path)
    for key in ("username", "privateKey", "passphrase"):
        del settings[key]
    settings["credentials"] = {"$secret": "sftp-login"}
    backend = open_backend(settings, vault)
    try:
        sftp = backend.connect()  # type: ignore[attr-defined]
        assert sftp.listdir(str(tmp_path)) is not None
    finally:
        backend.close()


def test_host_key_lines_parse_with_or_without_a_host_field(sshd: Sshd):
    line = sshd.host_key_line()
    kind, blob = parse_host_key(line)
    assert kind == "ssh-ed25519"
    assert parse_host_key(f"[127.0.0.1]:{sshd.port} {line}") == (kind, blob)
    with pytest.raises(ValueError, match="not an SSH public key"):
        parse_host_key("ssh-ed25519 not-base64")


@pytest.mark.slow
def test_sigkill_mid_transfer_resumes_from_the_recorded_offset(
    broker: Mosquitto, sshd: Sshd, tmp_path: Path
):
    source = tmp_path / "source"
    remote = tmp_path / "remote"
    data = write_file(source / "batch" / "run.bin", 50 * MIB)
    document = {
        "component": {
            "global": {"stateDir": str(tmp_path / "state")},
            "instances": [
                {
                    "id": "line-1",
                    "source": {"path": str(source), "settleSeconds": 0},
                    "egress": [
                        sshd.destination(
                            remote, id="sftp", bandwidthBytesPerSec=10 * MIB, fsync=True
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
        assert (remote / "batch" / "run.bin.part").stat().st_size >= resumed
        assert not (remote / "batch" / "run.bin").exists()
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
        assert (remote / "batch" / "run.bin").read_bytes() == data
        assert not (source / "batch" / "run.bin").exists()
        for path in (first, second):
            assert PASSPHRASE not in path.read_text(), f"the passphrase in {path.name}"
    finally:
        client.close(1)


def recorded(db: Path) -> int:
    try:
        rows = query(db, "SELECT offset FROM deliveries WHERE dest = 'sftp'")
    except sqlite3.OperationalError:  # the schema is not created yet
        return 0
    return int(rows[0][0]) if rows else 0


def test_a_refused_password_login_is_a_destination_error(sshd: Sshd, tmp_path: Path):
    from unskit.egress.backends import open_backend
    from unskit.errors import DestinationError

    password = "not-the-password-value"
    vault = Vault({"sftp-login": {"username": sshd.user, "password": password}})
    settings = sshd.destination(tmp_path)
    for key in ("username", "privateKey", "passphrase"):
        del settings[key]
    settings["credentials"] = {"$secret": "sftp-login"}
    backend = open_backend(settings, vault)
    try:
        # This sshd takes keys only: the password is offered and refused.
        with pytest.raises(DestinationError, match="BadAuthenticationType") as refused:
            backend.connect()  # type: ignore[attr-defined]
        assert password not in str(refused.value)
    finally:
        backend.close()


@pytest.mark.parametrize("intact", [True, False])
def test_a_copy_renamed_before_a_crash_is_verified_not_sent_again(
    harness: Harness, sshd: Sshd, tmp_path: Path, intact: bool
):
    from unskit.egress.state import EgressState

    data = write_file(harness.source / "m.bin", 3 * MIB)
    remote = tmp_path / "remote"
    remote.mkdir()
    # The crash came after the rename and before the verification was recorded.
    (remote / "m.bin").write_bytes(data if intact else data[:-1] + b"\0")
    st = (harness.source / "m.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "m.bin", st.st_size, st.st_mtime_ns, ["sftp"])
    state.save_offset(file_id, "sftp", st.st_size, st.st_size)
    state.close()
    _, events = harness.start([sshd.destination(remote, id="sftp")])
    wait_until(lambda: events.of("file-completed"), 30, "the completion")
    assert (remote / "m.bin").read_bytes() == data
    sent = harness.metrics.counter(
        "egress", "bytesSent", {"instance": "line-1", "destination": "sftp"}
    )
    if intact:
        delivered = events.of("file-delivered")[0]
        assert delivered["bytesSent"] == 0
        assert delivered["alreadyDelivered"] is True
        assert sent.total == 0
    else:
        # Sent whole (a retry under load may report its own attempt's bytes, not the total).
        assert sent.total >= len(data)


def test_a_refused_key_falls_back_to_the_password(sshd: Sshd, tmp_path: Path):
    from unskit.egress.backends import open_backend
    from unskit.errors import DestinationError

    settings = sshd.destination(tmp_path, privateKey=str(sshd.other_key), password="pw-value")
    del settings["passphrase"]
    backend = open_backend(settings, None)
    try:
        # The key is not authorized; the password is then offered, and this sshd refuses
        # the password method itself (a key-only refusal would be AuthenticationException).
        with pytest.raises(DestinationError, match="BadAuthenticationType"):
            backend.connect()  # type: ignore[attr-defined]
    finally:
        backend.close()


def _descendants(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):  # ended meanwhile
                continue
            if parent == pid:
                found += [int(entry.name), *_descendants(int(entry.name))]
    return found


def test_a_connection_lost_during_a_discard_does_not_end_the_worker(
    harness: Harness, sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from unskit.egress.backends.sftp import SftpBackend
    from unskit.egress.state import EgressState

    data = write_file(harness.source / "v.bin", 2 * MIB)
    remote = tmp_path / "remote"
    remote.mkdir()
    # A recorded offset over a corrupted temporary copy: the resumed delivery fails
    # verification, and the worker discards the copy.
    (remote / "v.bin.part").write_bytes(b"\0" * MIB)
    st = (harness.source / "v.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "v.bin", st.st_size, st.st_mtime_ns, ["sftp"])
    state.save_offset(file_id, "sftp", MIB, MIB)
    state.close()
    before = set(_descendants(sshd.process.pid)) if sshd.process else set()
    remove = SftpBackend._remove
    lost: list[str] = []

    def remove_as_the_server_dies(backend: SftpBackend, session: Any, path: str) -> None:
        if lost:
            remove(backend, session, path)
            return
        # This session's SFTP server process stops reading until the channel's send window
        # is used up; the remove request then waits for window, and the server dies under
        # it: paramiko's send finds the channel gone (EOFError).
        assert sshd.process is not None
        (server,) = [
            p
            for p in set(_descendants(sshd.process.pid)) - before
            if b"internal-sftp" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        os.kill(server, signal.SIGSTOP)
        channel = session.get_channel()
        while channel.out_window_size > 0:
            channel.send(bytes(min(32768, channel.out_window_size)))
        waiters = channel.out_buffer_cv._waiters  # the threads waiting for send window

        def kill_once_waiting() -> None:
            # Usually the remove waits for send window. A window adjust the server sent just
            # before it stopped can let the request out instead; the remove then waits for
            # the stopped server's reply. Either way the server dies under it.
            with contextlib.suppress(AssertionError):
                wait_until(lambda: len(waiters) > 0, 5, "the remove to wait for window")
            lost.append(path)
            os.kill(server, signal.SIGKILL)

        killer = threading.Thread(target=kill_once_waiting)
        killer.start()
        try:
            remove(backend, session, path)
        finally:
            killer.join()

    monkeypatch.setattr(SftpBackend, "_remove", remove_as_the_server_dies)
    _, events = harness.start([sshd.destination(remote, id="sftp")])
    wait_until(lambda: events.of("file-completed"), 30, "the delivery after the lost discard")
    assert lost == [str(remote / "v.bin.part")]
    assert "differs from the source" in events.of("verification-failed")[0]["error"]
    assert (remote / "v.bin").read_bytes() == data
    assert events.of("file-delivered")[0]["bytesSent"] == len(data)


@pytest.fixture
def account_folder() -> Iterator[tuple[PasswordAccount, Path]]:
    """A fresh folder in the password account's home (outside /tmp, which that account
    cannot reach), removed after the test."""
    import shutil
    import uuid

    account = password_account()
    folder = account.home / f"t-{uuid.uuid4().hex[:8]}"
    yield account, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_password_login_delivers_as_a_real_account(
    harness: Harness, sshd: Sshd, account_folder, caplog: pytest.LogCaptureFixture
):
    account, folder = account_folder
    small = write_file(harness.source / "a.csv", 1000)
    big = write_file(harness.source / "d" / "big.bin", 3 * MIB + 1)
    settings = sshd.destination(folder / "in", username=account.user, password=account.password)
    del settings["privateKey"], settings["passphrase"]
    _, events = harness.start([settings])
    wait_until(lambda: len(events.of("file-completed")) == 2, 60, "two files")
    assert (folder / "in" / "a.csv").read_bytes() == small
    assert (folder / "in" / "d" / "big.bin").read_bytes() == big
    # Written by the account itself: the login was the password one, not root's key.
    assert (folder / "in" / "d" / "big.bin").stat().st_uid == account.uid
    assert not list(folder.rglob("*.part"))
    assert account.password not in caplog.text


def test_a_wrong_password_for_a_real_account_is_refused_without_echo(sshd: Sshd, tmp_path: Path):
    from unskit.egress.backends import open_backend
    from unskit.errors import DestinationError

    account = password_account()
    wrong = "wrong-" + account.password
    vault = Vault({"sftp-login": {"username": account.user, "password": wrong}})
    settings = sshd.destination(tmp_path)
    for key in ("username", "privateKey", "passphrase"):
        del settings[key]
    settings["credentials"] = {"$secret": "sftp-login"}
    backend = open_backend(settings, vault)
    try:
        # This account may log in by password: the method is accepted, the password not.
        with pytest.raises(DestinationError, match="Authentication failed") as refused:
            backend.connect()  # type: ignore[attr-defined]
        assert wrong not in str(refused.value)
        assert "BadAuthenticationType" not in str(refused.value)
    finally:
        backend.close()
