"""Push mode: a class-1 implicit-I/O originator.

The explicit side (TCP 44818 session, Forward Open and Close) is `unskit.cip.session`; the
I/O itself runs in the Rust core's `IoEngine`, one per component socket, on its own thread
off the GIL: it receives T-to-O, checks sequence and size, decodes through the compiled
input plan (scale, valueOffset, sampleMs, deadband, publishMode), produces O-to-T at the
negotiated API and runs the watchdog. Python gets only the changed samples, in batches,
from one routing thread per socket (`IoHub`), and hands them to each connection's sink.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

from unskit._core import cip as _cip
from unskit.cip.config import (
    CipConnection,
    PushSettings,
    assembly_signal_id,
    cip_connection,
    push_settings,
    run_signal_id,
)
from unskit.cip.frames import RealTimeFormat, build
from unskit.cip.plan import AssemblyField, InputPlan, OutputPlan
from unskit.cip.session import ImplicitSession, OpenedConnection, OpenRequest
from unskit.errors import CipError
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.supervision import Supervisor
from unskit.southbound.driver import (
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    PublishMode,
    Quality,
    Reading,
    ReadingSink,
    SignalSpec,
)

__all__ = ["CipPushDriver", "IoHub", "IoHubs"]

_log = logging.getLogger(__name__)

#: How long the routing thread waits in one `IoEngine.poll` (it returns early on data).
_POLL_S = 0.5
#: maintain() cadence: session liveness and the staleness refresh.
_MAINTAIN_S = 1.0

SampleHandler = Callable[[list[tuple[str, Any, int]]], None]


class IoHub:
    """One class-1 UDP socket: the Rust `IoEngine` and the thread that routes its batches."""

    def __init__(
        self,
        bind_address: str,
        port: int,
        multicast_interface: str,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.address = (bind_address, port)
        self.engine = _cip.IoEngine(
            bind_host=bind_address, port=port, multicast_interface=multicast_interface
        )
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self._routes: dict[int, tuple[SampleHandler, Callable[[], None]]] = {}
        self._stop = threading.Event()
        # Supervised: a failed poll or route is logged, counted and the routing restarted,
        # instead of every push instance on the socket going quiet unseen.
        self._thread = (supervisor or Supervisor()).thread(
            f"cip-io-route-{self.engine.port}", self._run, self._stop
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.engine.port)

    def new_key(self) -> int:
        return next(self._keys)

    def attach(self, key: int, on_samples: SampleHandler, on_timeout: Callable[[], None]) -> None:
        with self._lock:
            self._routes[key] = (on_samples, on_timeout)

    def detach(self, key: int) -> None:
        with self._lock:
            self._routes.pop(key, None)
        with contextlib.suppress(CipError):  # never opened (open failed) or already closed
            self.engine.close(key)

    def close(self) -> None:
        self._stop.set()
        self.engine.shutdown()  # wakes the routing thread's poll
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.engine.poll(_POLL_S)
            except Exception:
                if self._stop.is_set():  # the engine is gone (shutdown): nothing to route
                    return
                raise
            by_key: dict[int, list[tuple[str, Any, int]]] = defaultdict(list)
            for key, signal_id, value, ts_ms in zip(
                batch.keys, batch.ids, batch.values, batch.ts_ms, strict=True
            ):
                by_key[key].append((signal_id, value, ts_ms))
            with self._lock:
                routes = dict(self._routes)
            for key, samples in by_key.items():
                route = routes.get(key)
                if route is not None:
                    route[0](samples)
            for key in batch.timed_out:
                route = routes.get(key)
                if route is not None:
                    route[1]()


class IoHubs:
    """A component's hubs by (bind address, port), shared by its push instances. A hub
    outlives reconnects; an idle one is closed when another address is asked for (a reload
    that moved the socket) and every one when the component stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hubs: dict[tuple[str, int], tuple[IoHub, int]] = {}
        #: Restarts a hub's failed routing thread; the component sets its runtime's.
        self.supervisor = Supervisor()

    def acquire(self, bind_address: str, port: int, multicast_interface: str) -> IoHub:
        address = (bind_address, port)
        with self._lock:
            idle = [h for a, (h, users) in self._hubs.items() if users == 0 and a != address]
            for hub in idle:
                del self._hubs[hub.address]
            current, users = self._hubs.get(address, (None, 0))
            if current is None:
                try:
                    current = IoHub(bind_address, port, multicast_interface, self.supervisor)
                except OSError as error:
                    raise DeviceError(
                        f"class-1 UDP socket {bind_address}:{port}: {error}"
                    ) from error
            self._hubs[address] = (current, users + 1)
        for hub in idle:
            hub.close()
        return current

    def release(self, hub: IoHub) -> None:
        with self._lock:
            current, users = self._hubs.get(hub.address, (None, 0))
            if current is hub:
                self._hubs[hub.address] = (hub, max(0, users - 1))

    def close(self) -> None:
        with self._lock:
            hubs, self._hubs = [hub for hub, _ in self._hubs.values()], {}
        for hub in hubs:
            hub.close()


