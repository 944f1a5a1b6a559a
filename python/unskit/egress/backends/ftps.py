"""The `ftps` backend through the standard library's ftplib and ssl (the only module that
uses them). Explicit (AUTH TLS) or implicit TLS, the server certificate always verified;
protected data channels that reuse the control connection's TLS session (servers such as
vsftpd require it). The file goes to `<name><tempSuffix>` in segments of 8 MiB, each an
APPE (or REST+STOR over a longer leftover) followed by a SIZE check before its offset is
recorded; the copy is read back (RETR) and re-hashed, then renamed (RNFR/RNTO)."""

from __future__ import annotations

import contextlib
import ftplib
import logging
import posixpath
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from unskit.config.secrets import SecretResolver
from unskit.egress.backends import Transfer
from unskit.egress.backends.remote import (
    CHUNK,
    StreamedBackend,
    hash_prefix,
    send_chunks,
    send_segments,
)
from unskit.egress.verify import Digest
from unskit.errors import DestinationError

__all__ = ["DEFAULT_EXPLICIT_PORT", "DEFAULT_IMPLICIT_PORT", "FtpsBackend"]

_log = logging.getLogger(__name__)

DEFAULT_EXPLICIT_PORT = 21
DEFAULT_IMPLICIT_PORT = 990
#: Socket timeout of the control and data connections, seconds.
TIMEOUT = 30.0
_CREDENTIAL_FIELDS = ("username", "password")
# What ftplib and ssl raise: protocol replies, socket and TLS errors, a closed connection.
_FTP_ERRORS: tuple[type[BaseException], ...] = (*ftplib.all_errors, ValueError)


class _Client(ftplib.FTP_TLS):
    """FTP_TLS with implicit TLS and TLS session reuse on the data connections.

    The one place ftplib's internals are used: FTP_TLS's private `_prot_p`, and the
    attributes FTP.connect sets, which the implicit connect sets in its place;
    tests/egress/test_ftplib_internals.py checks both."""

    def __init__(self, context: ssl.SSLContext, implicit: bool) -> None:
        super().__init__(context=context, timeout=TIMEOUT)
        self.implicit = implicit

    def connect(
        self,
        host: str = "",
        port: int = 0,
        timeout: float = -999,
        source_address: tuple[str, int] | None = None,
    ) -> str:
        """Connects; with implicit TLS the handshake comes before the greeting."""
        if not self.implicit:
            return super().connect(host, port, timeout, source_address)
        self.host, self.port = host, port
        raw = socket.create_connection((host, port), TIMEOUT)
        self.sock = self.context.wrap_socket(raw, server_hostname=host)
        self.af = self.sock.family
        self.file = self.sock.makefile("r", encoding=self.encoding)
        self.welcome = self.getresp()
        return self.welcome

    def ntransfercmd(
        self, cmd: str, rest: int | str | None = None
    ) -> tuple[socket.socket, int | None]:
        """A data connection wrapped in TLS resuming the control connection's session."""
        conn, size = ftplib.FTP.ntransfercmd(self, cmd, rest)
        if self._prot_p:  # type: ignore[attr-defined]
            session = self.sock.session if isinstance(self.sock, ssl.SSLSocket) else None
            conn = self.context.wrap_socket(conn, server_hostname=self.host, session=session)
        return conn, size


