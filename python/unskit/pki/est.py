"""An EST client (RFC 7030, with the RFC 8951 clarifications): ``/cacerts``,
``/simpleenroll`` and ``/simplereenroll`` over HTTPS, with the optional label segment.

Requests and replies are base64-encoded DER (``application/pkcs10`` out,
``application/pkcs7-mime`` certs-only in). Every failure is an `EstError` whose message
says what went wrong (unreachable, TLS refused, HTTP status, HTML where PKCS#7 was due,
garbage); a 202 is a `Pending` reply carrying the server's Retry-After. Every socket
operation has a deadline, and a reply body is read under one overall deadline and size
bound, so a stalled server costs at most `timeout_s`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import email.utils
import http.client
import os
import ssl
import tempfile
import time
import urllib.parse
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs7

from unskit.config.secrets import Secret
from unskit.errors import EstError
from unskit.pki.identity import ClientIdentity

__all__ = [
    "CACERTS",
    "SIMPLEENROLL",
    "SIMPLEREENROLL",
    "EstClient",
    "Issued",
    "Pending",
    "parse_certs_only",
]

CACERTS = "cacerts"
SIMPLEENROLL = "simpleenroll"
SIMPLEREENROLL = "simplereenroll"
_WELL_KNOWN = "/.well-known/est"
_PKCS7 = "application/pkcs7-mime"
_BER_FALLBACK = "PKCS#7 certificates could not be parsed as DER"
#: A certs-only reply carries a few certificates; anything far larger is not one.
_MAX_BODY = 1 << 20
_CHUNK = 16 * 1024


@dataclass(frozen=True)
class Issued:
    """An enrollment reply: the certificates of the certs-only structure, in order."""

    certificates: Sequence[x509.Certificate]


@dataclass(frozen=True)
class Pending:
    """HTTP 202: the request was accepted; send the same CSR again after `retry_after_s`
    (None when the server gave no usable Retry-After)."""

    retry_after_s: float | None


class EstClient:
    """One EST server (base URL and optional label) with its trust and authentication."""

    def __init__(
        self,
        server: str,
        *,
        trust_pem: str | None,
        label: str | None = None,
        identity: ClientIdentity | None = None,
        basic: tuple[str, Secret] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme != "https" or not url.hostname:
            raise EstError(f"EST server {server!r} is not an https:// URL with a host")
        if url.username is not None or url.password is not None:
            raise EstError("the EST server URL must not carry credentials: use est.auth.basic")
        if url.query or url.fragment:
            raise EstError(f"EST server {server!r} must not have a query or fragment")
        if label is not None and (not label or "/" in label or label in (".", "..")):
            raise EstError(f"EST label {label!r} must be one path segment")
        self.host = url.hostname
        try:
            self.port = url.port or 443
        except ValueError:
            raise EstError(f"EST server {server!r} has an invalid port") from None
        path = url.path.rstrip("/")
        if not path.endswith(_WELL_KNOWN):
            path += _WELL_KNOWN
        self.base_path = path + (f"/{label}" if label else "")
        #: The server as shown in status and events (no credentials by construction).
        self.server = server
        self.timeout_s = timeout_s
        self._basic = basic
        self._context = _tls_context(trust_pem, identity)

    def __repr__(self) -> str:
        return f"EstClient({self.server!r}, path={self.base_path!r})"

    def url(self, operation: str) -> str:
        """The full URL of one operation."""
        return f"https://{_netloc(self.host, self.port)}{self.base_path}/{operation}"

    # -- operations ------------------------------------------------------------------------

    def cacerts(self) -> list[x509.Certificate]:
        """GET /cacerts: the CA certificates the server distributes."""
        status, headers, body = self._request(CACERTS, None)
        if status != 200:
            raise _http_error(CACERTS, status, headers)
        return parse_certs_only(CACERTS, headers, body)

    def simpleenroll(self, csr: x509.CertificateSigningRequest) -> Issued | Pending:
        """POST /simpleenroll with a CSR (a first certificate)."""
        return self._enroll(SIMPLEENROLL, csr)

    def simplereenroll(self, csr: x509.CertificateSigningRequest) -> Issued | Pending:
        """POST /simplereenroll with a CSR (renewal; authenticate with the current cert)."""
        return self._enroll(SIMPLEREENROLL, csr)

    def _enroll(self, operation: str, csr: x509.CertificateSigningRequest) -> Issued | Pending:
        der = csr.public_bytes(serialization.Encoding.DER)
        status, headers, body = self._request(operation, base64.encodebytes(der))
        if status == 202:
            return Pending(_retry_after(headers.get("Retry-After")))
        if status != 200:
            raise _http_error(operation, status, headers)
        return Issued(parse_certs_only(operation, headers, body))

    # -- transport -------------------------------------------------------------------------

    def _request(
        self, operation: str, body: bytes | None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        method = "GET" if body is None else "POST"
        headers = {"Accept": _PKCS7, "Connection": "close"}
        if body is not None:
            headers["Content-Type"] = "application/pkcs10"
            headers["Content-Transfer-Encoding"] = "base64"
        if self._basic is not None:
            user, password = self._basic
            token = base64.b64encode(f"{user}:{password.reveal()}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        deadline = time.monotonic() + self.timeout_s
        connection = http.client.HTTPSConnection(
            self.host, self.port, context=self._context, timeout=self.timeout_s
        )
        where = f"EST {operation} at {self.url(operation)}"
        try:
            connection.request(method, f"{self.base_path}/{operation}", body, headers)
            response = connection.getresponse()
            data = _read_bounded(response, deadline, where)
            return response.status, response.msg, data
        except ssl.SSLCertVerificationError as exc:
            raise EstError(
                f"{where}: server certificate not trusted: {exc.verify_message}"
            ) from exc
        except ssl.SSLError as exc:
            raise EstError(f"{where}: TLS handshake failed: {exc.reason or exc}") from exc
        except TimeoutError as exc:
            raise EstError(f"{where}: no reply within {self.timeout_s:g} s") from exc
        except http.client.HTTPException as exc:
            raise EstError(f"{where}: the reply is not HTTP ({type(exc).__name__})") from exc
        except ConnectionError as exc:
            raise EstError(f"{where}: connection failed: {exc.strerror or exc}") from exc
        except OSError as exc:
            raise EstError(f"{where}: cannot reach the server: {exc.strerror or exc}") from exc
        finally:
            connection.close()


def parse_certs_only(
    operation: str, headers: http.client.HTTPMessage, body: bytes
) -> list[x509.Certificate]:
    """The certificates of a base64 (or, tolerated, binary DER) PKCS#7 certs-only reply."""
    content_type = headers.get_content_type()
    if content_type != _PKCS7:
        shown = headers.get("Content-Type", "none")
        hint = " (an HTML page: is this URL an EST server?)" if content_type == "text/html" else ""
        raise EstError(f"EST {operation}: reply Content-Type is {shown!r}, not {_PKCS7}{hint}")
    der = _decode_body(operation, body)
    try:
        with warnings.catch_warnings():
            # A certs-only bag whose SET OF is not in DER order (openssl writes the order it
            # is given) is valid BER, and cryptography parses it, warning: not the user's
            # concern, and with warnings as errors it would refuse a good reply.
            warnings.filterwarnings("ignore", _BER_FALLBACK, UserWarning)
            certificates = pkcs7.load_der_pkcs7_certificates(der)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise EstError(f"EST {operation}: reply is not a PKCS#7 certs-only structure") from exc
    if not certificates:
        raise EstError(f"EST {operation}: the PKCS#7 reply holds no certificate")
    return certificates


