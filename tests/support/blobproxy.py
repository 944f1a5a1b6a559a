"""An HTTP proxy in front of Azurite that misbehaves on request: answers a storm of 503s,
acknowledges a staged block it never forwards, or corrupts the body it forwards (a store
that lies). On 127.0.0.1 only; one upstream connection per request."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

#: (method, query "comp" value or "", body) -> what to do: "forward", "busy", "drop", "flip".
Rule = Callable[[str, str, bytes], str]

BUSY = (
    b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
    b"<Message>The server is busy.</Message></Error>"
)


@dataclass
class BlobProxy:
    upstream_port: int
    rule: Rule = field(default=lambda _m, _c, _b: "forward")
    #: What the proxy did, in order: (method, comp, action).
    log: list[tuple[str, str, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def url(self, account: str) -> str:
        return f"http://127.0.0.1:{self.port}/{account}"

    def start(self) -> BlobProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                comp = parse_qs(urlsplit(self.path).query).get("comp", [""])[0]
                action = proxy.rule(self.command, comp, body)
                proxy.log.append((self.command, comp, action))
                if action == "busy":
                    self._reply(
                        503,
                        {"x-ms-error-code": "ServerBusy", "Content-Type": "application/xml"},
                        BUSY,
                    )
                    return
                if action == "drop":
                    # Acknowledged as Put Block is, never stored.
                    self._reply(201, {"x-ms-request-server-encrypted": "true"}, b"")
                    return
                if action == "flip" and body:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    reply = upstream.getresponse()
                    data = reply.read()
                    passed = {
                        k: v
                        for k, v in reply.getheaders()
                        if k.lower() not in ("connection", "transfer-encoding", "content-length")
                    }
                    # A HEAD reply has no body but the length of the blob.
                    length = reply.getheader("Content-Length") if self.command == "HEAD" else None
                    self._reply(reply.status, passed, data, length)
                finally:
                    upstream.close()

            def _reply(
                self, status: int, headers: dict[str, str], data: bytes, length: str | None = None
            ) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._server = None
