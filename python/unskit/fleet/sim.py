"""K simulated gateways x M signals through the real library, measured at one subscriber.

Each gateway is what a protocol adapter is: a `MessagingClient` and a southbound
`InstanceRunner` polling a driver on schedule, with the change gate, the
`SouthboundSignalUpdate` envelope and the instance data topics of every adapter. Only the
device is simulated: each poll reads every signal as the gateway's poll count, so every
sample changes (it passes the gate) and names itself (gateway, signal, sequence). The
subscriber counts each sample once, so loss and duplicates are exact, and takes latency from
the gateway's read to the subscriber's callback (same process, one monotonic clock).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from unskit.config.model import BrokerConfig, MessagingConfig, QosConfig
from unskit.envelope import Identity, Message, MessageBuilder
from unskit.errors import MessagingError
from unskit.messaging import MessagingClient
from unskit.southbound.driver import InstanceSpec, PollGroupSpec, Reading, SignalSpec
from unskit.southbound.instance import InstanceContext, InstanceRunner
from unskit.topics import TopicScope

__all__ = ["FleetOptions", "FleetReport", "LatencyHistogram", "run_fleet"]

_log = logging.getLogger(__name__)

COMPONENT = "fleet-sim"
INSTANCE = "sim"
SIGNAL_UPDATE_CASE = "southbound_signal_update"
MAX_GATEWAYS = 1000
MAX_SIGNALS = 10_000
#: A poll interval is whole milliseconds, so at most 1000 changes/s per signal.
MAX_RATE = 1000.0
MAX_DURATION_S = 24 * 3600.0
#: Send times kept per gateway: a sample later than this many polls has no latency.
CLOCK_SLOTS = 4096
#: No new delivery for this long after the gateways stop: what is missing is lost.
QUIET_S = 3.0


def _endpoint_text(endpoint: tuple[str, int]) -> str:
    host, port = endpoint
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class FleetOptions:
    """One run: brokers (an endpoint list, tried in order), K gateways, M signals each,
    `rate` changes per second per signal, for `duration` seconds, at `qos`."""

    brokers: tuple[tuple[str, int], ...]
    gateways: int = 4
    signals: int = 10
    rate: float = 1.0
    duration: float = 10.0
    qos: int = 1
    connect_timeout: float = 10.0
    #: The longest wait for stragglers after the gateways stop.
    drain_timeout: float = 30.0
    #: The subscriber's bounded queue: an overflow is dropped, counted, and is loss.
    queue: int = 10_000

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every bad option, each naming its command-line option."""
        out: list[str] = []
        if not self.brokers:
            out.append("--broker: at least one HOST:PORT is needed")
        if len(set(self.brokers)) != len(self.brokers):
            out.append("--broker: an endpoint is listed twice")
        for host, port in self.brokers:
            if not host or not 1 <= port <= 65535:
                out.append(f"--broker: {host}:{port} is not HOST:PORT with a port 1..65535")
        limits: Sequence[tuple[str, float, float, float]] = (
            ("--gateways", self.gateways, 1, MAX_GATEWAYS),
            ("--signals", self.signals, 1, MAX_SIGNALS),
            ("--queue", self.queue, 1, 10_000_000),
        )
        for name, value, low, high in limits:
            if not low <= value <= high:
                out.append(f"{name} must be {low:g}..{high:g}, not {value:g}")
        for name, value, high in (
            ("--rate", self.rate, MAX_RATE),
            ("--duration", self.duration, MAX_DURATION_S),
            ("--connect-timeout", self.connect_timeout, 3600.0),
            ("--drain-timeout", self.drain_timeout, 3600.0),
        ):
            if not (math.isfinite(value) and 0 < value <= high):
                out.append(f"{name} must be > 0 and <= {high:g}, not {value:g}")
        if self.qos not in (0, 1, 2):
            out.append(f"--qos must be 0, 1 or 2, not {self.qos}")
        return out

    @property
    def interval_ms(self) -> int:
        """The gateways' poll interval: one change of every signal per poll."""
        return max(1, round(1000.0 / self.rate))


