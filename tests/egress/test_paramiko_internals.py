"""The paramiko internals the sftp backend leans on (its marked section in
`unskit.egress.backends.sftp`), one test each against OpenSSH's sshd, so that an upgrade
past the pinned range that moves or renames one fails here instead of misbehaving."""

from __future__ import annotations

import collections
import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from paramiko.sftp import CMD_CLOSE, CMD_EXTENDED

from tests.support.sshd import Sshd
from tests.support.tiers import server_fixture
from unskit.egress.backends import open_backend
from unskit.egress.backends.sftp import _drain_pipelined_writes, _fsync


@server_fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture
def sftp(sshd: Sshd, tmp_path: Path) -> Iterator[paramiko.SFTPClient]:
    backend = open_backend(sshd.destination(tmp_path), None)
    try:
        yield backend.connect()  # type: ignore[attr-defined]
    finally:
        backend.close()


def params(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_reqs_holds_the_unread_replies_of_pipelined_writes(
    sftp: paramiko.SFTPClient, tmp_path: Path
):
    assert "self._reqs" in inspect.getsource(paramiko.SFTPFile._write)
    with sftp.open(str(tmp_path / "a.part"), "wb") as sink:
        sink.set_pipelined(True)
        assert isinstance(sink._reqs, collections.deque)
        for _ in range(3):
            sink.write(b"x" * 40_000)
            sink.flush()
        assert len(sink._reqs) >= 3, "pipelined writes were answered already"
        _drain_pipelined_writes(sftp, sink)
        assert not sink._reqs
        assert sink.stat().st_size == 120_000


def test_read_response_raises_a_failed_write_when_drained(
    sftp: paramiko.SFTPClient, tmp_path: Path
):
    assert params(paramiko.SFTPClient._read_response) == ["self", "waitfor"]
    sink = sftp.open(str(tmp_path / "b.part"), "wb")
    sink.set_pipelined(True)
    # The server forgets the handle, so the next pipelined write fails: only the drain,
    # reading its reply, can tell.
    sftp._request(CMD_CLOSE, sink.handle)
    sink.write(b"lost")
    sink.flush()
    assert sink._reqs
    with pytest.raises(OSError):  # noqa: PT011 - paramiko gives a bad handle no subclass
        _drain_pipelined_writes(sftp, sink)
    assert not sink._reqs
    with contextlib.suppress(OSError):
        sink.close()


def test_request_sends_the_fsync_extension_and_a_refusal_is_an_oserror(
    sftp: paramiko.SFTPClient, tmp_path: Path
):
    assert params(paramiko.SFTPClient._request) == ["self", "t", "args"]
    assert CMD_EXTENDED == 200
    with sftp.open(str(tmp_path / "c.part"), "wb") as sink:
        sink.write(b"kept")
        sink.flush()
        _fsync(sftp, sink)  # OpenSSH implements fsync@openssh.com
        # The backend turns fsync off on an OSError: what a server without it answers.
        with pytest.raises(OSError):  # noqa: PT011 - paramiko raises a plain IOError
            sftp._request(CMD_EXTENDED, "no-such-extension@example.com", sink.handle)
    assert (tmp_path / "c.part").read_bytes() == b"kept"
