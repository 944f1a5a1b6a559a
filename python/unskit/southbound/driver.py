"""What a protocol backend gives the southbound runtime: a `DeviceDriver` per instance that
connects, reads a poll group's signals, writes one signal, probes, and closes. The runtime
owns threads, timing, backoff, scaling, deadband, publication and the verbs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

# DeviceError is defined with the tree; part of the driver contract, so named here too.
from unskit.errors import ConfigIssue, DeviceError

__all__ = [
    "Deadband",
    "DeviceDriver",
    "DeviceError",
    "InstanceSpec",
    "PollGroupSpec",
    "PublishMode",
    "PushDriver",
    "Quality",
    "Reading",
    "ReadingSink",
    "SignalSpec",
    "Timing",
    "parse_timing",
]


class Quality(str, Enum):
    GOOD = "GOOD"
    UNCERTAIN = "UNCERTAIN"
    BAD = "BAD"


class PublishMode(str, Enum):
    ON_CHANGE = "onChange"
    ALWAYS = "always"


@dataclass(frozen=True)
class Deadband:
    """``none`` republishes on any change; ``absolute`` and ``percent`` need a change of at
    least `value` (percent: of the last published value's magnitude)."""

    type: str = "none"
    value: float = 0.0


@dataclass(frozen=True)
class SignalSpec:
    """One polled signal, with every inherited setting already resolved."""

    #: The stable signal id (a CIP tag path, an OPC UA node id); also the allow-list key.
    id: str
    #: The label and data-topic channel (sanitised to one topic token by the runtime).
    name: str
    #: The protocol's elementary type name (``DINT``, ``REAL``, ``BOOL`` ...).
    type: str
    array_count: int | None = None
    scale: float | None = None
    offset: float | None = None
    deadband: Deadband = field(default_factory=Deadband)
    publish_mode: PublishMode = PublishMode.ON_CHANGE
    batch_ms: int = 0
    #: Protocol-specific extras the driver needs (kept opaque to the runtime).
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def numeric(self) -> bool:
        """Whether scaling and deadband apply (not BOOL, not strings)."""
        return self.type.upper() not in ("BOOL", "STRING")


@dataclass(frozen=True)
class PollGroupSpec:
    id: str
    interval_ms: int
    signals: Sequence[SignalSpec]


@dataclass(frozen=True)
class Reading:
    """One signal's raw value from one read; `value` is None when quality is BAD and
    nothing usable came back. Arrays are lists."""

    signal_id: str
    value: Any
    quality: Quality = Quality.GOOD
    source_timestamp_ms: int = 0
    #: Why the quality is not GOOD (a CIP status, "count mismatch: 8 of 10", an OPC UA
    #: StatusCode's symbolic name); published as the sample's status.
    detail: str = ""
    #: The device's own receive time (an OPC UA ServerTimestamp); 0: the adapter stamps it.
    server_timestamp_ms: int = 0


class DeviceDriver(Protocol):
    """One device endpoint. Every call may block up to its deadline; the runtime calls them
    from the instance's own thread only, never concurrently."""

    def connect(self, deadline_s: float) -> None:
        """Opens the session; raises DeviceError when it cannot within the deadline."""
        ...

    def read(self, group: PollGroupSpec) -> list[Reading]:
        """Reads every signal of the group (multi-tag requests where the protocol has them);
        a per-signal failure is a BAD reading, a lost connection raises DeviceError."""
        ...

    def write(self, signal: SignalSpec, value: Any) -> None:
        """Writes one (raw, unscaled) value; raises DeviceError or ValueError."""
        ...

    def probe(self) -> None:
        """A cheap real round trip that proves the connection (keepalive while paused)."""
        ...

    def close(self) -> None:
        """Closes the session; never raises."""
        ...

    def describe(self) -> Mapping[str, Any]:
        """JSON-ready facts for sb/status (adapter, endpoint, session details)."""
        ...


class ReadingSink(Protocol):
    """Where a push driver hands what the device sends; every method is thread-safe and
    returns at once (the runtime does the work on the instance thread)."""

    def deliver(self, readings: Sequence[Reading]) -> None:
        """Queues readings (bounded: an overflow is dropped, counted and logged)."""
        ...

    def signals_changed(self) -> None:
        """The driver's signal set changed (a browse found nodes, an item failed or
        recovered): the runtime re-reads `signals()`."""
        ...

    def lost(self, error: DeviceError) -> None:
        """The driver noticed, on its own thread, that the connection is gone."""
        ...

    def wake(self) -> None:
        """Asks for `maintain()` soon (a model change, a retry that is due)."""
        ...

    def alive(self, signal_ids: Sequence[str]) -> None:
        """These signals were read good just now without a change worth delivering (a
        source that sends changes only): they are not stale."""
        ...


@runtime_checkable
class PushDriver(DeviceDriver, Protocol):
    """A device that sends data itself (OPC UA subscriptions, CIP class-1 I/O). The runtime
    connects it, calls `subscribe` once per connection and then only drains the sink; `read`
    is the verbs' one-off read. Instances, reload, verbs, batching, staleness, alarms and
    metrics stay the runtime's, exactly as for polled devices."""

    def subscribe(self, sink: ReadingSink) -> None:
        """After each successful connect: sets up what makes the device send (browse,
        subscriptions, a forward open) and delivers to `sink` from then on; raises
        DeviceError when that fails."""
        ...

    def signals(self) -> Sequence[SignalSpec]:
        """The signals delivered now (configured, or found by browsing)."""
        ...

    def signal_for(self, signal_id: str) -> SignalSpec:
        """A signal for sb/read or sb/write of an id that is not subscribed; raises
        ValueError when the id is malformed or the device cannot address it."""
        ...

    def maintain(self) -> float | None:
        """Called on the instance thread after `subscribe` and whenever woken: retries what
        failed, re-browses after a model change. Returns the seconds until it wants to be
        called again (None: only when woken); raises DeviceError when the connection is gone."""
        ...

    def hold(self, paused: bool) -> None:
        """sb/pause (True) and sb/resume (False) on the instance thread: a source may stop
        sending while paused (CIP closes its connection) or keep it (OPC UA); what arrives
        while paused is dropped by the runtime either way."""
        ...


@runtime_checkable
class AtomicWriter(Protocol):
    """A device whose several writes can land together (CIP class-1: one O-to-T image)."""

    def write_many(self, values: Mapping[str, Any]) -> None:
        """Raw values by signal id, applied all at once or not at all."""
        ...


@dataclass(frozen=True)
class Timing:
    """Connection timing, thresholds and the metrics cadence of one instance."""

    connect_ms: int = 5000
    request_timeout_ms: int = 2000
    reconnect_backoff_min_ms: int = 1000
    reconnect_backoff_max_ms: int = 60000
    stale_signal_secs: int = 60
    keepalive_probe_interval_ms: int = 60000
    #: component.global.metrics.metricsIntervalSecs; None when not given, and then the
    #: framework's metricEmission.intervalSeconds is the cadence.
    metrics_interval_secs: int | None = None


def parse_timing(
    global_section: Mapping[str, Any], *, thresholds_key: str, stale_signal_secs: int
) -> Timing:
    """An adapter's component.global timing (timing, thresholds under `thresholds_key`,
    metrics), defaults filled in; the backoff ceiling is never below its floor."""
    timing = global_section.get("timing") or {}
    thresholds = global_section.get(thresholds_key) or {}
    metrics = global_section.get("metrics") or {}
    defaults = Timing()
    backoff_min = timing.get("reconnectBackoffMinMs", defaults.reconnect_backoff_min_ms)
    return Timing(
        connect_ms=timing.get("connectMs", defaults.connect_ms),
        request_timeout_ms=timing.get("requestTimeoutMs", defaults.request_timeout_ms),
        reconnect_backoff_min_ms=backoff_min,
        reconnect_backoff_max_ms=max(
            timing.get("reconnectBackoffMaxMs", defaults.reconnect_backoff_max_ms), backoff_min
        ),
        stale_signal_secs=thresholds.get("staleSignalSecs", stale_signal_secs),
        keepalive_probe_interval_ms=timing.get(
            "keepaliveProbeIntervalMs", defaults.keepalive_probe_interval_ms
        ),
        metrics_interval_secs=metrics.get("metricsIntervalSecs"),
    )


@dataclass(frozen=True)
class InstanceSpec:
    """One device instance, parsed and resolved (precedence applied) from its entry."""

    id: str
    #: The backend name (``ethernet-ip``, ``sim``, ``opcua``); one the build lacks is skipped.
    adapter: str
    #: Published as device.endpoint (host:port, an opc.tcp URL).
    endpoint: str
    poll_groups: Sequence[PollGroupSpec]
    #: Stable signal ids sb/write may write; empty means read-only.
    writes_allow: frozenset[str] = frozenset()
    timing: Timing = field(default_factory=Timing)
    #: The raw entry (JSON-shaped), compared structurally on reload and read by the driver.
    entry: Mapping[str, Any] = field(default_factory=dict)
    #: Everything outside component.instances[] the instance depends on (component.global,
    #: component.token): a change there restarts every instance.
    shared: Mapping[str, Any] = field(default_factory=dict)
    #: Set when the entry asks for what this build cannot do (tls before the TLS transport):
    #: the instance is then failed and its driver is never asked to connect.
    unavailable: ConfigIssue | None = None
    #: The protocol's own parsed settings (`OpcUaSettings`, ...), opaque to the runtime.
    settings: object | None = None

    def signals(self) -> list[SignalSpec]:
        """Every signal of every poll group, in declaration order."""
        return [signal for group in self.poll_groups for signal in group.signals]