@dataclass(frozen=True)
class FleetReport:
    """What one run measured; counts are samples (one per message while the subscriber
    keeps up: a gateway publishes each signal's change as its own update)."""

    brokers: list[str]
    gateways: int
    signals: int
    rate: float
    qos: int
    #: The gateways' publishing window, seconds.
    duration_s: float
    #: Samples the simulated devices produced (every one passes the change gate).
    produced: int
    #: Samples handed to the messaging client without an error.
    published: int
    publish_errors: int
    #: Distinct samples the subscriber received.
    delivered: int
    #: Envelopes the subscriber received (duplicates included).
    messages: int
    duplicates: int
    lost: int
    #: Dropped by the subscriber's full queue (part of `lost`).
    overflowed: int
    offered_msgs_per_s: float
    delivered_msgs_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    latency_max_ms: float | None
    #: Delivered samples whose send time was no longer known (later than CLOCK_SLOTS polls).
    latency_unknown: int
    #: CPU seconds this process (gateways and subscriber, every thread) used while publishing.
    cpu_s: float = 0.0
    stopped_early: bool = False
    #: The run's topic root: its data is under {root}/+/fleet-sim/sim/data/+.
    root: str = ""

    @property
    def loss_ratio(self) -> float:
        return self.lost / self.produced if self.produced else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        data = asdict(self)
        data["loss_ratio"] = round(self.loss_ratio, 6)
        return data


class LatencyHistogram:
    """Latencies in log buckets 1% wide from 1 us: bounded memory, quantiles within 1%."""

    FLOOR_S = 1e-6
    GROWTH = 1.01
    BUCKETS = 2400  # up to about 23,000 s

    def __init__(self) -> None:
        self._counts = [0] * self.BUCKETS
        self._log_growth = math.log(self.GROWTH)
        self.count = 0
        self.max_s = 0.0

    def add(self, seconds: float) -> None:
        """Records one latency."""
        if seconds <= self.FLOOR_S:
            index = 0
        else:
            index = int(math.log(seconds / self.FLOOR_S) / self._log_growth) + 1
        self._counts[min(index, self.BUCKETS - 1)] += 1
        self.count += 1
        self.max_s = max(self.max_s, seconds)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1) in seconds: its bucket's upper bound, at most the
        maximum seen; None when empty."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index, hits in enumerate(self._counts):
            seen += hits
            if seen >= rank:
                return min(self.FLOOR_S * self.GROWTH**index, self.max_s)
        return self.max_s


class _SendClock:
    """When each gateway read its poll `seq`: a ring of CLOCK_SLOTS per gateway."""

    def __init__(self, gateways: int) -> None:
        self._times = [array("d", bytes(8 * CLOCK_SLOTS)) for _ in range(gateways)]
        self._seqs = [array("q", bytes(8 * CLOCK_SLOTS)) for _ in range(gateways)]

    def stamp(self, gateway: int, seq: int, at: float) -> None:
        slot = seq % CLOCK_SLOTS
        self._times[gateway][slot] = at
        self._seqs[gateway][slot] = seq

    def sent(self, gateway: int, seq: int) -> float | None:
        slot = seq % CLOCK_SLOTS
        at = self._times[gateway][slot]
        return at if self._seqs[gateway][slot] == seq else None


class FleetDriver:
    """A device whose every signal reads as the poll count: each poll changes them all."""

    def __init__(self, gateway: int, clock: _SendClock) -> None:
        self._gateway = gateway
        self._clock = clock
        self.polls = 0
        self.samples = 0

    def connect(self, deadline_s: float) -> None:
        return None

    def read(self, group: PollGroupSpec) -> list[Reading]:
        self.polls += 1
        self._clock.stamp(self._gateway, self.polls, time.perf_counter())
        now_ms = int(time.time() * 1000)
        self.samples += len(group.signals)
        return [Reading(s.id, self.polls, source_timestamp_ms=now_ms) for s in group.signals]

    def write(self, signal: SignalSpec, value: Any) -> None:
        raise ValueError("the fleet simulator's signals are read-only")

    def probe(self) -> None:
        return None

    def close(self) -> None:
        return None

    def describe(self) -> Mapping[str, Any]:
        return {"adapter": COMPONENT}


