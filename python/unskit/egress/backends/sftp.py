"""The `sftp` backend through paramiko (the only module that imports it). Writes
`<name><tempSuffix>` at the recorded offset, records progress every 8 MiB as the server
reports the file's size, reads the copy back to re-hash it against the source, then renames
it into place. The server's host key must be the pinned one, unless the entry explicitly
accepts any key; with neither, no connection is made."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import posixpath
import socket
import stat
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import paramiko
from paramiko.sftp import CMD_EXTENDED

from unskit.config.secrets import Secret, SecretResolver
from unskit.egress.backends import Transfer
from unskit.egress.backends.remote import (
    CHUNK,
    StreamedBackend,
    hash_prefix,
    send_chunks,
    send_segments,
)
from unskit.egress.config import parse_host_key
from unskit.egress.verify import Digest
from unskit.errors import DestinationError, EgressError

__all__ = ["DEFAULT_PORT", "SftpBackend"]

_log = logging.getLogger(__name__)

DEFAULT_PORT = 22
#: Connect, banner, authentication and channel timeout, seconds.
TIMEOUT = 30.0
_CREDENTIAL_FIELDS = ("username", "password", "privateKey", "passphrase")
# The key types a server may present for a pinned key of a given type (RSA keys sign with
# SHA-2 under other algorithm names).
_RSA_ALGORITHMS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


def _fingerprint(blob: bytes) -> str:
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")
    return f"SHA256:{digest}"


def _load_key(text: str | None, path: str | None, passphrase: Secret | None) -> paramiko.PKey:
    """The client key from PEM/OpenSSH text (a vault secret) or from a key file."""
    secret = None if passphrase is None else passphrase.reveal()
    if path is not None:
        # paramiko hands this to cryptography, which wants bytes.
        return paramiko.PKey.from_path(path, None if secret is None else secret.encode())
    assert text is not None
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        with contextlib.suppress(paramiko.SSHException):
            return kind.from_private_key(io.StringIO(text), secret)
    raise paramiko.SSHException("the private key is not a readable Ed25519, ECDSA or RSA key")


# -- paramiko internals ---------------------------------------------------------------------
# The only uses of paramiko's private names: the same in paramiko 3.4.0 and 5.1.0, which is
# what pyproject.toml pins; tests/egress/test_paramiko_internals.py checks each of them.


def _drain_pipelined_writes(sftp: paramiko.SFTPClient, sink: paramiko.SFTPFile) -> None:
    """Reads the replies of `sink`'s pipelined writes; a failed write raises here."""
    # paramiko's pipelined writes leave their replies unread (and their errors unseen)
    # until it drains them itself; drain them here, as its unpipelined write does, so a
    # failed write raises now and no later drain waits for a reply already consumed.
    while sink._reqs:
        sftp._read_response(sink._reqs.popleft())


def _fsync(sftp: paramiko.SFTPClient, sink: paramiko.SFTPFile) -> None:
    """OpenSSH's fsync@openssh.com extension on an open file; paramiko has no method for it."""
    sftp._request(CMD_EXTENDED, "fsync@openssh.com", sink.handle)


# -- the backend -----------------------------------------------------------------------------


