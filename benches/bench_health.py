"""Health probes under load: our HealthServer beside a bare ThreadingHTTPServer at its best.

Both serve `GET /readyz` -> 200 `ok` (text/plain) on loopback; wrk drives each with the same
keep-alive load, alternating, a few rounds each; the row records median requests/s and p99.
The anchor is configured as well as the standard library allows: HTTP/1.1 keep-alive,
TCP_NODELAY, no per-request log line, the same listen backlog as ours.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import statistics
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from unskit.runtime.health import HealthConfig, HealthServer, ReadinessState

HOST = "127.0.0.1"
WRK_THREADS = 2
WRK_CONNECTIONS = 32
WRK_SECONDS = 3
ROUNDS = 3
BODY = b"ok"


class _AnchorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _AnchorServer(ThreadingHTTPServer):
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # wrk drops its connections at the end of a run; those are not failures.
        pass


@contextmanager
def anchor_server() -> Iterator[int]:
    server = _AnchorServer((HOST, 0), _AnchorHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def our_server() -> Iterator[int]:
    server = HealthServer(HealthConfig(port=0), ReadinessState(lambda: True), bind_host=HOST)
    server.start()
    assert server.port is not None
    try:
        yield server.port
    finally:
        server.stop()


@dataclass(frozen=True)
class WrkRun:
    requests_per_s: float
    p99_ms: float
    errors: int


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * _UNIT_MS[unit]


def run_wrk(
    port: int,
    threads: int = WRK_THREADS,
    connections: int = WRK_CONNECTIONS,
    seconds: int = WRK_SECONDS,
) -> WrkRun:
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            f"http://{HOST}:{port}/readyz",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    assert rps, out
    assert p99, out
    errors = sum(
        int(n)
        for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out)
        + re.findall(r"Non-2xx or 3xx responses: (\d+)", out)
    )
    return WrkRun(float(rps.group(1)), _ms(p99.group(1)), errors)


def test_health_readyz_under_wrk(benchmark, ratio) -> None:
    if shutil.which("wrk") is None:
        message = "wrk is not installed (Debian package wrk)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with our_server() as ours_port, anchor_server() as anchor_port:
        # pytest-benchmark's own view: one keep-alive probe round trip to our server.
        conn = http.client.HTTPConnection(HOST, ours_port, timeout=5)

        def probe() -> int:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            response.read()
            return response.status

        benchmark.group = "health"
        assert benchmark(probe) == 200
        conn.close()

        runs: dict[str, list[WrkRun]] = {"ours": [], "anchor": []}
        ports = {"ours": ours_port, "anchor": anchor_port}
        for round_ in range(ROUNDS):
            # Alternate who goes first, so drift in machine load favours neither.
            order = ["ours", "anchor"] if round_ % 2 == 0 else ["anchor", "ours"]
            for impl in order:
                runs[impl].append(run_wrk(ports[impl]))

    for impl, impl_runs in runs.items():
        assert all(r.errors == 0 for r in impl_runs), (impl, impl_runs)
    ours_rps = statistics.median(r.requests_per_s for r in runs["ours"])
    anchor_rps = statistics.median(r.requests_per_s for r in runs["anchor"])
    row = ratio(
        "health.readyz.wrk",
        ours_rps,
        "ThreadingHTTPServer (HTTP/1.1, TCP_NODELAY)",
        anchor_rps,
        target=1.0,
        ours_p99_ms=round(statistics.median(r.p99_ms for r in runs["ours"]), 2),
        anchor_p99_ms=round(statistics.median(r.p99_ms for r in runs["anchor"]), 2),
        load=f"wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS} -d{WRK_SECONDS}s x{ROUNDS}",
    )
    print(
        f"\n{row['name']}: ours {row['ours_ops_per_s']} req/s p99 {row['ours_p99_ms']} ms; "
        f"anchor {row['anchor_ops_per_s']} req/s p99 {row['anchor_p99_ms']} ms; "
        f"ratio {row['ratio']}x"
    )
