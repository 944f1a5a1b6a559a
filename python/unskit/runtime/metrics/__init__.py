"""Component metrics: a thread-safe registry, the four emission targets and the emit loop.

A metric is named by a *family* (e.g. ``southbound_health``, ``OpcUaCommand``) and a *name*
inside it, and carries string *dimensions* (e.g. ``instance``); the registry's common
dimensions are added to every metric. A counter has an *interval* value, reset at every
emit, and a *total* that never resets; a gauge has a current value.

Modules: `registry` (the metrics and `collect`), `emitters` (log, cloudmon, messaging and
`create_emitter`), `scrape` (the Prometheus endpoint), `reporter` (the emit loop).

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

from unskit.config.model import (
    DEFAULT_CLOUDMON_NAMESPACE,
    DEFAULT_METRIC_INTERVAL_SECONDS,
    DEFAULT_SCRAPE_HOST,
    DEFAULT_SCRAPE_PATH,
    DEFAULT_SCRAPE_PORT,
    MetricEmissionConfig,
    MetricTarget,
)
from unskit.runtime.metrics.emitters import (
    CLOUDMON_MAX_METRICS_PER_LINE,
    METRICS_MESSAGE_NAME,
    METRICS_MESSAGE_VERSION,
    CloudmonEmitter,
    LogEmitter,
    MessagingEmitter,
    MetricEmitter,
    create_emitter,
)
from unskit.runtime.metrics.registry import (
    Counter,
    Gauge,
    MetricKind,
    MetricSample,
    MetricsRegistry,
)
from unskit.runtime.metrics.reporter import MetricsReporter
from unskit.runtime.metrics.scrape import PROMETHEUS_CONTENT_TYPE, ScrapeEmitter, render_prometheus

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