class SftpBackend(StreamedBackend[paramiko.SFTPClient]):
    """Delivers under `baseDir` on one SFTP server."""

    sdk_errors = (paramiko.SSHException, OSError, EOFError)
    # EOFError: paramiko's send on a channel the server closed (a lost connection).
    discard_errors = (OSError, paramiko.SSHException, EOFError, ValueError)

    def __init__(self, settings: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.insecure = bool(settings.get("insecureAcceptAnyHostKey", False))
        line = settings.get("hostKey")
        self.pin = None if line is None else parse_host_key(line)
        super().__init__(
            settings,
            secrets,
            scheme="sftp",
            default_port=DEFAULT_PORT,
            credential_fields=_CREDENTIAL_FIELDS,
        )
        self.fsync = bool(settings.get("fsync", False))
        self.passphrase = self.credentials["passphrase"]
        # A bundle's privateKey is the key itself; the entry's privateKey is a key file path.
        from_bundle = "credentials" in settings
        key = self.credentials["privateKey"]
        self.key_text = key.reveal() if from_bundle and key is not None else None
        self.key_path = key.reveal() if not from_bundle and key is not None else None
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._fsync_supported = True

    # -- connection ------------------------------------------------------------------------

    def connect(self) -> paramiko.SFTPClient:
        """The SFTP session over an authenticated SSH connection to the pinned host key."""
        if self._sftp is not None and self._transport is not None and self._transport.is_active():
            return self._sftp
        self.close()
        if self.pin is None and not self.insecure:
            raise DestinationError(
                f"{self.where}: Handshake refused: no hostKey is pinned and "
                "insecureAcceptAnyHostKey is not set"
            )
        if self.username is None:
            raise DestinationError(f"{self.where}: no username configured")
        try:
            sock = socket.create_connection((self.host, self.port), timeout=TIMEOUT)
        except OSError as exc:
            raise DestinationError(f"{self.where}: {exc}") from exc
        transport = paramiko.Transport(sock)
        try:
            transport.banner_timeout = TIMEOUT
            transport.auth_timeout = TIMEOUT
            if self.pin is not None:
                kind = self.pin[0]
                # Ask for the pinned key's type, so a server with several host keys shows
                # the one that is pinned.
                wanted = _RSA_ALGORITHMS if kind == "ssh-rsa" else (kind,)
                options = transport.get_security_options()
                offered = [k for k in wanted if k in options.key_types]
                if offered:
                    options.key_types = offered
            transport.start_client(timeout=TIMEOUT)
            self._check_host_key(transport.get_remote_server_key())
            self._authenticate(transport)
            sftp = paramiko.SFTPClient.from_transport(transport)
            if sftp is None:
                raise DestinationError(f"{self.where}: the server opened no SFTP channel")
            sftp.get_channel().settimeout(TIMEOUT)
        except EgressError:
            transport.close()
            raise
        except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
            # ValueError: a key file that cannot be read (a wrong passphrase among others).
            transport.close()
            raise DestinationError(f"{self.where}: {type(exc).__name__}: {exc}") from exc
        self._transport = transport
        self._sftp = sftp
        return sftp

    def _check_host_key(self, key: paramiko.PKey) -> None:
        blob = key.asbytes()
        if self.pin is None:
            _log.warning(
                "%s: host key %s %s accepted unchecked (insecureAcceptAnyHostKey)",
                self.where,
                key.get_name(),
                _fingerprint(blob),
            )
            return
        if blob != self.pin[1]:
            raise DestinationError(
                f"{self.where}: Handshake refused: host key {key.get_name()} "
                f"{_fingerprint(blob)} is not the pinned {self.pin[0]} {_fingerprint(self.pin[1])}"
            )

    def _authenticate(self, transport: paramiko.Transport) -> None:
        assert self.username is not None
        if self.key_text is None and self.key_path is None and self.password is None:
            raise DestinationError(f"{self.where}: neither a password nor a privateKey is set")
        if self.key_text is not None or self.key_path is not None:
            key = _load_key(self.key_text, self.key_path, self.passphrase)
            try:
                transport.auth_publickey(self.username, key)
            except paramiko.AuthenticationException:
                if self.password is None:
                    raise
                _log.info("%s: key refused, trying the password", self.where)
        if not transport.is_authenticated() and self.password is not None:
            transport.auth_password(self.username, self.password.reveal())
        if not transport.is_authenticated():
            raise DestinationError(f"{self.where}: authentication as {self.username} failed")

    def close(self) -> None:
        """Closes the SFTP session and its SSH connection."""
        sftp, transport = self._sftp, self._transport
        self._sftp = self._transport = None
        with contextlib.suppress(Exception):
            if sftp is not None:
                sftp.close()
        with contextlib.suppress(Exception):
            if transport is not None:
                transport.close()

    # -- file operations -------------------------------------------------------------------

    def _size(self, session: paramiko.SFTPClient, path: str) -> int | None:
        try:
            return int(session.stat(path).st_size or 0)
        except FileNotFoundError:
            return None

    def _write(
        self,
        session: paramiko.SFTPClient,
        transfer: Transfer,
        source: BinaryIO,
        temp: str,
        offset: int,
        temp_size: int | None,
        digest: Digest,
    ) -> int:
        """Pipelined writes from `offset`, the server's size recorded every 8 MiB."""
        with session.open(temp, "r+b" if offset else "wb") as sink:
            # Pipelined writes: the server's replies are collected as they come, not awaited
            # one by one; the size the server reports at each checkpoint is what is recorded.
            sink.set_pipelined(True)
            if temp_size is not None and temp_size > offset:
                sink.truncate(offset)
            hash_prefix(source, digest, offset, transfer)
            sink.seek(offset)

            def segment(position: int, step: int) -> int:
                got = 0
                try:
                    for chunk in send_chunks(source, transfer, step):
                        sink.write(chunk)
                        digest.update(chunk)
                        got += len(chunk)
                        transfer.journal.sent(len(chunk))
                finally:
                    self._checkpoint(session, sink, transfer, position + got)
                return got

            return send_segments(transfer, offset, segment)

    def _checkpoint(
        self, sftp: paramiko.SFTPClient, sink: paramiko.SFTPFile, transfer: Transfer, position: int
    ) -> None:
        """Records the offset the server has written (and fsynced, with `fsync`)."""
        sink.flush()
        _drain_pipelined_writes(sftp, sink)
        if self.fsync and self._fsync_supported:
            try:
                _fsync(sftp, sink)
            except OSError as exc:
                self._fsync_supported = False
                _log.warning("%s: fsync is not available (%s); continuing without", self.where, exc)
        size = int(sink.stat().st_size or 0)
        transfer.journal.offset(min(size, position))

    def _read(
        self, session: paramiko.SFTPClient, path: str, size: int, feed: Callable[[bytes], None]
    ) -> None:
        with session.open(path, "rb") as copy:
            copy.prefetch(size)
            while chunk := copy.read(CHUNK):
                feed(chunk)

    def _rename(self, session: paramiko.SFTPClient, temp: str, target: str) -> None:
        session.posix_rename(temp, target)

    def _makedirs(self, session: paramiko.SFTPClient, directory: str) -> None:
        if directory in ("", "/", "."):
            return
        try:
            if stat.S_ISDIR(session.stat(directory).st_mode or 0):
                return
            raise DestinationError(f"{self.where}: {directory} exists and is not a directory")
        except FileNotFoundError:
            pass
        self._makedirs(session, posixpath.dirname(directory))
        try:
            session.mkdir(directory)
        except OSError:
            # Made by someone else meanwhile is fine; anything else shows at the next stat.
            if not stat.S_ISDIR(session.stat(directory).st_mode or 0):
                raise

    def _remove(self, session: paramiko.SFTPClient, path: str) -> None:
        session.remove(path)
