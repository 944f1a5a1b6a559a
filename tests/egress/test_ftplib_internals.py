"""The standard library ftplib internals the ftps backend's `_Client` leans on, one test
each against pyftpdlib's TLS server, so that a Python release that moves one fails here
instead of misbehaving: FTP_TLS's private `_prot_p`, and the attributes FTP.connect sets
that the implicit-TLS connect sets in its place."""

from __future__ import annotations

import ftplib
import inspect
import ssl
from collections.abc import Iterator

import pytest

from tests.support.ftps import PASSWORD, USER, FtpsServer
from tests.support.pki import Pki
from unskit.egress.backends.ftps import _Client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def servers(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, FtpsServer]]:
    started = {
        implicit: FtpsServer(tmp_path_factory.mktemp("ftproot"), pki, implicit=implicit).start()
        for implicit in (False, True)
    }
    yield started
    for server in started.values():
        server.stop()


def client(server: FtpsServer) -> _Client:
    ftp = _Client(ssl.create_default_context(cafile=str(server.pki.ca)), server.implicit)
    ftp.connect("127.0.0.1", server.port)
    return ftp


def test_prot_p_is_the_flag_prot_p_sets_and_data_connections_follow(
    servers: dict[bool, FtpsServer],
):
    assert "self._prot_p = True" in inspect.getsource(ftplib.FTP_TLS.prot_p)
    assert "self._prot_p = False" in inspect.getsource(ftplib.FTP_TLS.prot_c)
    assert "self._prot_p" in inspect.getsource(ftplib.FTP_TLS.ntransfercmd)
    ftp = client(servers[False])
    try:
        assert ftp._prot_p is False
        ftp.login(USER, PASSWORD, secure=True)
        ftp.prot_p()
        assert ftp._prot_p is True
        conn = ftp.transfercmd("LIST")
        try:
            assert isinstance(conn, ssl.SSLSocket)  # our ntransfercmd read the flag
            while conn.recv(4096):
                pass
        finally:
            conn.close()
        ftp.voidresp()
    finally:
        ftp.close()


def test_the_implicit_connect_sets_what_ftplibs_connect_sets(servers: dict[bool, FtpsServer]):
    source = inspect.getsource(ftplib.FTP.connect)
    for assignment in ("self.sock =", "self.af =", "self.file =", "self.welcome ="):
        assert assignment in source
    explicit, implicit = client(servers[False]), client(servers[True])
    try:
        assert set(vars(implicit)) == set(vars(explicit))
        assert implicit.af == explicit.af
        assert implicit.welcome.startswith("220")
        assert explicit.welcome.startswith("220")
        assert isinstance(implicit.sock, ssl.SSLSocket)
        assert implicit.login(USER, PASSWORD, secure=True).startswith("230")
    finally:
        explicit.close()
        implicit.close()
