"""A test EST server (RFC 7030): HTTPS on `http.server` + `ssl`, with its own small CA built
with `cryptography` that signs the CSRs it receives.

Serves ``/.well-known/est[/label]/{cacerts,simpleenroll,simplereenroll}`` with HTTP Basic
and client-certificate authentication, a 202 Retry-After path, and switchable misbehaviour
(`mode`: garbage, html, wrong-type, 500, 503 with Retry-After, not-http). Every request is
recorded with its raw body, so tests can check what the client really sent.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import http.server
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PEM = serialization.Encoding.PEM
_OPS = ("cacerts", "simpleenroll", "simplereenroll")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@dataclass
class EstRequest:
    operation: str
    label: str | None
    #: The HTTP Basic user name, when the request carried valid Basic credentials.
    user: str | None
    #: The CN of the verified TLS client certificate, if one was presented.
    client_cn: str | None
    body: bytes
    csr: x509.CertificateSigningRequest | None = None
    status: int = 0
    #: When it arrived (time.monotonic()).
    at: float = field(default_factory=time.monotonic)


@dataclass
class EstServer:
    """Start with `start()`, stop with `stop()`; attributes may be changed while it runs."""

    folder: Path
    #: CAs (PEM) whose certificates authenticate a client (bootstrap identities); the EST
    #: CA itself is always trusted, so an enrolled certificate can renew itself.
    client_cas: list[str] = field(default_factory=list)
    #: (user, password) for HTTP Basic; None accepts no Basic credentials.
    basic: tuple[str, str] | None = None
    #: Labels served besides the unlabelled path.
    labels: frozenset[str] = frozenset()
    #: ok, garbage, html, wrong-type, 500, 503, not-http.
    mode: str = "ok"
    #: Answer this many enroll requests with 202 before issuing.
    pending: int = 0
    retry_after: str = "1"
    cert_days: int = 365
    requests: list[EstRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("unskit EST test CA"))
            .issuer_name(_name("unskit EST test CA"))
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca_pem = self.ca_cert.public_bytes(PEM).decode()
        key = ec.generate_private_key(ec.SECP256R1())
        tls = self.issue(
            key.public_key(),
            "localhost",
            san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
        )
        (self.folder / "tls.crt").write_bytes(tls.public_bytes(PEM))
        key_path = self.folder / "tls.key"
        key_path.write_bytes(
            key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- the CA ------------------------------------------------------------------------------

    def issue(
        self,
        public_key: Any,
        cn: str,
        *,
        not_before: datetime.datetime | None = None,
        not_after: datetime.datetime | None = None,
        san: list[x509.GeneralName] | None = None,
        usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH,
        subject: x509.Name | None = None,
    ) -> x509.Certificate:
        """A certificate from the EST CA for `public_key`."""
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject or _name(cn))
            .issuer_name(self.ca_cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - datetime.timedelta(minutes=1))
            .not_valid_after(not_after or now + datetime.timedelta(days=self.cert_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(self.ca_key, hashes.SHA256())

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> EstServer:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.folder / "tls.crt", self.folder / "tls.key")
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cadata="".join([self.ca_pem, *self.client_cas]))
        est = self

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket.socket, Any]:
                sock, address = self.socket.accept()
                # The handshake runs on the handler's thread, never on the accept loop.
                tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                tls.settimeout(5)
                return tls, address

        class Handler(_Handler):
            server_state = est

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = self._thread = None

    def operations(self) -> list[str]:
        with self._lock:
            return [request.operation for request in self.requests]

    def record(self, request: EstRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def certs_only(self, certs: list[x509.Certificate]) -> bytes:
        der = pkcs7.serialize_certificates(certs, serialization.Encoding.DER)
        return base64.encodebytes(der)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_state: EstServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        sock = self.request
        try:
            sock.do_handshake()
        except (ssl.SSLError, OSError):
            self._handshake_failed = True
        else:
            self._handshake_failed = False
        super().setup()

    def handle(self) -> None:
        if not self._handshake_failed:
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- routing -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        est = self.server_state
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:2] != [".well-known", "est"] or len(parts) not in (3, 4):
            return self._reply(404, "text/plain", b"not found")
        label = parts[2] if len(parts) == 4 else None
        operation = parts[-1]
        request = EstRequest(operation, label, self._basic_user(), self._client_cn(), body)
        est.record(request)
        if operation not in _OPS or (label is not None and label not in est.labels):
            return self._answer(request, 404, "text/plain", b"no such EST resource")
        if (method == "GET") != (operation == "cacerts"):
            return self._answer(request, 405, "text/plain", b"method not allowed")
        if est.mode == "500":
            return self._answer(request, 500, "text/plain", b"internal error")
        if est.mode == "503":
            request.status = 503
            self.send_response(503)
            self.send_header("Retry-After", est.retry_after)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if est.mode == "not-http":
            request.status = -1
            self.wfile.write(b"\x00\x01garbage that is not HTTP\r\n\r\n")
            self.close_connection = True
            return None
        if operation == "cacerts":
            return self._certs(request, [est.ca_cert])
        if operation == "simplereenroll" and request.client_cn is None:
            return self._answer(request, 401, "text/plain", b"reenroll needs a client cert")
        if request.user is None and request.client_cn is None:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="est"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            request.status = 401
            return None
        try:
            csr = x509.load_der_x509_csr(base64.b64decode(b"".join(body.split()), validate=True))
        except (ValueError, binascii.Error):
            return self._answer(request, 400, "text/plain", b"bad CSR")
        request.csr = csr
        if not csr.is_signature_valid:
            return self._answer(request, 400, "text/plain", b"CSR signature invalid")
        if operation == "simplereenroll":
            names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            if not names or names[0].value != request.client_cn:
                return self._answer(request, 400, "text/plain", b"reenroll changes the subject")
        with est._lock:
            waiting = est.pending > 0
            if waiting:
                est.pending -= 1
        if waiting:
            request.status = 202
            self.send_response(202)
            self.send_header("Retry-After", est.retry_after)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        cert = est.issue(csr.public_key(), "", subject=csr.subject)
        return self._certs(request, [cert])

    def _certs(self, request: EstRequest, certs: list[x509.Certificate]) -> None:
        est = self.server_state
        body = est.certs_only(certs)
        if est.mode == "garbage":
            return self._answer(request, 200, "application/pkcs7-mime", b"bm90IGEgY2VydA==\n")
        if est.mode == "html":
            page = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
            return self._answer(request, 200, "text/html; charset=utf-8", page)
        if est.mode == "wrong-type":
            return self._answer(request, 200, "application/json", body)
        return self._answer(request, 200, "application/pkcs7-mime; smime-type=certs-only", body)

    def _answer(self, request: EstRequest, status: int, kind: str, body: bytes) -> None:
        request.status = status
        self._reply(status, kind, body)

    def _reply(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Transfer-Encoding", "base64")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # -- authentication ----------------------------------------------------------------------

    def _basic_user(self) -> str | None:
        expected = self.server_state.basic
        header = self.headers.get("Authorization", "")
        if expected is None or not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, binascii.Error):
            return None
        return user if (user, password) == expected else None

    def _client_cn(self) -> str | None:
        der = self.request.getpeercert(binary_form=True)
        if not der:
            return None
        cert = x509.load_der_x509_certificate(der)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(names[0].value) if names else ""


def iter_bodies(server: EstServer) -> Iterator[bytes]:
    """Every raw request body the server received."""
    with server._lock:
        bodies = [request.body for request in server.requests]
    yield from bodies
