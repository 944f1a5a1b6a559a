"""The metrics registry: counters and gauges keyed by family, name and dimensions, read at one
instant by `collect`."""

from __future__ import annotations

import enum
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from unskit.topics import validate_token

__all__ = [
    "Counter",
    "Gauge",
    "MetricKind",
    "MetricSample",
    "MetricsRegistry",
    "Number",
    "is_number",
    "json_number",
]


class MetricKind(str, enum.Enum):
    """Counter (interval and total) or gauge (current value)."""

    COUNTER = "counter"
    GAUGE = "gauge"


Number = int | float
_Key = tuple[str, str, tuple[tuple[str, str], ...]]

_log = logging.getLogger(__package__)


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
            "value": json_number(self.value),
        }
        if self.total is not None:
            out["total"] = json_number(self.total)
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
        if not is_number(amount) or amount < 0 or math.isnan(amount):
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
        if not is_number(value):
            raise TypeError(f"a gauge value must be a number, not {type(value).__name__}")
        with self._lock:
            self._value = value

    def inc(self, amount: Number = 1) -> None:
        """Moves the value up (or down for a negative amount)."""
        if not is_number(amount):
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
        # Gauges read at collect (unit, reader): a queue's depth is asked, not tracked.
        self._observed: dict[_Key, tuple[str, Callable[[], Number]]] = {}
        # Each metric by the coordinates as its callers spell them, so a hot path's lookup
        # (a counter per command reply or per read) skips the validation and sorting of
        # `_key`; emptied by `remove`.
        self._looked_up: dict[tuple[Any, ...], Counter | Gauge] = {}

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

    def observe(
        self,
        family: str,
        name: str,
        read: Callable[[], Number],
        dimensions: Mapping[str, str] | None = None,
        *,
        unit: str = "Count",
    ) -> None:
        """A gauge whose value is `read()` at each collect; observing the same coordinates
        again replaces the reader."""
        key = self._key(family, name, dimensions)
        with self._lock:
            if key in self._metrics:
                raise ValueError(f"metric {family}/{name} already exists with another kind")
            self._observed[key] = (unit, read)

    def remove(self, dimensions: Mapping[str, str]) -> int:
        """Forgets the metrics whose dimensions include all of these; returns how many."""
        wanted = set(_dimensions(dimensions, "dimension").items())
        with self._lock:
            self._looked_up.clear()
            gone = [key for key in self._metrics if wanted <= set(key[2])]
            for key in gone:
                del self._metrics[key]
            observed = [key for key in self._observed if wanted <= set(key[2])]
            for key in observed:
                del self._observed[key]
        return len(gone) + len(observed)

    def collect(self, *, reset_interval: bool) -> list[MetricSample]:
        """Reads every metric at one instant; ``reset_interval`` starts a new interval."""
        samples = self._read_observed()
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

    def _read_observed(self) -> list[MetricSample]:
        # Outside the lock: a reader takes its own locks (a queue's), never this one.
        with self._lock:
            observed = list(self._observed.items())
        samples = []
        for (family, name, dims), (unit, read) in observed:
            try:
                value = read()
            except Exception:  # a broken reader must not stop the other metrics
                _log.exception("metric %s/%s: reading it failed", family, name)
                continue
            samples.append(
                MetricSample(family, name, MetricKind.GAUGE, unit, dict(dims), value, None)
            )
        return samples

    def _key(self, family: str, name: str, dimensions: Mapping[str, str] | None) -> _Key:
        _name(family, "metric family")
        _name(name, "metric name")
        dims = {**self._common, **_dimensions(dimensions, "dimension")}
        return (family, name, tuple(sorted(dims.items())))

    def _get(
        self,
        family: str,
        name: str,
        dimensions: Mapping[str, str] | None,
        kind: MetricKind,
        unit: str,
    ) -> Counter | Gauge:
        try:
            dims = None if dimensions is None else tuple(dimensions.items())
            spelled = (family, name, kind, dims)
            metric = self._looked_up.get(spelled)
        except TypeError:  # an unhashable dimension: `_key` names the fault
            spelled, metric = None, None
        if metric is not None:
            return metric
        key = self._key(family, name, dimensions)
        with self._lock:
            if key in self._observed:
                raise ValueError(f"metric {family}/{name} already exists with another kind")
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
            if spelled is not None:
                self._looked_up[spelled] = metric
            return metric


def is_number(value: object) -> bool:
    """Whether the value is an int or a float (a bool is not a number here)."""
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


def json_number(value: Number) -> Number | None:
    """The value as JSON can carry it: None for NaN and the infinities."""
    # JSON has no NaN or infinities; null says "no meaningful value" to every reader.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
