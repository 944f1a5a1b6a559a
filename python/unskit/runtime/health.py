"""Health probes: the readiness state and the probe HTTP server for a `HealthConfig`.

The server answers liveness, readiness and startup probes (HTTP/1.1, keep-alive, text/plain)
from a thread-safe :class:`ReadinessState`. A component normally never builds it itself: the
runtime wires it and the component only drives readiness. The ``health`` section is parsed in
`unskit.config.model` (`HealthConfig`, `profile_health_enabled`), re-exported here.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from unskit.config.model import DEFAULT_HEALTH_PORT, HealthConfig, profile_health_enabled

__all__ = [
    "DEFAULT_HEALTH_PORT",
    "HealthConfig",
    "HealthServer",
    "ReadinessState",
    "profile_health_enabled",
]

_log = logging.getLogger(__name__)

# Spec limit for the Python variant.
_STOP_JOIN_TIMEOUT_S = 5.0
# Bounds a probe port against connection floods: one thread per connection up to this many;
# beyond it a new connection is closed at once rather than queued behind the ones holding slots.
_MAX_CONNECTIONS = 128
# A connection that completes no request for this long is closed, so a stalled or slow client
# frees its slot (the Rust variant's per-connection read timeout has the same value).
_IDLE_TIMEOUT_S = 2.0
_REAP_INTERVAL_S = 0.5
# Kernel accept backlog; the standard library's 5 drops SYNs when many probes connect at once.
_LISTEN_BACKLOG = 128
# Request header limits, the standard library's own.
_MAX_LINE = 65536
_MAX_HEADERS = 100
# How quickly the accept loop notices stop().
_POLL_INTERVAL_S = 0.1


class ReadinessState:
    """Thread-safe readiness: ready = connectivity AND readyFlag AND NOT shuttingDown."""

    def __init__(self, connectivity: Callable[[], bool]) -> None:
        # Probes call `connectivity` from their own threads, concurrently.
        self._connectivity = connectivity
        self._lock = threading.Lock()
        self._ready_flag = True
        self._shutting_down = False

    def set_ready(self, ready: bool) -> None:
        """Sets the component's own gate (readyFlag); it cannot force readiness on its own."""
        with self._lock:
            self._ready_flag = bool(ready)

    def set_shutting_down(self) -> None:
        """Begins shutdown: readiness answers 503 from now on, for good."""
        # One store, no lock: a signal handler calls this on a thread that may hold the lock.
        self._shutting_down = True

    def is_shutting_down(self) -> bool:
        """True once shutdown has begun."""
        with self._lock:
            return self._shutting_down

    def is_ready(self) -> bool:
        """The readiness predicate; a failing connectivity check counts as disconnected."""
        with self._lock:
            if self._shutting_down or not self._ready_flag:
                return False
        # Called outside the lock: the check belongs to messaging and may take its own locks.
        try:
            return bool(self._connectivity())
        except Exception:
            _log.debug("connectivity check raised; reporting not ready", exc_info=True)
            return False


# Probe kinds, the routing table's values.
_LIVENESS = 0
_READINESS = 1
_NOT_FOUND = 2

_CONTENT_TYPE = "text/plain; charset=utf-8"


def _response_parts(status: str, body: bytes) -> tuple[bytes, bytes]:
    """A response split around its Date value: the bytes before it, and the body."""
    head = f"HTTP/1.1 {status}\r\nContent-Type: {_CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n"
    return head.encode("ascii") + b"Date: ", body


_OK = _response_parts("200 OK", b"ok")
_NOT_READY = _response_parts("503 Service Unavailable", b"not ready")
_MISSING = _response_parts("404 Not Found", b"not found")
# What follows the Date value, by what the connection does next.
_END_KEEP = b"\r\n\r\n"
_END_KEEP_HTTP10 = b"\r\nConnection: keep-alive\r\n\r\n"
_END_CLOSE = b"\r\nConnection: close\r\n\r\n"


class _HttpDate:
    """The Date header value, rendered once per second instead of once per request."""

    def __init__(self) -> None:
        self._cached: tuple[int, bytes] = (-1, b"")

    def now(self) -> bytes:
        second = int(time.time())
        cached = self._cached
        if cached[0] == second:
            return cached[1]
        value = formatdate(second, usegmt=True).encode("ascii")
        # A plain attribute swap: racing threads at worst render the same second twice.
        self._cached = (second, value)
        return value