def _fields(block: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list((block or {}).get("signals") or [])


class CipPushDriver:
    """A `PushDriver` for one push instance: one class-1 connection to one target."""

    def __init__(
        self, spec: InstanceSpec, hubs: IoHubs, metrics: MetricsRegistry | None = None
    ) -> None:
        self.spec = spec
        self._metrics = metrics
        #: Engine totals already added to the metrics, per counter name.
        self._counted: dict[str, int] = {}
        self.settings: PushSettings = push_settings(spec)
        self.connection: CipConnection = cip_connection(spec)
        self._hubs = hubs
        io = self.settings.io
        self._assemblies: Mapping[str, int] = io["assemblies"]
        self._input_doc: Mapping[str, Any] = io["input"]
        self._output_doc: Mapping[str, Any] = io.get("output") or {}
        publish_mode: Literal["onChange", "always"] = (
            "always" if self.settings.publish_mode == "always" else "onChange"
        )
        self._input_fields = [
            AssemblyField.from_config(doc, publish_mode) for doc in _fields(self._input_doc)
        ]
        out = [AssemblyField.from_config(doc) for doc in _fields(self._output_doc)]
        # Writes arrive as raw values (the service unscales them with the signal's scale),
        # and sb/read decodes the O-to-T image raw with the same fields.
        raw = [AssemblyField(f.name, f.offset, f.type, f.bit, f.array_count) for f in out]
        output = self._assemblies["output"]
        self._output_plan = OutputPlan(
            output, self.output_size, raw, real_time_format=self.output_format
        )
        self._output_reader = InputPlan(output, self.output_size, raw) if raw else None
        self._run = bool(self._output_doc.get("run", True))
        self._image = bytes(self.output_size)
        self._inputs = self._input_specs()
        self._outputs = self._output_specs(out)
        self._session = ImplicitSession(
            self.connection.host, self.connection.port, spec.timing.request_timeout_ms / 1000
        )
        self._hub: IoHub | None = None
        self._key: int | None = None
        self._opened: OpenedConnection | None = None
        self._sink: ReadingSink | None = None
        self._held = False
        self._last_open_error = ""
        self._received_before = 0
        self._lock = threading.Lock()
        #: Set by the first samples of a connection, or by its watchdog (`_first_failed`).
        self._first = threading.Event()
        self._first_failed = False

    # -- configuration views -----------------------------------------------------------------

    @property
    def output_size(self) -> int:
        return int(self._output_doc.get("sizeBytes", 0))

    @property
    def output_format(self) -> RealTimeFormat:
        if self.output_size == 0:
            return "heartbeat"
        return cast(RealTimeFormat, self._output_doc.get("realTimeFormat", "header32"))

    @property
    def input_format(self) -> RealTimeFormat:
        return cast(RealTimeFormat, self._input_doc.get("realTimeFormat", "modeless"))

    def _input_specs(self) -> list[SignalSpec]:
        # The engine scales and gates; the runtime publishes what it hands over as is.
        instance = self._assemblies["input"]
        return [
            SignalSpec(
                id=assembly_signal_id(instance, doc),
                name=doc["name"],
                type=doc["type"].upper(),
                array_count=doc.get("arrayCount"),
                publish_mode=PublishMode.ALWAYS,
                batch_ms=self.settings.batch_ms,
                extra={"direction": "input", "offset": doc["offset"]},
            )
            for doc in _fields(self._input_doc)
        ]

    def _output_specs(self, fields: Sequence[AssemblyField]) -> dict[str, SignalSpec]:
        instance = self._assemblies["output"]
        specs = {
            assembly_signal_id(instance, doc): SignalSpec(
                id=assembly_signal_id(instance, doc),
                name=doc["name"],
                type=doc["type"].upper(),
                array_count=doc.get("arrayCount"),
                scale=doc.get("scale"),
                offset=doc.get("valueOffset"),
                extra={"direction": "output", "offset": doc["offset"], "field": field.name},
            )
            for doc, field in zip(_fields(self._output_doc), fields, strict=True)
        }
        if self.output_format == "header32":
            run = run_signal_id(instance)
            specs[run] = SignalSpec(id=run, name="run", type="BOOL", extra={"direction": "output"})
        return specs

    def _request(self, udp_port: int) -> OpenRequest:
        io = self.settings.io
        header = 4 if self.input_format == "header32" else 0
        out_header = 4 if self.output_format == "header32" else 0
        return OpenRequest(
            config=int(self._assemblies.get("config", 1)),
            output=int(self._assemblies["output"]),
            input=int(self._assemblies["input"]),
            o2t_rpi_us=int(io.get("o2tRpiMs", io["rpiMs"])) * 1000,
            t2o_rpi_us=int(io["rpiMs"]) * 1000,
            # Connection sizes count the 16-bit sequence count and any run/idle header.
            o2t_size=2 + out_header + self.output_size,
            t2o_size=2 + header + int(self._input_doc["sizeBytes"]),
            timeout_multiplier=int(io.get("timeoutMultiplier", 16)),
            priority=str(io.get("priority", "scheduled")),
            multicast=io.get("connectionType", "p2p") == "multicast",
            udp_port=udp_port,
        )

    # -- DeviceDriver / PushDriver -----------------------------------------------------------

    def connect(self, deadline_s: float) -> None:
        """Registers a session and opens the class-1 connection (Forward Open)."""
        if self._hub is None:
            settings = self.settings
            self._hub = self._hubs.acquire(
                settings.bind_address, settings.udp_port, settings.multicast_interface
            )
        self._session.connect(time.monotonic() + deadline_s)
        if not self._held:
            self._open()

    def _open(self) -> None:
        assert self._hub is not None
        request = self._request(self._hub.port)
        try:
            self._opened = self._session.forward_open(request, _connection_id())
        except DeviceError as error:
            self._count("forwardOpenFailures", 1)
            self._last_open_error = error.code or str(error)
            _log.warning("instance %s: %s", self.spec.id, error)
            raise
        self._last_open_error = ""

    def subscribe(self, sink: ReadingSink) -> None:
        """Starts the I/O: the engine consumes T-to-O and produces O-to-T from now on."""
        self._sink = sink
        if self._opened is not None:
            self._start_io()

    def _start_io(self) -> None:
        hub, opened = self._hub, self._opened
        assert hub is not None
        assert opened is not None
        key = hub.new_key()
        self._first.clear()
        self._first_failed = False
        hub.attach(key, self._on_samples, self._on_timeout)
        plan = InputPlan(
            self._assemblies["input"],
            int(self._input_doc["sizeBytes"]),
            self._input_fields,
            real_time_format=self.input_format,
            sample_ms=int(self._input_doc.get("sampleMs", 0)),
        )
        io = self.settings.io
        try:
            hub.engine.open(
                key,
                t2o_connection_id=opened.t2o_connection_id,
                o2t_connection_id=opened.o2t_connection_id,
                target_host=opened.o2t_host,
                target_port=opened.o2t_port,
                t2o_api_us=opened.t2o_api_us,
                o2t_api_us=opened.o2t_api_us,
                timeout_multiplier=int(io.get("timeoutMultiplier", 16)),
                input_plan=plan.core,
                output_format=self.output_format,
                output_image=self._image,
                run=self._run,
                multicast_group=opened.multicast_group,
            )
        except Exception as error:
            hub.detach(key)
            raise DeviceError(f"class-1 I/O could not start: {error}") from error
        with self._lock:
            self._key = key
        self._received_before = 0
        self._counted = {}
        # Connected means data flows: wait for the first T-to-O datagram (or the watchdog).
        budget = self.spec.timing.connect_ms / 1000 + self._watchdog_ms() / 1000
        if not self._first.wait(budget) or self._first_failed:
            self._stop_io()
            raise DeviceError(
                f"no T-to-O datagram within {self._watchdog_ms()} ms of the Forward Open",
                connection_lost=True,
            )

    def _stop_io(self) -> None:
        with self._lock:
            key, self._key = self._key, None
        if key is not None and self._hub is not None:
            self._count_io(self._hub, key)
            self._hub.detach(key)

    def _on_samples(self, samples: list[tuple[str, Any, int]]) -> None:
        self._first.set()
        sink = self._sink
        if sink is not None:
            sink.deliver(
                [
                    Reading(signal_id, value, Quality.GOOD, source_timestamp_ms=ts_ms)
                    for signal_id, value, ts_ms in samples
                ]
            )

    def _on_timeout(self) -> None:
        if not self._first.is_set():
            self._first_failed = True
            self._first.set()
            return
        self._count("watchdogTimeouts", 1)
        sink = self._sink
        if sink is not None:
            sink.lost(
                DeviceError(
                    f"class-1 watchdog expired: no T-to-O datagram for {self._watchdog_ms()} ms",
                    connection_lost=True,
                )
            )

    def _watchdog_ms(self) -> int:
        opened = self._opened
        multiplier = int(self.settings.io.get("timeoutMultiplier", 16))
        return 0 if opened is None else opened.t2o_api_us * multiplier // 1000

    def maintain(self) -> float | None:
        """Session liveness, and the input signals' staleness refreshed while datagrams
        arrive (the engine hands over changes only)."""
        if not self._session.alive():
            raise DeviceError("the target closed the EtherNet/IP session", connection_lost=True)
        key, hub, sink = self._key, self._hub, self._sink
        if key is not None and hub is not None and sink is not None:
            received = self._count_io(hub, key)
            if received > self._received_before:
                sink.alive([spec.id for spec in self._inputs])
            self._received_before = received
        return _MAINTAIN_S

    def _count_io(self, hub: IoHub, key: int) -> int:
        """Adds the engine's new datagram counts to the metrics; returns the good ones."""
        try:
            stats = hub.engine.stats(key)
        except CipError:
            return self._received_before
        dropped = sum(int(n) for reason, n in stats["drops"].items() if reason != "queue_full")
        totals = {
            "datagramsReceived": int(stats["datagrams_received"]) - dropped,
            "datagramsProduced": int(stats["datagrams_produced"]),
            "datagramsDropped": dropped,
        }
        for name, total in totals.items():
            self._count(name, total - self._counted.get(name, 0))
            self._counted[name] = total
        return totals["datagramsReceived"]

    def _count(self, name: str, amount: int) -> None:
        if self._metrics is not None and amount > 0:
            dimensions = {"instance": self.spec.id}
            self._metrics.counter("CipImplicitIo", name, dimensions).inc(amount)

    def hold(self, paused: bool) -> None:
        """Pause closes the class-1 connection (Forward Close); resume opens it again."""
        if paused == self._held:
            return
        self._held = paused
        if paused:
            self._close_connection()
            return
        try:
            self._open()
            self._start_io()
        except DeviceError as error:
            # Re-opened through the runtime's reconnect, with its backoff.
            raise DeviceError(str(error), connection_lost=True, code=error.code) from error

    def probe(self) -> None:
        if not self._session.alive():
            raise DeviceError("the target closed the EtherNet/IP session", connection_lost=True)

    def close(self) -> None:
        """Stops the I/O, sends Forward Close and ends the session (each best effort)."""
        self._close_connection()
        self._session.close()
        self._sink = None
        if self._hub is not None:
            self._hubs.release(self._hub)
            self._hub = None

    def _close_connection(self) -> None:
        self._stop_io()
        opened, self._opened = self._opened, None
        if opened is None or not self._session.connected:
            return
        try:
            refused = self._session.forward_close(
                self._request(self._hub.port if self._hub else 0), opened
            )
        except DeviceError as error:
            _log.info("instance %s: forward close not answered: %s", self.spec.id, error)
            return
        if refused:
            _log.info("instance %s: forward close refused: %s", self.spec.id, refused)

    def signals(self) -> Sequence[SignalSpec]:
        return self._inputs

    def signal_for(self, signal_id: str) -> SignalSpec:
        """An output field (or the run pseudo-field) for sb/write and sb/read."""
        spec = self._outputs.get(signal_id)
        if spec is None:
            raise ValueError(f"{signal_id!r} is not a field of this connection")
        return spec

    def read(self, group: PollGroupSpec) -> list[Reading]:
        """Inputs from the last received T-to-O image, outputs from the O-to-T image."""
        key, hub = self._key, self._hub
        last = None if key is None or hub is None else hub.engine.read(key)
        inputs = dict(last or [])
        outputs: dict[str, Any] = {}
        if self._output_reader is not None:
            self._output_reader.reset()
            datagram = build(0, 0, 0, "modeless", data=self._image)
            outputs = dict(self._output_reader.decode(datagram, 0).updates)
        readings = []
        for signal in group.signals:
            if signal.id == run_signal_id(self._assemblies["output"]):
                readings.append(Reading(signal.id, self._run))
            elif signal.id in outputs:
                readings.append(Reading(signal.id, outputs[signal.id]))
            elif signal.id in inputs:
                readings.append(Reading(signal.id, inputs[signal.id]))
            else:
                readings.append(
                    Reading(signal.id, None, Quality.BAD, detail="no T-to-O datagram received yet")
                )
        return readings

    def write(self, signal: SignalSpec, value: Any) -> None:
        """Updates the O-to-T image; the next datagram carries it."""
        self.write_many({signal.id: value})

    def write_many(self, values: Mapping[str, Any]) -> None:
        """Several fields (and the run bit) land in the same O-to-T datagram."""
        run_id = run_signal_id(self._assemblies["output"])
        fields = {k: v for k, v in values.items() if k != run_id}
        unknown = [k for k in values if k not in self._outputs]
        if unknown:
            raise ValueError(f"not output fields of this connection: {unknown}")
        with self._lock:
            image = self._output_plan.encode(fields, self._image) if fields else self._image
            run = bool(values[run_id]) if run_id in values else self._run
            key, hub = self._key, self._hub
            if key is not None and hub is not None:
                hub.engine.set_output(key, image, run)
            self._image, self._run = image, run

    def describe(self) -> Mapping[str, Any]:
        """sb/status: the connection's terms, counters and drops."""
        opened = self._opened
        status: dict[str, Any] = {
            "mode": "push",
            "connectionType": self.settings.io.get("connectionType", "p2p"),
            "udpPort": self._hub.port if self._hub else None,
            "lastForwardOpenError": self._last_open_error or None,
            "run": self._run,
        }
        if opened is not None:
            status.update(
                {
                    "o2tConnectionId": opened.o2t_connection_id,
                    "t2oConnectionId": opened.t2o_connection_id,
                    "o2tApiUs": opened.o2t_api_us,
                    "t2oApiUs": opened.t2o_api_us,
                    "largeForwardOpen": opened.large,
                    "multicastGroup": opened.multicast_group,
                }
            )
        key, hub = self._key, self._hub
        if key is not None and hub is not None:
            status["io"] = dict(hub.engine.stats(key))
        return status


def _connection_id() -> int:
    """The T-to-O connection id we propose (the consumer's choice for point-to-point)."""
    return int.from_bytes(os.urandom(4), "little") or 1
