"""The pushed emission targets (log, cloudmon, messaging) and `create_emitter`, which builds the
one the configuration selects (scrape included)."""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Protocol, TextIO

from unskit.config.model import DEFAULT_CLOUDMON_NAMESPACE, MetricEmissionConfig, MetricTarget
from unskit.envelope import EnvelopeStamp, MessageBuilder
from unskit.runtime.events import Publisher
from unskit.runtime.metrics.registry import MetricSample, MetricsRegistry, json_number
from unskit.runtime.metrics.scrape import ScrapeEmitter
from unskit.topics import TopicScope

__all__ = [
    "CLOUDMON_MAX_METRICS_PER_LINE",
    "METRICS_MESSAGE_NAME",
    "METRICS_MESSAGE_VERSION",
    "CloudmonEmitter",
    "LogEmitter",
    "MessagingEmitter",
    "MetricEmitter",
    "create_emitter",
]

METRICS_MESSAGE_NAME = "Metrics"
METRICS_MESSAGE_VERSION = "1.0"
# The embedded metric format accepts at most 100 metrics in one directive.
CLOUDMON_MAX_METRICS_PER_LINE = 100
_INSTANCE = "instance"

# One logger for the package, `unskit.runtime.metrics` as before it was split in modules.
_log = logging.getLogger(__package__)


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
                    document[sample.name] = json_number(sample.value)
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


def _rfc3339(timestamp_ms: int) -> str:
    instant = datetime.fromtimestamp(timestamp_ms / 1000, tz=timezone.utc)
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")