def _decode_body(operation: str, body: bytes) -> bytes:
    if not body.strip():
        raise EstError(f"EST {operation}: the reply body is empty")
    compact = b"".join(body.split())
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        pass
    # RFC 8951 says base64 always; some servers send DER (a SEQUENCE, tag 0x30) anyway.
    if body[:1] == b"\x30":
        return body
    raise EstError(f"EST {operation}: the reply body is neither base64 nor DER")


def _read_bounded(response: http.client.HTTPResponse, deadline: float, where: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise EstError(f"{where}: the reply did not complete in time")
        chunk = response.read(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > _MAX_BODY:
            raise EstError(f"{where}: the reply is larger than {_MAX_BODY} bytes")
        chunks.append(chunk)


def _http_error(operation: str, status: int, headers: http.client.HTTPMessage) -> EstError:
    retry = _retry_after(headers.get("Retry-After")) if status == 503 else None
    if status in (401, 403):
        detail = "authentication refused"
    elif status == 404:
        detail = "not found (wrong label or not an EST server?)"
    elif status >= 500:
        detail = "server error"
    else:
        detail = "unexpected status"
    return EstError(f"EST {operation}: HTTP {status}: {detail}", retry_after_s=retry)


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date); None when absent or invalid."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tls_context(trust_pem: str | None, identity: ClientIdentity | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if trust_pem is not None:
            context.load_verify_locations(cadata=trust_pem)
        else:
            context.load_default_certs()
    except ssl.SSLError as exc:
        raise EstError("the EST trust anchors are not valid PEM certificates") from exc
    if identity is not None:
        with _pem_files(identity) as (cert, key):
            try:
                context.load_cert_chain(cert, key)
            except ssl.SSLError as exc:
                # The message names neither file content nor key material.
                raise EstError(
                    f"the EST client identity is unusable (corrupt PEM, or a key that does "
                    f"not match its certificate): {exc.reason or 'invalid'}"
                ) from None
    return context


@contextlib.contextmanager
def _pem_files(identity: ClientIdentity) -> Iterator[tuple[str, str]]:
    """The identity as two paths `ssl` can load: anonymous memory files on Linux (the key
    never touches a disk), else a private temporary directory removed at once."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        fds = [memfd("est-cert", 0), memfd("est-key", 0)]
        try:
            _write_all(fds[0], identity.cert_chain_pem())
            _write_all(fds[1], identity.key_pem().reveal().encode())
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="unskit-est-") as folder:
        cert, key = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert.write_bytes(identity.cert_chain_pem())
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(identity.key_pem().reveal())
        yield str(cert), str(key)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
