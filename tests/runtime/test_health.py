"""Health probes over real sockets: configuration, the readiness table, endpoints, lifecycle."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import pytest
from tests.support.tiers import server_fixture

from unskit.config.platform import Platform
from unskit.runtime import health
from unskit.runtime.health import (
    HealthConfig,
    HealthServer,
    ReadinessState,
    profile_health_enabled,
)
from unskit.runtime.shutdown import ShutdownCoordinator

HOST = "127.0.0.1"


class Link:
    """A stand-in messaging link: the connectivity check reads it."""

    def __init__(self, connected: bool = False) -> None:
        self.connected = connected

    def __call__(self) -> bool:
        return self.connected


def get(port: int, path: str, method: str = "GET") -> tuple[int, str, str]:
    """One request on a fresh connection: status, body, Content-Type."""
    conn = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode(), response.getheader("Content-Type", "")
    finally:
        conn.close()


def status(port: int, path: str) -> int:
    return get(port, path)[0]


@server_fixture
def make_server() -> Iterator[Callable[..., HealthServer]]:
    """Starts HealthServers on 127.0.0.1, port 0, and stops them after the test."""
    servers: list[HealthServer] = []

    def make(readiness: ReadinessState, config: HealthConfig | None = None, **kw) -> HealthServer:
        server = HealthServer(config or HealthConfig(port=0), readiness, bind_host=HOST, **kw)
        server.start()
        assert server.port, "server did not bind"
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


# --- configuration -------------------------------------------------------------------------


def test_missing_section_gives_defaults():
    for config in (HealthConfig.from_section(None), HealthConfig.from_section({})):
        assert config.enabled is None
        assert not config.enabled_explicitly_set
        assert config.port == 8081
        assert (config.liveness_path, config.readiness_path, config.startup_path) == (
            "/livez",
            "/readyz",
            "/startupz",
        )


def test_section_keys_are_read():
    config = HealthConfig.from_section(
        {
            "enabled": True,
            "port": 0,
            "livenessPath": "/alive",
            "readinessPath": "/ready",
            "startupPath": "/started",
        }
    )
    assert config == HealthConfig(True, 0, "/alive", "/ready", "/started")
    assert config.enabled_explicitly_set


@pytest.mark.parametrize(
    "section",
    [
        {"enabled": "yes"},
        {"port": "8081"},
        {"port": True},
        {"port": -1},
        {"port": 65536},
        {"livenessPath": "livez"},
        {"readinessPath": ""},
        {"startupPath": "/s?x=1"},
        {"readinessPath": "/livez"},
        {"readnessPath": "/readyz"},
    ],
    ids=lambda s: repr(s),
)
def test_invalid_sections_are_refused(section):
    with pytest.raises(ValueError, match="health"):
        HealthConfig.from_section(section)


ABSENT = object()


@pytest.mark.parametrize(
    ("enabled", "platform", "expected"),
    [
        # explicit wins, both ways
        (True, Platform.CLUSTER, True),
        (True, Platform.HOST, True),
        (True, Platform.EDGE_RUNTIME, True),
        (True, None, True),
        (False, Platform.CLUSTER, False),
        (False, Platform.HOST, False),
        (False, Platform.EDGE_RUNTIME, False),
        (False, None, False),
        # otherwise the platform default
        (ABSENT, Platform.CLUSTER, True),
        (ABSENT, Platform.HOST, False),
        (ABSENT, Platform.EDGE_RUNTIME, False),
        (ABSENT, None, False),
    ],
)
def test_enablement_rules(enabled, platform, expected):
    section = {} if enabled is ABSENT else {"enabled": enabled}
    config = HealthConfig.from_section(section)
    assert config.enabled_explicitly_set is (enabled is not ABSENT)
    assert config.enabled_for(platform) is expected


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        (Platform.CLUSTER, True),
        (Platform.HOST, False),
        (Platform.EDGE_RUNTIME, False),
        (None, False),
    ],
)
def test_profile_health_enabled(platform, expected):
    assert profile_health_enabled(platform) is expected


# --- readiness state -----------------------------------------------------------------------


def test_readiness_predicate_is_the_conjunction():
    link = Link()
    state = ReadinessState(link)
    for connected in (False, True):
        for flag in (False, True):
            link.connected = connected
            state.set_ready(flag)
            assert state.is_ready() is (connected and flag)
    state.set_shutting_down()
    assert state.is_shutting_down()
    assert not state.is_ready()


def test_failing_connectivity_check_reads_as_not_ready():
    def broken() -> bool:
        raise ConnectionError("link state unknown")

    assert ReadinessState(broken).is_ready() is False


# --- the readiness transitions table, row by row, over HTTP --------------------------------


@dataclass
class Probe:
    """A live server with its link and readiness state, and what its probes answer."""

    link: Link
    readiness: ReadinessState
    server: HealthServer

    def answers(self) -> tuple[int, int, int]:
        port = self.server.port
        assert port is not None
        return status(port, "/readyz"), status(port, "/startupz"), status(port, "/livez")


def _connect(p: Probe) -> None:
    p.link.connected = True


def _disconnect(p: Probe) -> None:
    p.link.connected = False


def _gate(flag: bool) -> Callable[[Probe], None]:
    return lambda p: p.readiness.set_ready(flag)


def _begin_shutdown(p: Probe) -> None:
    p.readiness.set_shutting_down()


def _app_shutdown_observed_in_drain(p: Probe) -> tuple[int, int, int]:
    """App-driven shutdown; the probes are read from inside the drain."""
    seen: list[tuple[int, int, int]] = []
    coordinator = ShutdownCoordinator(p.readiness, p.server)
    coordinator.add_drain_step("observer", lambda: seen.append(p.answers()))
    coordinator.shutdown()
    (answers,) = seen
    return answers


@dataclass(frozen=True)
class Row:
    connected: bool
    ready_flag: bool
    shutting_down: bool
    trigger: Callable[[Probe], object]
    readyz: int
    startupz: int
    livez: int = 200


# Rows of the spec's readiness table; "any" conditions are spelled out as separate rows.
READINESS_TABLE = {
    "startup, messaging not yet connected": Row(False, True, False, lambda p: None, 503, 503),
    "messaging connects, readyFlag true, not shutting down": Row(
        False, True, False, _connect, 200, 200
    ),
    "setReady(false) while ready": Row(True, True, False, _gate(False), 503, 503),
    "setReady(false) while disconnected": Row(False, True, False, _gate(False), 503, 503),
    "setReady(false) while shutting down": Row(True, True, True, _gate(False), 503, 503),
    "setReady(true), connected, not shutting down": Row(True, False, False, _gate(True), 200, 200),
    "setReady(true), disconnected": Row(False, False, False, _gate(True), 503, 503),
    "setReady(true), shutting down": Row(True, False, True, _gate(True), 503, 503),
    "messaging disconnects while ready": Row(True, True, False, _disconnect, 503, 503),
    "messaging disconnects while gate held": Row(True, False, False, _disconnect, 503, 503),
    "termination signal / begin-shutdown": Row(True, True, False, _begin_shutdown, 503, 503),
    "app-driven shutdown, during the drain": Row(
        True, True, False, _app_shutdown_observed_in_drain, 503, 503
    ),
}


@pytest.mark.parametrize("row", READINESS_TABLE.values(), ids=READINESS_TABLE.keys())
def test_readiness_transitions(row, make_server):
    link = Link(row.connected)
    readiness = ReadinessState(link)
    readiness.set_ready(row.ready_flag)
    if row.shutting_down:
        readiness.set_shutting_down()
    probe = Probe(link, readiness, make_server(readiness))
    before = probe.answers()
    assert before[2] == 200

    observed = row.trigger(probe)
    answers = observed if observed is not None else probe.answers()

    assert answers == (row.readyz, row.startupz, row.livez)


def test_liveness_never_consults_the_connectivity_check(make_server):
    calls = []

    def check() -> bool:
        calls.append(1)
        return True

    server = make_server(ReadinessState(check))
    assert get(server.port, "/livez") == (200, "ok", "text/plain; charset=utf-8")
    assert calls == []
    assert status(server.port, "/readyz") == 200
    assert calls == [1]


# --- endpoints -----------------------------------------------------------------------------


def test_bodies_and_content_type(make_server):
    link = Link(True)
    server = make_server(ReadinessState(link))
    assert get(server.port, "/livez") == (200, "ok", "text/plain; charset=utf-8")
    assert get(server.port, "/readyz") == (200, "ok", "text/plain; charset=utf-8")
    assert get(server.port, "/startupz") == (200, "ok", "text/plain; charset=utf-8")
    link.connected = False
    assert get(server.port, "/readyz") == (503, "not ready", "text/plain; charset=utf-8")
    assert get(server.port, "/startupz") == (503, "not ready", "text/plain; charset=utf-8")


@pytest.mark.parametrize("path", ["/", "/ready", "/readyz/", "/livez/x", "/LIVEZ", "/metrics"])
def test_unknown_path_is_404(make_server, path):
    server = make_server(ReadinessState(Link(True)))
    assert get(server.port, path) == (404, "not found", "text/plain; charset=utf-8")


def test_query_string_is_ignored_for_routing(make_server):
    server = make_server(ReadinessState(Link(True)))
    assert get(server.port, "/readyz?verbose=1")[:2] == (200, "ok")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
@pytest.mark.parametrize("path", ["/readyz", "/livez", "/nowhere"])
def test_non_get_is_501_from_the_standard_handler(make_server, method, path):
    server = make_server(ReadinessState(Link(True)))
    code, body, content_type = get(server.port, path, method)
    assert code == 501
    assert content_type.startswith("text/plain")
    if method != "HEAD":
        assert method in body


def test_configured_paths_replace_the_defaults(make_server):
    config = HealthConfig(
        port=0, liveness_path="/alive", readiness_path="/ready", startup_path="/started"
    )
    server = make_server(ReadinessState(Link(True)), config)
    assert [status(server.port, p) for p in ("/alive", "/ready", "/started")] == [200] * 3
    assert [status(server.port, p) for p in ("/livez", "/readyz", "/startupz")] == [404] * 3


def test_keep_alive_serves_many_requests_on_one_connection(make_server):
    link = Link(True)
    server = make_server(ReadinessState(link))
    conn = http.client.HTTPConnection(HOST, server.port, timeout=5)
    conn.connect()
    local = conn.sock.getsockname()
    codes = []
    for i in range(20):
        link.connected = i % 2 == 0
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        response.read()
        codes.append(response.status)
        assert response.version == 11
        assert response.getheader("Connection") is None
        # still the same TCP connection
        assert conn.sock is not None
        assert conn.sock.getsockname() == local
    conn.close()
    assert codes == [200, 503] * 10


def test_date_header_is_current(make_server):
    server = make_server(ReadinessState(Link(True)))
    conn = http.client.HTTPConnection(HOST, server.port, timeout=5)
    conn.request("GET", "/livez")
    date = conn.getresponse().getheader("Date")
    conn.close()
    assert date is not None
    assert abs(parsedate_to_datetime(date).timestamp() - time.time()) < 5


def raw_exchange(port: int, request: bytes) -> tuple[bytes, bool]:
    """Sends raw bytes; returns everything read and whether the server then closed."""
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return data, True
            data += chunk
        sock.settimeout(1.0)
        try:
            rest = sock.recv(4096)
        except TimeoutError:
            return data, False
        data += rest
        if not rest:
            return data, True
        try:
            closed = sock.recv(4096) == b""
        except TimeoutError:
            closed = False
        return data, closed


def test_connection_close_is_honoured(make_server):
    server = make_server(ReadinessState(Link(True)))
    data, closed = raw_exchange(
        server.port, b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nConnection: close\r\n" in data
    assert data.endswith(b"\r\n\r\nok")
    assert closed


def test_http10_request_is_answered_and_closed(make_server):
    server = make_server(ReadinessState(Link(False)))
    data, closed = raw_exchange(server.port, b"GET /readyz HTTP/1.0\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert data.endswith(b"not ready")
    assert closed


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /readyz HTTP/1.1\r\n folded: header\r\n\r\n",
        b"GET /readyz HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /readyz HTTP/1.1\r\nName : space before colon\r\n\r\n",
        b"GET /ready z HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_requests_are_400(make_server, request_bytes):
    server = make_server(ReadinessState(Link(True)))
    data, closed = raw_exchange(server.port, request_bytes)
    assert data.startswith(b"HTTP/1.1 400 ")
    assert closed


def test_too_many_headers_is_431(make_server):
    server = make_server(ReadinessState(Link(True)))
    headers = b"".join(b"X-%d: y\r\n" % i for i in range(101))
    data, closed = raw_exchange(server.port, b"GET /readyz HTTP/1.1\r\n" + headers + b"\r\n")
    assert data.startswith(b"HTTP/1.1 431 ")
    assert closed


def test_no_request_lines_on_stderr(make_server, capfd):
    server = make_server(ReadinessState(Link(True)))
    for path in ("/livez", "/readyz", "/nope"):
        get(server.port, path)
    get(server.port, "/readyz", "POST")
    assert capfd.readouterr().err == ""


# --- lifecycle -----------------------------------------------------------------------------


def test_port_zero_reports_the_real_port(make_server):
    server = make_server(ReadinessState(Link(True)))
    assert isinstance(server.port, int)
    assert server.port > 0
    assert server.running


@pytest.mark.integration
def test_bind_failure_is_logged_and_swallowed(caplog):
    with socket.socket() as occupant:
        occupant.bind((HOST, 0))
        occupant.listen()
        taken = occupant.getsockname()[1]
        readiness = ReadinessState(Link(True))
        server = HealthServer(HealthConfig(port=taken), readiness, bind_host=HOST)
        with caplog.at_level(logging.ERROR, logger="unskit.runtime.health"):
            server.start()  # must not raise
        assert not server.running
        assert server.port is None
        assert any(
            r.levelno == logging.ERROR and str(taken) in r.getMessage() for r in caplog.records
        )
        # The component carries on: its readiness works and shutdown completes.
        assert readiness.is_ready()
        coordinator = ShutdownCoordinator(readiness, server)
        ran = []
        coordinator.add_drain_step("messaging", lambda: ran.append("messaging"))
        coordinator.shutdown()
        assert ran == ["messaging"]
        assert coordinator.done
        # The occupant was not disturbed.
        with socket.create_connection((HOST, taken), timeout=5):
            pass


def probe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("unskit-health")]


@pytest.mark.integration
def test_stop_closes_everything_and_is_idempotent():
    before = set(probe_threads())
    server = HealthServer(HealthConfig(port=0), ReadinessState(Link(True)), bind_host=HOST)
    server.stop()  # before start: nothing to do
    server = HealthServer(HealthConfig(port=0), ReadinessState(Link(True)), bind_host=HOST)
    server.start()
    server.start()  # already running: no second listener
    port = server.port
    assert port is not None
    # An idle keep-alive client holds a connection thread open.
    idle = http.client.HTTPConnection(HOST, port, timeout=5)
    idle.request("GET", "/livez")
    assert idle.getresponse().read() == b"ok"

    started = time.monotonic()
    server.stop()
    elapsed = time.monotonic() - started

    assert elapsed < 5.0
    assert not server.running
    assert server.port is None
    assert set(probe_threads()) <= before
    # The idle client's connection was closed by the server.
    assert idle.sock is not None
    assert idle.sock.recv(1) == b""
    idle.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=5)

    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 0.5
    with pytest.raises(RuntimeError):
        server.start()


# --- concurrency and bounds ----------------------------------------------------------------


def test_many_keep_alive_clients_and_a_slow_one_do_not_delay_a_fresh_probe(make_server):
    server = make_server(ReadinessState(Link(True)))
    port = server.port
    stop = threading.Event()
    all_connected = threading.Barrier(51)
    counts = [0] * 50
    failures: list[BaseException] = []

    def client(index: int) -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=10)
        try:
            conn.connect()
            all_connected.wait(timeout=10)
            while not stop.is_set():
                conn.request("GET", "/readyz")
                response = conn.getresponse()
                if response.read() != b"ok" or response.status != 200:
                    raise AssertionError(f"client {index}: {response.status}")
                counts[index] += 1
        except BaseException as exc:
            failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(50)]
    for thread in threads:
        thread.start()
    # The slow client: connected, half a request sent, never finished.
    slow = socket.create_connection((HOST, port), timeout=10)
    slow.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")
    try:
        all_connected.wait(timeout=10)
        fresh = get(port, "/readyz")
        # Answered while the slow client still holds its connection: the probe did not wait
        # for the idle reaping (2 s) to free a slot. A reaped one reads EOF (or a reply).
        slow.setblocking(False)
        try:
            slow.recv(1)
            slow_still_held = False
        except BlockingIOError:
            slow_still_held = True
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        slow.close()
    assert failures == []
    assert fresh == (200, "ok", "text/plain; charset=utf-8")
    assert slow_still_held, "the slow client was dropped before the fresh probe was answered"
    assert all(n > 0 for n in counts)


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        threading.Event().wait(0.01)
    return condition()


def test_connections_beyond_the_bound_are_dropped(make_server):
    server = make_server(ReadinessState(Link(True)), max_connections=4)
    held = []
    for _ in range(4):
        conn = http.client.HTTPConnection(HOST, server.port, timeout=5)
        conn.request("GET", "/livez")
        assert conn.getresponse().read() == b"ok"  # accepted and being served
        held.append(conn)
    with socket.create_connection((HOST, server.port), timeout=5) as extra:
        extra.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            received = extra.recv(1024)
        except ConnectionResetError:
            received = b""
        assert received == b"", "a connection beyond the bound was served"
    held.pop().close()

    def fresh_probe_answers() -> bool:
        try:
            return status(server.port, "/livez") == 200
        except (ConnectionError, http.client.HTTPException):
            return False

    assert _wait_for(fresh_probe_answers)
    for conn in held:
        conn.close()


def test_idle_connections_are_reaped(make_server, monkeypatch):
    monkeypatch.setattr(health, "_IDLE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(health, "_REAP_INTERVAL_S", 0.05)
    server = make_server(ReadinessState(Link(True)))
    with socket.create_connection((HOST, server.port), timeout=5) as silent:
        started = time.monotonic()
        assert silent.recv(1) == b""  # closed by the server, not by our 5 s timeout
        assert time.monotonic() - started < 4.0
    # A busy keep-alive client is not reaped while it keeps asking.
    conn = http.client.HTTPConnection(HOST, server.port, timeout=5)
    conn.connect()
    local = conn.sock.getsockname()
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        conn.request("GET", "/livez")
        assert conn.getresponse().read() == b"ok"
        assert conn.sock.getsockname() == local
    conn.close()


def test_accepted_connections_disable_nagle(make_server):
    server = make_server(ReadinessState(Link(True)))
    conn = http.client.HTTPConnection(HOST, server.port, timeout=5)
    conn.request("GET", "/livez")
    assert conn.getresponse().read() == b"ok"
    # White-box: the option lives on the server's side of the connection.
    inner = server._server
    assert inner is not None
    sockets = [c.sock for c in inner._connections.values()]
    try:
        assert len(sockets) == 1
        assert sockets[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        conn.close()


def test_the_runtime_names_are_the_config_model_ones():
    from unskit.config import model

    assert health.HealthConfig is model.HealthConfig
    assert health.profile_health_enabled is model.profile_health_enabled
    assert health.DEFAULT_HEALTH_PORT == model.DEFAULT_HEALTH_PORT == 8081
