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
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from unskit.config.secrets import Secret, SecretResolver
from unskit.egress.backends import Outcome, Transfer
from unskit.egress.backends.remote import (
    CHECKPOINT_BYTES,
    CHUNK,
    DEFAULT_ALGORITHM,
    DEFAULT_TEMP_SUFFIX,
    bundle_fields,
    hash_prefix,
    remote_path,
    send_chunks,
)
from unskit.egress.verify import Algorithm, Digest, new_digest
from unskit.errors import (
    DestinationError,
    EgressError,
    SourceChangedError,
    VerificationError,
)

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
    """FTP_TLS with implicit TLS and TLS session reuse on the data connections."""

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


class FtpsBackend:
    """Delivers under `baseDir` on one FTPS server."""

    def __init__(self, settings: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.host: str = settings["host"]
        self.explicit = bool(settings.get("explicitTls", True))
        default_port = DEFAULT_EXPLICIT_PORT if self.explicit else DEFAULT_IMPLICIT_PORT
        self.port = int(settings.get("port", default_port))
        self.base_dir: str = settings.get("baseDir", "")
        self.passive = bool(settings.get("passive", True))
        self.temp_suffix: str = settings.get("tempSuffix", DEFAULT_TEMP_SUFFIX)
        self.algorithm = Algorithm(settings.get("checksumAlgorithm", DEFAULT_ALGORITHM))
        self.ca_path: str | None = settings.get("caPath")
        credentials = bundle_fields(settings, secrets, _CREDENTIAL_FIELDS)
        username = credentials["username"] or settings.get("username")
        self.username = username.reveal() if isinstance(username, Secret) else username
        self.password = credentials["password"]
        self.where = f"ftps://{self.host}:{self.port}"
        self._ftp: _Client | None = None

    # -- connection ------------------------------------------------------------------------

    def _context(self) -> ssl.SSLContext:
        # The system's trust store, or only the CA file given: the certificate and its
        # name are always verified (there is no switch to turn that off).
        try:
            return ssl.create_default_context(cafile=self.ca_path)
        except (OSError, ssl.SSLError) as exc:
            raise DestinationError(f"{self.where}: caPath {self.ca_path}: {exc}") from exc

    def _client(self) -> _Client:
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

    # -- delivery --------------------------------------------------------------------------

    def deliver(self, transfer: Transfer) -> Outcome:
        """Appends the missing bytes at the recorded offset, re-hashes, renames into place."""
        target = remote_path(self.base_dir, transfer.relative)
        transfer.check_source()
        ftp = self._client()
        try:
            return self._deliver(ftp, transfer, target, target + self.temp_suffix)
        except EgressError:
            raise
        except _FTP_ERRORS as exc:
            self.close()
            raise DestinationError(f"{self.where}: {target}: {exc}") from exc

    @staticmethod
    def _size(ftp: _Client, path: str) -> int | None:
        try:
            size = ftp.size(path)
        except ftplib.error_perm:
            return None  # 550: no such file
        return None if size is None else int(size)

    def _deliver(self, ftp: _Client, transfer: Transfer, target: str, temp: str) -> Outcome:
        temp_size = self._size(ftp, temp)
        if transfer.offset > 0 and temp_size is None and self._already_there(ftp, transfer, target):
            return Outcome(transfer.size, 0, {"path": target, "alreadyDelivered": True})
        self._makedirs(ftp, posixpath.dirname(target))
        offset = min(transfer.offset, temp_size or 0)
        digest = new_digest(self.algorithm)
        sent = 0
        with open(transfer.source, "rb") as source:
            hash_prefix(source, digest, offset, transfer)
            position = offset
            # None: nothing usable there yet, so the first segment is a STOR that creates (or
            # empties) the temporary file, even for an empty source.
            remote = temp_size if offset else None
            while remote is None or position < transfer.size:
                step = min(CHECKPOINT_BYTES, transfer.size - position)
                got = self._segment(ftp, transfer, source, temp, position, remote, step, digest)
                sent += got
                position += got
                size = self._size(ftp, temp)
                if size != position:
                    raise DestinationError(
                        f"{self.where}: {temp}: SIZE {size} after {position} bytes were written"
                    )
                transfer.journal.offset(position)
                remote = size
                if got < step:
                    raise SourceChangedError(f"{transfer.relative} shrank while it was sent")
        transfer.check_source()
        copy = self._read_digest(ftp, temp, transfer.size)
        if copy != digest.digest():
            raise VerificationError(
                f"{self.where}: {temp}: the copy's {self.algorithm.value} differs from the source's"
            )
        self._rename(ftp, temp, target)
        return Outcome(offset, sent, {"path": target})

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

    def _read_digest(self, ftp: _Client, path: str, size: int) -> bytes:
        """The digest of the remote file, read back (servers rarely offer a hash command)."""
        digest = new_digest(self.algorithm)
        read = 0

        def feed(chunk: bytes) -> None:
            nonlocal read
            digest.update(chunk)
            read += len(chunk)

        ftp.retrbinary(f"RETR {path}", feed, blocksize=CHUNK)
        if read != size:
            raise VerificationError(f"{self.where}: {path} holds {read} bytes, {size} were sent")
        return digest.digest()

    def _already_there(self, ftp: _Client, transfer: Transfer, target: str) -> bool:
        """Progress was recorded but the temporary file is gone: a crash after the rename and
        before the verification was recorded. The copy in place counts only if it re-hashes
        to the source's digest."""
        if self._size(ftp, target) != transfer.size:
            return False
        digest = new_digest(self.algorithm)
        with open(transfer.source, "rb") as source:
            hash_prefix(source, digest, transfer.size, transfer)
        try:
            same = self._read_digest(ftp, target, transfer.size) == digest.digest()
        except VerificationError:
            return False
        transfer.check_source()
        return same

    def _rename(self, ftp: _Client, temp: str, target: str) -> None:
        try:
            ftp.rename(temp, target)
        except ftplib.error_perm:
            # Servers that refuse to rename over an existing file: remove it, then rename.
            with contextlib.suppress(ftplib.error_perm):
                ftp.delete(target)
            ftp.rename(temp, target)

    def _makedirs(self, ftp: _Client, directory: str) -> None:
        if directory in ("", "/", "."):
            return
        try:
            ftp.mkd(directory)
            return
        except ftplib.error_perm:
            pass  # it exists, or its parent does not
        self._makedirs(ftp, posixpath.dirname(directory))
        with contextlib.suppress(ftplib.error_perm):
            ftp.mkd(directory)

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Removes the temporary file of an abandoned delivery (best effort)."""
        with contextlib.suppress(EgressError, *_FTP_ERRORS):
            temp = remote_path(self.base_dir, relative) + self.temp_suffix
            self._client().delete(temp)

    def close(self) -> None:
        """Says QUIT and closes the control connection."""
        ftp, self._ftp = self._ftp, None
        if ftp is not None:
            with contextlib.suppress(*_FTP_ERRORS):
                ftp.quit()
            ftp.close()
