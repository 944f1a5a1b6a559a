"""Component metrics: a thread-safe registry, the four emission targets and the emit loop.

A metric is named by a *family* (e.g. ``southbound_health``, ``OpcUaCommand``) and a *name*
inside it, and carries string *dimensions* (e.g. ``instance``); the registry's common
dimensions are added to every metric. A counter has an *interval* value, reset at every
emit, and a *total* that never resets; a gauge has a current value.

Section ``metricEmission`` (parsed in `unskit.config.model` as `MetricEmissionConfig`):
``target`` is ``log`` (default), ``scrape``, ``cloudmon`` or ``messaging``; ``targetConfig``
holds the target's options:

========== ============================================================================
log        (none) one line per emit on logger ``unskit.metrics``: the JSON document
           ``{"timestamp": RFC 3339, "metrics": [{family, name, kind, unit, dimensions,
           value, total (counters)}]}``, ``value`` being the interval value for counters
scrape     ``host`` (default 0.0.0.0), ``port`` (default 9464, 0 = ephemeral), ``path``
           (default /metrics): Prometheus text exposition 0.0.4, name ``{family}_{name}``,
           counters as ``..._total`` carrying the total, dimensions as labels
cloudmon   ``namespace`` (default unskit): CloudWatch embedded metric format, one JSON line
           per family and dimension set per emit (family is a dimension), counters carry the
           interval value with unit Count
messaging  ``destination`` local (default) or cloud: one message ``Metrics`` 1.0 per family
           and instance per emit, on ``{root}/{device}/{component}[/{instance}]/metric/
           {family}``; ``targetConfig.topic`` is refused, the topic is minted by the library
========== ============================================================================
"""

from __future__ import annotations

import enum
import http.server
import io
import json
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TextIO

from unskit.config.model import (
    DEFAULT_CLOUDMON_NAMESPACE,
    DEFAULT_METRIC_INTERVAL_SECONDS,
    DEFAULT_SCRAPE_HOST,
    DEFAULT_SCRAPE_PATH,
    DEFAULT_SCRAPE_PORT,
    MetricEmissionConfig,
    MetricTarget,
)
from unskit.envelope import EnvelopeStamp, MessageBuilder
from unskit.runtime.events import Publisher
from unskit.topics import TopicScope, validate_token

__all__ = [
    "CLOUDMON_MAX_METRICS_PER_LINE",
    "DEFAULT_CLOUDMON_NAMESPACE",
    "DEFAULT_METRIC_INTERVAL_SECONDS",
    "DEFAULT_SCRAPE_HOST",
    "DEFAULT_SCRAPE_PATH",
    "DEFAULT_SCRAPE_PORT",
    "METRICS_MESSAGE_NAME",
    "METRICS_MESSAGE_VERSION",
    "PROMETHEUS_CONTENT_TYPE",
    "CloudmonEmitter",
    "Counter",
    "Gauge",
    "LogEmitter",
    "MessagingEmitter",
    "MetricEmissionConfig",
    "MetricEmitter",
    "MetricKind",
    "MetricSample",
    "MetricTarget",
    "MetricsRegistry",
    "MetricsReporter",
    "ScrapeEmitter",
    "create_emitter",
    "render_prometheus",
]

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_MESSAGE_NAME = "Metrics"
METRICS_MESSAGE_VERSION = "1.0"
# The embedded metric format accepts at most 100 metrics in one directive.
CLOUDMON_MAX_METRICS_PER_LINE = 100
_STOP_JOIN_SECS = 5.0
_INSTANCE = "instance"

_log = logging.getLogger(__name__)


class MetricKind(str, enum.Enum):
    """Counter (interval and total) or gauge (current value)."""

    COUNTER = "counter"
    GAUGE = "gauge"