_http_date = _HttpDate()


class _Connection:
    """One accepted connection: its socket, its thread and when it last finished a request."""

    __slots__ = ("last_active", "sock", "thread")

    def __init__(self, sock: socket.socket, thread: threading.Thread) -> None:
        self.sock = sock
        self.thread = thread
        self.last_active = time.monotonic()


class _ProbeHandler(BaseHTTPRequestHandler):
    """Answers GET probes with one write per response; other verbs get the stdlib 501."""

    protocol_version = "HTTP/1.1"
    # Keep-alive with Nagle stalls every small response for the peer's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    # Errors the standard library answers itself (501, 400, 414) keep its status, in text/plain.
    error_content_type = _CONTENT_TYPE
    error_message_format = "%(message)s"
    server: _ProbeHTTPServer
    raw_requestline: bytes
    _connection: _Connection | None

    def setup(self) -> None:
        """Finds this connection's record, where each request stamps its activity."""
        super().setup()
        self._connection = self.server.connection_of(self.request)

    def parse_request(self) -> bool:
        """Parses `GET <path> HTTP/1.1` itself; anything else goes to the standard library.

        The standard parser runs every header block through the email package, which costs
        more than the whole rest of a probe.
        """
        words = self.raw_requestline.split()
        if len(words) != 3 or words[0] != b"GET" or words[2] != b"HTTP/1.1":
            return super().parse_request()
        self.command = "GET"
        self.request_version = "HTTP/1.1"
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        path = str(words[1], "iso-8859-1")
        if path.startswith("//"):
            # As the standard library does (gh-87389).
            path = "/" + path.lstrip("/")
        self.path = path
        self.close_connection = False
        headers = HTTPMessage()
        for _ in range(_MAX_HEADERS + 1):
            line = self.rfile.readline(_MAX_LINE + 1)
            if line in (b"\r\n", b"\n", b""):
                break
            if len(line) > _MAX_LINE:
                self.close_connection = True
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
                return False
            name, colon, value = str(line, "iso-8859-1").partition(":")
            if not colon or not name or name != name.strip():
                # Obsolete line folding and field lines without a name (RFC 9112 5.1, 5.2).
                self.close_connection = True
                self.send_error(HTTPStatus.BAD_REQUEST, "Bad header line")
                return False
            headers[name] = value.strip()
        else:
            self.close_connection = True
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
            return False
        self.headers = headers
        if headers.get("Connection", "").lower() == "close":
            self.close_connection = True
        if headers.get("Expect", "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def do_GET(self) -> None:
        """Routes by path (the query string is ignored) and writes the whole response at once."""
        path = self.path
        if "?" in path:
            path = path.partition("?")[0]
        kind = self.server.routes.get(path, _NOT_FOUND)
        if kind == _LIVENESS:
            parts = _OK
        elif kind == _NOT_FOUND:
            parts = _MISSING
        else:
            parts = _OK if self.server.readiness.is_ready() else _NOT_READY
        if self.close_connection:
            end = _END_CLOSE
        elif self.request_version == "HTTP/1.0":
            end = _END_KEEP_HTTP10
        else:
            end = _END_KEEP
        self.wfile.write(b"".join((parts[0], _http_date.now(), end, parts[1])))
        if self._connection is not None:
            self._connection.last_active = time.monotonic()

    def log_message(self, format: str, *args: Any) -> None:
        """Keeps probes off stderr; the standard library's own errors go to debug."""
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("%s: " + format, self.address_string(), *args)


class _ProbeHTTPServer(HTTPServer):
    """An HTTP server with one daemon thread per connection, bounded, and closable at once.

    Idle connections are reaped from the accept loop rather than with socket timeouts: a
    timeout turns every recv() into poll() + recv(), two GIL round trips instead of one, which
    costs more than half the throughput when many probes compete for the GIL.
    """

    allow_reuse_address = True
    request_queue_size = _LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        routes: dict[str, int],
        readiness: ReadinessState,
        max_connections: int,
    ) -> None:
        self.routes = routes
        self.readiness = readiness
        self._slots = threading.BoundedSemaphore(max_connections)
        # Guards _connections; a socket is shut down only under it and closed only after
        # leaving it, so a shutdown() can never hit a reused descriptor.
        self._connections_lock = threading.Lock()
        self._connections: dict[socket.socket, _Connection] = {}
        self._next_reap = 0.0
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _ProbeHandler)

    def server_bind(self) -> None:
        """Binds without HTTPServer's reverse DNS lookup of the host, which can stall start()."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def connection_of(self, sock: socket.socket) -> _Connection | None:
        """The record of an accepted connection, if it is still open."""
        with self._connections_lock:
            return self._connections.get(sock)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serves the connection on its own daemon thread, or drops it when at capacity."""
        if not self._slots.acquire(blocking=False):
            _log.debug("health server full; dropping connection from %s", client_address)
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name="unskit-health-conn",
            daemon=True,
        )
        with self._connections_lock:
            self._connections[request] = _Connection(request, thread)
        try:
            thread.start()
        except BaseException:
            with self._connections_lock:
                self._connections.pop(request, None)
            self._slots.release()
            self.shutdown_request(request)
            raise

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            _log.debug("health connection from %s failed", client_address, exc_info=True)
        finally:
            with self._connections_lock:
                self._connections.pop(request, None)
            self.shutdown_request(request)
            self._slots.release()

    def service_actions(self) -> None:
        """Called by the accept loop between accepts: reaps connections idle too long."""
        now = time.monotonic()
        if now < self._next_reap:
            return
        self._next_reap = now + _REAP_INTERVAL_S
        with self._connections_lock:
            for connection in self._connections.values():
                if now - connection.last_active > _IDLE_TIMEOUT_S:
                    _shutdown_quietly(connection.sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Logs at debug instead of printing a traceback to stderr."""
        _log.debug("health request from %s failed", client_address, exc_info=True)

    def close_connections(self, deadline: float) -> None:
        """Ends every open connection and waits for its thread until `deadline` (monotonic)."""
        with self._connections_lock:
            connections = list(self._connections.values())
            for connection in connections:
                _shutdown_quietly(connection.sock)
        for connection in connections:
            connection.thread.join(max(0.0, deadline - time.monotonic()))


def _shutdown_quietly(sock: socket.socket) -> None:
    """Wakes the thread blocked on `sock` (close() alone would not) and ends the connection."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class HealthServer:
    """The probe HTTP server: liveness, readiness and startup on the configured paths."""

    def __init__(
        self,
        config: HealthConfig,
        readiness: ReadinessState,
        # All interfaces: the orchestrator probes the pod or host address.
        bind_host: str = "0.0.0.0",
        *,
        max_connections: int = _MAX_CONNECTIONS,
    ) -> None:
        self._config = config
        self._readiness = readiness
        self._bind_host = bind_host
        self._max_connections = max_connections
        self._lock = threading.Lock()
        self._server: _ProbeHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def port(self) -> int | None:
        """The port actually listened on (resolves port 0); None when not listening."""
        server = self._server
        return None if server is None else int(server.server_address[1])

    @property
    def running(self) -> bool:
        """True while the server is listening."""
        return self._server is not None

    def start(self) -> None:
        """Binds and serves on a daemon thread; a bind failure is logged and swallowed."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("a stopped HealthServer cannot be started again")
            if self._server is not None:
                return
            routes = {
                self._config.liveness_path: _LIVENESS,
                self._config.readiness_path: _READINESS,
                self._config.startup_path: _READINESS,
            }
            address = (self._bind_host, self._config.port)
            try:
                server = _ProbeHTTPServer(address, routes, self._readiness, self._max_connections)
            except OSError as exc:
                # A port clash never stops the component; it just runs without probes.
                _log.error(
                    "health server could not bind %s:%d (%s); continuing without probes",
                    self._bind_host,
                    self._config.port,
                    exc,
                )
                return
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": _POLL_INTERVAL_S},
                name="unskit-health",
                daemon=True,
            )
            thread.start()
            self._server, self._thread = server, thread
        _log.info(
            "health server listening on %s:%d (%s, %s, %s)",
            self._bind_host,
            server.server_address[1],
            self._config.liveness_path,
            self._config.readiness_path,
            self._config.startup_path,
        )

    def stop(self) -> None:
        """Stops serving and closes open connections; idempotent, joins within 5 s."""
        with self._lock:
            self._stopped = True
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None or thread is None:
            return
        deadline = time.monotonic() + _STOP_JOIN_TIMEOUT_S
        server.shutdown()
        server.server_close()
        server.close_connections(deadline)
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            _log.warning("health server thread did not stop within %.0f s", _STOP_JOIN_TIMEOUT_S)
        _log.debug("health server stopped")