class _Count:
    """A counter or gauge of the instance context, summed over the fleet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        with self._lock:
            self.value += amount

    def set(self, value: float) -> None:
        self.value = value


class _Tally:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, _Count] = {}

    def counter(self, _instance: str, name: str, _group: str | None = None) -> _Count:
        with self._lock:
            return self._counts.setdefault(name, _Count())

    def gauge(self, _instance: str, name: str) -> _Count:
        # Gauges are per gateway and of no interest here: each call gets its own.
        return _Count()

    def total(self, name: str) -> int:
        with self._lock:
            count = self._counts.get(name)
        return int(count.value) if count is not None else 0


@dataclass(frozen=True)
class _Stamp:
    identity: Identity
    tags: Mapping[str, str] = field(default_factory=dict)


class _Subscriber:
    """Counts each (gateway, signal, seq) once and times it against the send clock."""

    def __init__(
        self, devices: Mapping[str, int], signal_ids: Mapping[str, int], clock: _SendClock
    ) -> None:
        self._devices = devices
        self._signal_ids = signal_ids
        self._clock = clock
        self._seen = [[bytearray() for _ in signal_ids] for _ in devices]
        self.cond = threading.Condition()
        self.probed: set[str] = set()
        self.delivered = 0
        self.messages = 0
        self.duplicates = 0
        self.foreign = 0
        self.overflowed = 0
        self.latency_unknown = 0
        self.last_at: float | None = None
        self.latency = LatencyHistogram()

    def on_message(self, _topic: str, message: Message) -> None:
        now = time.perf_counter()
        identity = message.identity
        gateway = None if identity is None else self._devices.get(identity.device)
        if message.body_case != SIGNAL_UPDATE_CASE:
            if gateway is not None and identity is not None:
                with self.cond:
                    self.probed.add(identity.device)
                    self.cond.notify_all()
            return
        body = message.body
        signal = self._signal_ids.get(body["signal"]["id"])
        with self.cond:
            if gateway is None or signal is None:
                self.foreign += 1
                return
            self.messages += 1
            seen = self._seen[gateway][signal]
            for sample in body["samples"]:
                seq = sample.get("value")
                if not isinstance(seq, int) or not 0 < seq < 2**31:
                    self.foreign += 1
                    continue
                if len(seen) <= seq:
                    seen.extend(bytes(max(seq + 1 - len(seen), 1024)))
                if seen[seq]:
                    self.duplicates += 1
                    continue
                seen[seq] = 1
                self.delivered += 1
                sent = self._clock.sent(gateway, seq)
                if sent is None:
                    self.latency_unknown += 1
                else:
                    self.latency.add(now - sent)
            self.last_at = now
            self.cond.notify_all()

    def on_overflow(self, _topic: str, _message: Message) -> None:
        with self.cond:
            self.overflowed += 1

    def wait_probed(self, devices: Sequence[str], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.probed.issuperset(devices), timeout)

    def wait_drained(self, expected: int, quiet_s: float, timeout: float) -> None:
        """Until `expected` samples arrived, nothing arrived for `quiet_s`, or `timeout`."""
        deadline = time.monotonic() + timeout
        with self.cond:
            last, progress_at = self.delivered, time.monotonic()
            while self.delivered < expected:
                now = time.monotonic()
                if self.delivered != last:
                    last, progress_at = self.delivered, now
                wake = min(deadline, progress_at + quiet_s)
                if now >= wake:
                    return
                self.cond.wait(wake - now)


def _client(
    options: FleetOptions, client_id: str, rotate: int, *, persistent: bool = False
) -> MessagingClient:
    """A client on the endpoint list rotated by `rotate`, so a fleet spreads over a cluster
    as it would behind a balancer; the rest of the list is its failover."""
    brokers = (
        options.brokers[rotate % len(options.brokers) :]
        + options.brokers[: rotate % len(options.brokers)]
    )
    (host, port), failover = brokers[0], brokers[1:]
    config = BrokerConfig(
        host=host,
        port=port,
        client_id=client_id,
        qos=QosConfig(publish=options.qos, subscribe=options.qos),
        failover=tuple(failover),
    )
    return MessagingClient(MessagingConfig(local=config), persistent_session=persistent)


def _signal_specs(count: int) -> list[SignalSpec]:
    width = len(str(count))
    return [SignalSpec(f"s{i:0{width}d}", f"s{i:0{width}d}", "DINT") for i in range(count)]


def run_fleet(options: FleetOptions, stop: threading.Event | None = None) -> FleetReport:
    """Runs the fleet for `options.duration` (or until `stop` is set) and reports; raises
    MessagingError when a client cannot connect within the connect timeout."""
    stop = stop or threading.Event()
    run = uuid.uuid4().hex[:8]
    root = f"fleet-sim-{run}"
    width = len(str(options.gateways))
    devices = [f"gw-{i:0{width}d}" for i in range(options.gateways)]
    signals = _signal_specs(options.signals)
    clock = _SendClock(options.gateways)
    subscriber = _Subscriber(
        {d: i for i, d in enumerate(devices)}, {s.id: i for i, s in enumerate(signals)}, clock
    )
    tally = _Tally()
    group = PollGroupSpec("changes", options.interval_ms, signals)
    spec = InstanceSpec(INSTANCE, COMPONENT, "simulated", [group])
    clients: list[MessagingClient] = []
    drivers: list[FleetDriver] = []
    runners: list[InstanceRunner] = []
    started = ended = time.perf_counter()
    cpu_s = 0.0
    try:
        sink = _client(options, f"{root}-subscriber", 0).start()
        clients.append(sink)
        _wait_connected(sink, options)
        sink.subscribe(
            f"{root}/+/{COMPONENT}/{INSTANCE}/data/+",
            subscriber.on_message,
            max_concurrency=1,
            max_messages=options.queue,
            on_overflow=subscriber.on_overflow,
        )
        for index, device in enumerate(devices):
            client = _client(options, f"{root}-{device}", index).start()
            clients.append(client)
            stamp = _Stamp(Identity("site/device", f"fleet/{device}", COMPONENT))
            context = InstanceContext(
                messaging=client,
                topics=TopicScope(root, device, COMPONENT),
                stamp=stamp,
                raise_alarm=lambda *_: None,
                clear_alarm=lambda *_: None,
                counter=tally.counter,
                gauge=tally.gauge,
            )
            driver = FleetDriver(index, clock)
            drivers.append(driver)
            runners.append(InstanceRunner(spec, driver, context))
        for client in clients[1:]:
            _wait_connected(client, options)
        _probe(clients[1:], devices, root, subscriber, options)
        started, cpu_started = time.perf_counter(), time.process_time()
        for runner in runners:
            runner.start()
        stop.wait(options.duration)
        stopped_early = stop.is_set()
        for runner in runners:
            runner.stop()
        ended, cpu_s = time.perf_counter(), time.process_time() - cpu_started
        runners.clear()
        produced = sum(d.samples for d in drivers)
        published = tally.total("samplesPublished")
        subscriber.wait_drained(published, QUIET_S, options.drain_timeout)
    finally:
        for runner in runners:
            runner.stop()
        for client in clients:
            client.close(2)
    return _report(
        options,
        root,
        subscriber,
        (produced, published),
        tally,
        (started, ended, cpu_s),
        stopped_early,
    )


def _wait_connected(client: MessagingClient, options: FleetOptions) -> None:
    if not client.wait_connected(options.connect_timeout):
        brokers = ", ".join(_endpoint_text(b) for b in options.brokers)
        raise MessagingError(f"cannot connect to {brokers} within {options.connect_timeout:g} s")


def _probe(
    clients: Sequence[MessagingClient],
    devices: Sequence[str],
    root: str,
    subscriber: _Subscriber,
    options: FleetOptions,
) -> None:
    """Each gateway publishes a probe until the subscriber has one from every gateway: the
    subscription is live on every node the fleet uses (on a cluster it takes a while)."""
    deadline = time.monotonic() + max(options.connect_timeout, 30.0)
    while True:
        for client, device in zip(clients, devices, strict=True):
            if device not in subscriber.probed:
                topic = TopicScope(root, device, COMPONENT).topic(
                    "data", "_probe", instance=INSTANCE
                )
                stamp = Identity("site/device", f"fleet/{device}", COMPONENT)
                probe = MessageBuilder("FleetProbe", "1.0").identity(stamp).body({}).build()
                client.publish(topic, probe)
        if subscriber.wait_probed(devices, 0.25):
            return
        if time.monotonic() >= deadline:
            missing = sorted(set(devices) - subscriber.probed)
            raise MessagingError(
                f"the subscriber received no probe from {', '.join(missing[:5])} within "
                f"{max(options.connect_timeout, 30.0):g} s"
            )


def _report(
    options: FleetOptions,
    root: str,
    subscriber: _Subscriber,
    counts: tuple[int, int],
    tally: _Tally,
    times: tuple[float, float, float],
    stopped_early: bool,
) -> FleetReport:
    produced, published = counts
    started, ended, cpu_s = times
    with subscriber.cond:
        delivered, last_at = subscriber.delivered, subscriber.last_at
        latency = subscriber.latency
        window = ended - started
        receiving = (last_at - started) if last_at is not None else 0.0

        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds * 1e3, 3)

        return FleetReport(
            brokers=[_endpoint_text(b) for b in options.brokers],
            gateways=options.gateways,
            signals=options.signals,
            rate=options.rate,
            qos=options.qos,
            duration_s=round(window, 3),
            produced=produced,
            published=published,
            publish_errors=tally.total("publishErrors"),
            delivered=delivered,
            messages=subscriber.messages,
            duplicates=subscriber.duplicates,
            lost=max(0, produced - delivered),
            overflowed=subscriber.overflowed,
            offered_msgs_per_s=round(produced / window, 1) if window > 0 else 0.0,
            delivered_msgs_per_s=round(delivered / receiving, 1) if receiving > 0 else 0.0,
            latency_p50_ms=ms(latency.quantile(0.5)),
            latency_p99_ms=ms(latency.quantile(0.99)),
            latency_max_ms=ms(latency.max_s if latency.count else None),
            latency_unknown=subscriber.latency_unknown,
            cpu_s=round(cpu_s, 2),
            stopped_early=stopped_early,
            root=root,
        )