Number = int | float
_Key = tuple[str, str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class MetricSample:
    """One metric as read at an emit: for counters ``value`` is the interval value."""

    family: str
    name: str
    kind: MetricKind
    unit: str
    dimensions: Mapping[str, str]
    value: Number
    total: Number | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used by the log and messaging targets."""
        out: dict[str, Any] = {
            "family": self.family,
            "name": self.name,
            "kind": self.kind.value,
            "unit": self.unit,
            "dimensions": dict(self.dimensions),
            "value": _json_number(self.value),
        }
        if self.total is not None:
            out["total"] = _json_number(self.total)
        return out


class Counter:
    """A counter: ``inc`` adds to both the interval value and the never-reset total."""

    __slots__ = ("_interval", "_lock", "_total", "unit")

    def __init__(self, lock: threading.Lock, unit: str) -> None:
        self._lock = lock
        self._interval: Number = 0
        self._total: Number = 0
        self.unit = unit

    def inc(self, amount: Number = 1) -> None:
        """Adds a non-negative amount."""
        if not _is_number(amount) or amount < 0 or math.isnan(amount):
            raise ValueError(f"a counter only grows; got {amount!r}")
        with self._lock:
            self._interval += amount
            self._total += amount

    @property
    def interval(self) -> Number:
        """The amount added since the last emit."""
        with self._lock:
            return self._interval

    @property
    def total(self) -> Number:
        """The amount added since the counter was created."""
        with self._lock:
            return self._total


class Gauge:
    """A gauge: a value that is set, or moved up and down."""

    __slots__ = ("_lock", "_value", "unit")

    def __init__(self, lock: threading.Lock, unit: str) -> None:
        self._lock = lock
        self._value: Number = 0
        self.unit = unit

    def set(self, value: Number) -> None:
        """Sets the current value."""
        if not _is_number(value):
            raise TypeError(f"a gauge value must be a number, not {type(value).__name__}")
        with self._lock:
            self._value = value

    def inc(self, amount: Number = 1) -> None:
        """Moves the value up (or down for a negative amount)."""
        if not _is_number(amount):
            raise TypeError(f"a gauge step must be a number, not {type(amount).__name__}")
        with self._lock:
            self._value += amount

    def dec(self, amount: Number = 1) -> None:
        """Moves the value down."""
        self.inc(-amount)

    @property
    def value(self) -> Number:
        """The current value."""
        with self._lock:
            return self._value


class MetricsRegistry:
    """Thread-safe set of counters and gauges keyed by family, name and dimensions."""

    def __init__(self, dimensions: Mapping[str, str] | None = None) -> None:
        self._common = _dimensions(dimensions, "common dimension")
        # One lock for every metric, so a collect sees (and resets) all of them at one instant.
        self._lock = threading.Lock()
        self._metrics: dict[_Key, Counter | Gauge] = {}

    @property
    def common_dimensions(self) -> Mapping[str, str]:
        """Dimensions added to every metric of this registry."""
        return dict(self._common)

    def counter(
        self,
        family: str,
        name: str,
        dimensions: Mapping[str, str] | None = None,
        *,
        unit: str = "Count",
    ) -> Counter:
        """Returns the counter for these coordinates, creating it on first use."""
        metric = self._get(family, name, dimensions, MetricKind.COUNTER, unit)
        assert isinstance(metric, Counter)
        return metric

    def gauge(
        self,
        family: str,
        name: str,
        dimensions: Mapping[str, str] | None = None,
        *,
        unit: str = "None",
    ) -> Gauge:
        """Returns the gauge for these coordinates, creating it on first use."""
        metric = self._get(family, name, dimensions, MetricKind.GAUGE, unit)
        assert isinstance(metric, Gauge)
        return metric

    def remove(self, dimensions: Mapping[str, str]) -> int:
        """Forgets the metrics whose dimensions include all of these; returns how many."""
        wanted = set(_dimensions(dimensions, "dimension").items())
        with self._lock:
            gone = [key for key in self._metrics if wanted <= set(key[2])]
            for key in gone:
                del self._metrics[key]
        return len(gone)

    def collect(self, *, reset_interval: bool) -> list[MetricSample]:
        """Reads every metric at one instant; ``reset_interval`` starts a new interval."""
        samples = []
        with self._lock:
            for (family, name, dims), metric in self._metrics.items():
                if isinstance(metric, Counter):
                    samples.append(
                        MetricSample(
                            family,
                            name,
                            MetricKind.COUNTER,
                            metric.unit,
                            dict(dims),
                            metric._interval,
                            metric._total,
                        )
                    )
                    if reset_interval:
                        metric._interval = 0
                else:
                    samples.append(
                        MetricSample(
                            family,
                            name,
                            MetricKind.GAUGE,
                            metric.unit,
                            dict(dims),
                            metric._value,
                            None,
                        )
                    )
        return samples

    def _get(
        self,
        family: str,
        name: str,
        dimensions: Mapping[str, str] | None,
        kind: MetricKind,
        unit: str,
    ) -> Counter | Gauge:
        _name(family, "metric family")
        _name(name, "metric name")
        dims = {**self._common, **_dimensions(dimensions, "dimension")}
        key: _Key = (family, name, tuple(sorted(dims.items())))
        with self._lock:
            metric = self._metrics.get(key)
            if metric is None:
                metric = (
                    Counter(self._lock, unit)
                    if kind is MetricKind.COUNTER
                    else Gauge(self._lock, unit)
                )
                self._metrics[key] = metric
            elif (kind is MetricKind.COUNTER) != isinstance(metric, Counter):
                raise ValueError(f"metric {family}/{name} already exists with another kind")
            return metric


class MetricEmitter(Protocol):
    """One emission target."""

    def emit(self, samples: Sequence[MetricSample], timestamp_ms: int) -> None:
        """Sends one emit's samples."""

    def close(self) -> None:
        """Releases what the target holds (idempotent)."""


class LogEmitter:
    """Target ``log``: one structured log line per emit."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO) -> None:
        self._logger = logger or logging.getLogger("unskit.metrics")
        self._level = level

    def emit(self, samples: Sequence[MetricSample], timestamp_ms: int) -> None:
        """Logs the samples as one JSON document."""
        document = {
            "timestamp": _rfc3339(timestamp_ms),
            "metrics": [sample.to_dict() for sample in samples],
        }
        self._logger.log(self._level, "%s", json.dumps(document, separators=(",", ":")))

    def close(self) -> None:
        """Nothing to release."""


class CloudmonEmitter:
    """Target ``cloudmon``: CloudWatch embedded metric format, one JSON object per line."""

    def __init__(
        self, namespace: str = DEFAULT_CLOUDMON_NAMESPACE, stream: TextIO | None = None
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise ValueError("metricEmission.targetConfig.namespace must be a non-empty string")
        self._namespace = namespace
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, samples: Sequence[MetricSample], timestamp_ms: int) -> None:
        """Writes the samples, grouped by family and dimension set."""
        out = self._stream if self._stream is not None else sys.stdout
        lines = self.render(samples, timestamp_ms)
        with self._lock:
            for line in lines:
                out.write(line + "\n")
            out.flush()

    def render(self, samples: Sequence[MetricSample], timestamp_ms: int) -> list[str]:
        """Returns the JSON lines for one emit."""
        groups: dict[tuple[tuple[str, str], ...], list[MetricSample]] = {}
        for sample in samples:
            # The format has no NaN or infinity and a null value invalidates the whole line.
            if isinstance(sample.value, float) and not math.isfinite(sample.value):
                continue
            dims = {"family": sample.family, **sample.dimensions}
            groups.setdefault(tuple(dims.items()), []).append(sample)
        lines = []
        for dims_items, group in groups.items():
            dims = dict(dims_items)
            for start in range(0, len(group), CLOUDMON_MAX_METRICS_PER_LINE):
                chunk = group[start : start + CLOUDMON_MAX_METRICS_PER_LINE]
                document: dict[str, Any] = {
                    "_aws": {
                        "Timestamp": timestamp_ms,
                        "CloudWatchMetrics": [
                            {
                                "Namespace": self._namespace,
                                "Dimensions": [list(dims)],
                                "Metrics": [{"Name": s.name, "Unit": s.unit} for s in chunk],
                            }
                        ],
                    },
                    **dims,
                }
                for sample in chunk:
                    document[sample.name] = _json_number(sample.value)
                lines.append(json.dumps(document, separators=(",", ":")))
        return lines

    def close(self) -> None:
        """Flushes the stream; it belongs to the caller, so it stays open."""
        out = self._stream if self._stream is not None else sys.stdout
        with self._lock:
            out.flush()


class MessagingEmitter:
    """Target ``messaging``: one message per family and instance per emit, on the metric
    topic the library mints (``.../metric/{family}``)."""

    def __init__(
        self, publisher: Publisher, scope: TopicScope, *, stamp: EnvelopeStamp | None = None
    ) -> None:
        self._publisher = publisher
        self._scope = scope
        self._stamp = stamp

    def emit(self, samples: Sequence[MetricSample], timestamp_ms: int) -> None:
        """Publishes the samples; a failing publish is logged and the next family still goes."""
        groups: dict[tuple[str, str | None], list[MetricSample]] = {}
        for sample in samples:
            groups.setdefault((sample.family, sample.dimensions.get(_INSTANCE)), []).append(sample)
        for (family, instance), group in groups.items():
            try:
                self._publish(family, instance, group, timestamp_ms)
            except Exception:
                _log.exception("metric publication of family %s failed", family)

    def _publish(
        self, family: str, instance: str | None, group: list[MetricSample], timestamp_ms: int
    ) -> None:
        topic = self._scope.topic("metric", family, instance=instance)
        metrics = []
        for sample in group:
            entry = sample.to_dict()
            del entry["family"]
            # The instance is already the topic's (and identity's) instance token.
            entry["dimensions"].pop(_INSTANCE, None)
            metrics.append(entry)
        body: dict[str, Any] = {"family": family, "metrics": metrics}
        if instance is not None:
            body[_INSTANCE] = instance
        builder = (
            MessageBuilder(METRICS_MESSAGE_NAME, METRICS_MESSAGE_VERSION, self._stamp)
            .body(body)
            .timestamp_ms(timestamp_ms)
        )
        if instance is not None and self._stamp is not None and self._stamp.identity is not None:
            builder.instance(instance)
        self._publisher.publish(topic, builder.build())

    def close(self) -> None:
        """The publisher belongs to the caller; nothing to release."""


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
            thread.join(_STOP_JOIN_SECS)


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


def create_emitter(
    config: MetricEmissionConfig,
    registry: MetricsRegistry,
    *,
    scope: TopicScope | None = None,
    local: Publisher | None = None,
    cloud: Publisher | None = None,
    stamp: EnvelopeStamp | None = None,
    stream: TextIO | None = None,
) -> MetricEmitter:
    """Builds the emitter the configuration selects; a scrape emitter is started."""
    if config.target is MetricTarget.LOG:
        return LogEmitter()
    if config.target is MetricTarget.CLOUDMON:
        return CloudmonEmitter(config.namespace, stream)
    if config.target is MetricTarget.SCRAPE:
        scrape = ScrapeEmitter(registry, config.host, config.port, config.path)
        scrape.start()
        return scrape
    publisher = local if config.destination == "local" else cloud
    if publisher is None:
        raise ValueError(
            f"metricEmission.targetConfig.destination is {config.destination} "
            f"but no {config.destination} publisher is available"
        )
    if scope is None:
        raise ValueError("metricEmission.target messaging needs the component's topic scope")
    return MessagingEmitter(publisher, scope, stamp=stamp)


class MetricsReporter:
    """Emits the registry through one emitter every interval, on a daemon thread."""

    def __init__(
        self,
        registry: MetricsRegistry,
        emitter: MetricEmitter,
        interval_secs: float = DEFAULT_METRIC_INTERVAL_SECONDS,
        *,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        if not _is_number(interval_secs) or not interval_secs > 0:
            raise ValueError(f"the metrics interval must be positive; got {interval_secs!r}")
        self._registry = registry
        self._emitter = emitter
        self._interval = float(interval_secs)
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Emits come from the loop and from emit_now(); one at a time keeps intervals whole.
        self._emit_lock = threading.Lock()

    def start(self) -> None:
        """Starts the emit loop; a second start, or a start after stop, is a no-op."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="unskit-metrics", daemon=True)
            self._thread.start()

    def emit_now(self) -> list[MetricSample]:
        """Collects (resetting interval values) and emits once; returns what was emitted."""
        with self._emit_lock:
            samples = self._registry.collect(reset_interval=True)
            self._emitter.emit(samples, self._clock_ms())
            return samples

    def stop(self, *, flush: bool = True, timeout: float = _STOP_JOIN_SECS) -> None:
        """Stops the loop, emits the partial interval when ``flush``, closes the emitter."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if flush:
            self._safe_emit()
        self._emitter.close()

    def set_interval(self, interval_secs: float) -> None:
        """A new cadence, from the next emit on."""
        if not _is_number(interval_secs) or not interval_secs > 0:
            raise ValueError(f"the metrics interval must be positive; got {interval_secs!r}")
        self._interval = float(interval_secs)

    @property
    def interval(self) -> float:
        """Seconds between emits."""
        return self._interval

    @property
    def running(self) -> bool:
        """Whether the emit loop thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _run(self) -> None:
        # Event.wait with a timeout sleeps in the kernel and wakes at once on stop().
        while not self._stop.wait(self._interval):
            self._safe_emit()

    def _safe_emit(self) -> None:
        try:
            self.emit_now()
        except Exception:
            # A failed emit loses that interval's values, never the totals or the loop.
            _log.exception("metric emission failed")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _name(value: object, what: str) -> str:
    validate_token(value, what)
    assert isinstance(value, str)
    return value


def _dimensions(dimensions: Mapping[str, str] | None, what: str) -> dict[str, str]:
    if dimensions is None:
        return {}
    out = {}
    for key, value in dimensions.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{what} names must be non-empty strings; got {key!r}")
        if not isinstance(value, str) or not value:
            raise ValueError(f"{what} {key!r} must have a non-empty string value; got {value!r}")
        out[key] = value
    return out


def _json_number(value: Number) -> Number | None:
    # JSON has no NaN or infinities; null says "no meaningful value" to every reader.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _rfc3339(timestamp_ms: int) -> str:
    instant = datetime.fromtimestamp(timestamp_ms / 1000, tz=timezone.utc)
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