class FtpsBackend(StreamedBackend[_Client]):
    """Delivers under `baseDir` on one FTPS server."""

    sdk_errors = _FTP_ERRORS
    discard_errors = _FTP_ERRORS

    def __init__(self, settings: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.explicit = bool(settings.get("explicitTls", True))
        super().__init__(
            settings,
            secrets,
            scheme="ftps",
            default_port=DEFAULT_EXPLICIT_PORT if self.explicit else DEFAULT_IMPLICIT_PORT,
            credential_fields=_CREDENTIAL_FIELDS,
        )
        self.passive = bool(settings.get("passive", True))
        self.ca_path: str | None = settings.get("caPath")
        self._ftp: _Client | None = None

    # -- connection ------------------------------------------------------------------------

    def _context(self) -> ssl.SSLContext:
        # The system's trust store, or only the CA file given: the certificate and its
        # name are always verified (there is no switch to turn that off).
        try:
            return ssl.create_default_context(cafile=self.ca_path)
        except (OSError, ssl.SSLError) as exc:
            raise DestinationError(f"{self.where}: caPath {self.ca_path}: {exc}") from exc

    def connect(self) -> _Client:
        """The logged-in control connection (a NOOP checks a kept one)."""
        if self._ftp is not None:
            try:
                self._ftp.voidcmd("NOOP")
                return self._ftp
            except _FTP_ERRORS:
                self.close()
        if self.username is None:
            raise DestinationError(f"{self.where}: no username configured")
        ftp = _Client(self._context(), implicit=not self.explicit)
        try:
            ftp.connect(self.host, self.port)
            password = "" if self.password is None else self.password.reveal()
            ftp.login(self.username, password, secure=True)
            ftp.prot_p()
            ftp.set_pasv(self.passive)
            ftp.voidcmd("TYPE I")
        except ssl.SSLCertVerificationError as exc:
            ftp.close()
            raise DestinationError(
                f"{self.where}: TLS handshake refused: certificate verify failed: "
                f"{exc.verify_message}"
            ) from exc
        except _FTP_ERRORS as exc:
            ftp.close()
            raise DestinationError(f"{self.where}: {type(exc).__name__}: {exc}") from exc
        self._ftp = ftp
        return ftp

    def close(self) -> None:
        """Says QUIT and closes the control connection."""
        ftp, self._ftp = self._ftp, None
        if ftp is not None:
            with contextlib.suppress(*_FTP_ERRORS):
                ftp.quit()
            ftp.close()

    # -- file operations -------------------------------------------------------------------

    def _size(self, session: _Client, path: str) -> int | None:
        try:
            size = session.size(path)
        except ftplib.error_perm:
            return None  # 550: no such file
        return None if size is None else int(size)

    def _write(
        self,
        session: _Client,
        transfer: Transfer,
        source: BinaryIO,
        temp: str,
        offset: int,
        temp_size: int | None,
        digest: Digest,
    ) -> int:
        """Sends 8 MiB segments, each checked with SIZE before its offset is recorded."""
        hash_prefix(source, digest, offset, transfer)
        # None: nothing usable there yet, so the first segment is a STOR that creates (or
        # empties) the temporary file, even for an empty source.
        remote = temp_size if offset else None

        def segment(position: int, step: int) -> int:
            nonlocal remote
            got = self._segment(session, transfer, source, temp, position, remote, step, digest)
            size = self._size(session, temp)
            if size != position + got:
                raise DestinationError(
                    f"{self.where}: {temp}: SIZE {size} after {position + got} bytes were written"
                )
            transfer.journal.offset(position + got)
            remote = size
            return got

        return send_segments(transfer, offset, segment, create=remote is None)

    def _segment(
        self,
        ftp: _Client,
        transfer: Transfer,
        source: BinaryIO,
        temp: str,
        position: int,
        remote: int | None,
        step: int,
        digest: Digest,
    ) -> int:
        """Sends up to `step` bytes at `position`: STOR for a new file, APPE onto a file that
        ends there, REST+STOR over a leftover that is longer than what was recorded."""
        if remote is None or position == 0:
            command, rest = f"STOR {temp}", None
        elif remote == position:
            command, rest = f"APPE {temp}", None
        else:
            command, rest = f"STOR {temp}", position
        got = 0
        conn = ftp.transfercmd(command, rest)
        try:
            for chunk in send_chunks(source, transfer, step):
                conn.sendall(chunk)
                digest.update(chunk)
                got += len(chunk)
                transfer.journal.sent(len(chunk))
            if isinstance(conn, ssl.SSLSocket):
                conn.unwrap()
        finally:
            conn.close()
            # The transfer's final reply (226, or 426 after an interruption) must be read
            # before the next command, whatever happened to the data connection.
            try:
                reply = ftp.getresp()
            except ftplib.Error as exc:
                reply = str(exc)
        if not reply.startswith("2"):
            raise DestinationError(f"{self.where}: {command}: {reply}")
        return got

    def _read(self, session: _Client, path: str, size: int, feed: Callable[[bytes], None]) -> None:
        session.retrbinary(f"RETR {path}", feed, blocksize=CHUNK)

    def _rename(self, session: _Client, temp: str, target: str) -> None:
        try:
            session.rename(temp, target)
        except ftplib.error_perm:
            # Servers that refuse to rename over an existing file: remove it, then rename.
            with contextlib.suppress(ftplib.error_perm):
                session.delete(target)
            session.rename(temp, target)

    def _makedirs(self, session: _Client, directory: str) -> None:
        if directory in ("", "/", "."):
            return
        try:
            session.mkd(directory)
            return
        except ftplib.error_perm:
            pass  # it exists, or its parent does not
        self._makedirs(session, posixpath.dirname(directory))
        with contextlib.suppress(ftplib.error_perm):
            session.mkd(directory)

    def _remove(self, session: _Client, path: str) -> None:
        session.delete(path)
