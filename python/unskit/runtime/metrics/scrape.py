"""Target ``scrape``: the Prometheus endpoint and the text exposition format 0.0.4."""

from __future__ import annotations

import http.server
import io
import logging
import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from unskit.config.model import DEFAULT_SCRAPE_HOST, DEFAULT_SCRAPE_PATH, DEFAULT_SCRAPE_PORT
from unskit.runtime.metrics.registry import MetricKind, MetricSample, MetricsRegistry, Number

__all__ = ["PROMETHEUS_CONTENT_TYPE", "ScrapeEmitter", "render_prometheus"]

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SERVER_JOIN_SECS = 5.0

# One logger for the package, `unskit.runtime.metrics` as before it was split in modules.
_log = logging.getLogger(__package__)


class ScrapeEmitter:
    """Target ``scrape``: a Prometheus endpoint rendering the registry's live values."""

    def __init__(
        self,
        registry: MetricsRegistry,
        host: str = DEFAULT_SCRAPE_HOST,
        port: int = DEFAULT_SCRAPE_PORT,
        path: str = DEFAULT_SCRAPE_PATH,
    ) -> None:
        self._registry = registry
        self._host = host
        self._requested_port = port
        self._path = path
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Binds and serves on a daemon thread; a second start is a no-op."""
        with self._lock:
            if self._server is not None:
                return
            server = http.server.ThreadingHTTPServer(
                (self._host, self._requested_port), _scrape_handler(self._registry, self._path)
            )
            server.daemon_threads = True
            thread = threading.Thread(
                target=server.serve_forever, name="unskit-metrics-scrape", daemon=True
            )
            thread.start()
            self._server, self._thread = server, thread

    @property
    def port(self) -> int:
        """The bound port (the ephemeral one when 0 was asked for)."""
        with self._lock:
            if self._server is None:
                raise RuntimeError("the scrape endpoint is not started")
            return int(self._server.server_address[1])

    def emit(self, samples: Sequence[MetricSample], timestamp_ms: int) -> None:
        """Nothing to push: a scrape reads the registry when it comes."""

    def close(self) -> None:
        """Stops serving and releases the port (idempotent)."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(_SERVER_JOIN_SECS)


def _scrape_handler(
    registry: MetricsRegistry, path: str
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        # Only GET is handled; other verbs get the standard library's 501, like the probes.
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != path:
                self._reply(404, "text/plain; charset=utf-8", b"not found")
                return
            text = render_prometheus(registry.collect(reset_interval=False))
            self._reply(200, PROMETHEUS_CONTENT_TYPE, text.encode("utf-8"))

        def _reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            # The stdlib writes every request to stderr; a scrape every 15 s is debug noise.
            _log.debug("scrape %s: " + format, self.address_string(), *args)

    return Handler


def render_prometheus(samples: Iterable[MetricSample]) -> str:
    """Renders samples in the Prometheus text exposition format 0.0.4."""
    families: dict[str, tuple[MetricKind, list[MetricSample]]] = {}
    for sample in samples:
        name = _prometheus_name(f"{sample.family}_{sample.name}")
        if sample.kind is MetricKind.COUNTER and not name.endswith("_total"):
            name += "_total"
        kind, members = families.setdefault(name, (sample.kind, []))
        if kind is sample.kind:
            members.append(sample)
    buffer = io.StringIO()
    for name, (kind, members) in families.items():
        buffer.write(f"# TYPE {name} {kind.value}\n")
        for sample in members:
            value = sample.total if sample.total is not None else sample.value
            buffer.write(
                f"{name}{_prometheus_labels(sample.dimensions)} {_prometheus_value(value)}\n"
            )
    return buffer.getvalue()


_PROM_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_PROM_LABEL_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _prometheus_name(raw: str) -> str:
    name = _PROM_INVALID.sub("_", raw)
    return "_" + name if name[0].isdigit() else name


def _prometheus_labels(dimensions: Mapping[str, str]) -> str:
    if not dimensions:
        return ""
    parts = []
    for key, value in dimensions.items():
        label = _PROM_LABEL_INVALID.sub("_", key)
        if label[0].isdigit():
            label = "_" + label
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{label}="{escaped}"')
    return "{" + ",".join(parts) + "}"


def _prometheus_value(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
