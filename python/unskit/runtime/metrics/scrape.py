"""Target ``scrape``: the Prometheus endpoint, rendered by prometheus_client.

The text format 0.0.4 by default; OpenMetrics 1.0 (or text 1.0.0) when the scraper's
``Accept`` header asks for it, negotiated by the library's own ``choose_encoder``.
"""

from __future__ import annotations

import errno
import http.server
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from unskit.config.model import DEFAULT_SCRAPE_HOST, DEFAULT_SCRAPE_PATH, DEFAULT_SCRAPE_PORT
from unskit.errors import ConfigError, ConfigIssue
from unskit.runtime.metrics.registry import MetricKind, MetricSample, MetricsRegistry

__all__ = ["PROMETHEUS_CONTENT_TYPE", "ScrapeEmitter", "render_exposition", "render_prometheus"]

PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
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
        """Binds and serves on a daemon thread; a second start is a no-op. A bind that fails
        (the port in use) is a ConfigError naming the key, so `unskit run` exits 2 in one line."""
        with self._lock:
            if self._server is not None:
                return
            try:
                server = http.server.ThreadingHTTPServer(
                    (self._host, self._requested_port), _scrape_handler(self._registry, self._path)
                )
            except OSError as error:
                raise ConfigError([self._bind_issue(error)]) from None
            server.daemon_threads = True
            thread = threading.Thread(
                target=server.serve_forever, name="unskit-metrics-scrape", daemon=True
            )
            thread.start()
            self._server, self._thread = server, thread

    def _bind_issue(self, error: OSError) -> ConfigIssue:
        """The key to blame for a bind that failed: the port when it is taken or
        privileged, else the host (not an address of this machine, no such name)."""
        reason = error.strerror or str(error)
        where = f"{self._host}:{self._requested_port}"
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            return ConfigIssue(
                "$.metricEmission.targetConfig.port",
                f"port {self._requested_port} cannot be bound on {self._host} ({reason})",
            )
        return ConfigIssue(
            "$.metricEmission.targetConfig.host", f"{where} cannot be bound ({reason})"
        )

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
            body, content_type = render_exposition(
                registry.collect(reset_interval=False), self.headers.get("Accept")
            )
            self._reply(200, content_type, body)

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
    return generate_latest(_Snapshot(samples)).decode("utf-8")


def render_exposition(samples: Iterable[MetricSample], accept: str | None) -> tuple[bytes, str]:
    """Renders samples in the format the ``Accept`` header asks for: (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(_Snapshot(samples)), content_type


class _Snapshot(Collector):
    """One collect's samples as prometheus_client metric families (a one-shot collector)."""

    def __init__(self, samples: Iterable[MetricSample]) -> None:
        self._samples = samples

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for sample in self._samples:
            name = _prometheus_name(f"{sample.family}_{sample.name}")
            if sample.kind is MetricKind.COUNTER:
                # The library names a counter family without ``_total``, its sample with it.
                base = name.removesuffix("_total")
                name = base + "_total"
                family = families.setdefault(name, CounterMetricFamily(base, _help(sample)))
            else:
                family = families.setdefault(name, GaugeMetricFamily(name, _help(sample)))
            if family.type != sample.kind.value:
                continue  # a gauge and a counter under one name: the first one seen wins
            value = sample.total if sample.total is not None else sample.value
            # add_sample rather than add_metric: the samples of one family may carry
            # different dimensions, and a family's label names are fixed in add_metric.
            family.add_sample(name, _prometheus_labels(sample.dimensions), float(value))
        return list(families.values())


def _help(sample: MetricSample) -> str:
    unit = f" ({sample.unit})" if sample.unit and sample.unit != "None" else ""
    return f"{sample.family}.{sample.name}{unit}"


_PROM_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_PROM_LABEL_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _prometheus_name(raw: str) -> str:
    # The legacy character set, as before the library: Prometheus servers older than 3.0
    # reject the quoted UTF-8 names the library would otherwise write.
    name = _PROM_INVALID.sub("_", raw)
    return "_" + name if name[0].isdigit() else name


def _prometheus_labels(dimensions: Mapping[str, str]) -> dict[str, str]:
    labels = {}
    for key, value in dimensions.items():
        label = _PROM_LABEL_INVALID.sub("_", key)
        if label[0].isdigit():
            label = "_" + label
        labels[label] = value
    return labels
