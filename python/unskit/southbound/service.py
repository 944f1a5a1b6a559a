"""The instances of one southbound component: the reload transaction and the sb verbs
(status, signals, read, write, pause, resume) on the command inbox."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from unskit.commands import (
    BodySpec,
    CommandContext,
    CommandInbox,
    ErrorCode,
    ListOf,
    Page,
    Param,
    ReloadOutcome,
    RequestIdRule,
    Scope,
    Text,
    Verb,
    bad_args,
)
from unskit.commands.fields import FreeJson, JsonObject
from unskit.elementary_types import FLOAT_TYPES, INTEGER_RANGES, TYPES
from unskit.errors import CommandError, ConfigError, ConfigIssue, UnskitError
from unskit.runtime.component import Runtime
from unskit.runtime.metrics import Counter
from unskit.southbound.driver import (
    AtomicWriter,
    DeviceDriver,
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    PushDriver,
    Reading,
    SignalSpec,
)
from unskit.southbound.instance import InstanceContext, InstanceRunner, InstanceState
from unskit.southbound.signals import not_encodable, scale_value

__all__ = [
    "HEALTH_FAMILY",
    "WRITES_ANY",
    "WRITE_REJECTED",
    "DriverFactory",
    "Skipped",
    "SouthboundService",
]

_log = logging.getLogger(__name__)

#: Builds an instance's driver (without connecting); raising means "cannot be started".
DriverFactory = Callable[[InstanceSpec], DeviceDriver]
#: Generous: a read waits for the poll in progress, then its own request.
_DEVICE_WAIT_MARGIN_S = 5.0
#: The metric family of every southbound adapter (spec 3), dimension instance (and
#: pollGroup for reads and readErrors).
HEALTH_FAMILY = "southbound_health"
#: The warning event of a write refused by the allow-list (spec 3, Events).
WRITE_REJECTED = "write-rejected"
#: The writes.allow entry that allows every signal.
WRITES_ANY = "*"


@dataclass(frozen=True)
class Skipped:
    id: str
    reason: str
    #: The broken rules with their JSON paths, when the entry is malformed.
    issues: tuple[ConfigIssue, ...] = ()


@dataclass
class _Running:
    spec: InstanceSpec
    runner: InstanceRunner
    fingerprint: str = field(default="")


#: A write value: a JSON scalar or a flat array; checked against the signal's type later.
_WRITE_VALUE = FreeJson(max_depth=1, types=("number", "boolean", "string", "array"))
#: sb/write `values`: {signal id: value}, each value as `value` takes it.
_WRITE_VALUES = JsonObject(max_depth=2)
MAX_WRITE_VALUES = 64


class SouthboundService:
    """Runs the instances of one adapter component and answers its verbs."""

    def __init__(self, runtime: Runtime, drivers: Mapping[str, DriverFactory]) -> None:
        self._runtime = runtime
        self._drivers = dict(drivers)
        self._lock = threading.RLock()
        self._running: dict[str, _Running] = {}
        #: The runners as last changed, read by readiness probes without the lock (a reload
        #: holds it while instances stop, and a probe must not wait for that).
        self._runners: tuple[InstanceRunner, ...] = ()
        self._shared = ""
        metrics = runtime.metrics

        def counter(instance: str, name: str, poll_group: str | None) -> Counter:
            dimensions = {"instance": instance}
            if poll_group is not None:
                dimensions["pollGroup"] = poll_group
            return metrics.counter(HEALTH_FAMILY, name, dimensions)

        self._context = InstanceContext(
            messaging=runtime.get_messaging(),
            topics=runtime.topics,
            stamp=runtime.config,
            raise_alarm=self._raise_alarm,
            clear_alarm=self._clear_alarm,
            counter=counter,
            gauge=lambda instance, name: metrics.gauge(HEALTH_FAMILY, name, {"instance": instance}),
            thread_failed=runtime.supervisor.failed,
        )
        # A component whose instances have all failed is not ready (/readyz).
        runtime.supervisor.add_check("instances", self._dead_instances)

    # -- instances --------------------------------------------------------------------------

    def _dead_instances(self) -> str | None:
        """Why every instance is down by a failure of its own, or None while one is alive
        (instances failed by their configuration, which never run, do not count)."""
        runners = [r for r in self._runners if r.state is not InstanceState.FAILED]
        reasons = [(runner.spec.id, runner.dead) for runner in runners]
        if not reasons or any(reason is None for _, reason in reasons):
            return None
        return "every instance failed: " + "; ".join(f"{i} {reason}" for i, reason in reasons)

    def instance_ids(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._running)

    def apply(
        self,
        specs: Sequence[InstanceSpec],
        skipped: Sequence[Skipped],
        shared: Mapping[str, Any],
    ) -> ReloadOutcome:
        """Applies a candidate as one transaction at instance granularity; ConfigError
        rejects it whole and leaves the running instances as they were."""
        skipped_ids = [s.id for s in skipped]
        for entry in skipped:
            _log.warning("instance %s skipped: %s", entry.id, entry.reason)
        runnable: list[InstanceSpec] = []
        for spec in specs:
            if spec.adapter not in self._drivers:
                _log.warning(
                    "instance %s skipped: adapter %r is not in this build (known: %s)",
                    spec.id,
                    spec.adapter,
                    ", ".join(sorted(self._drivers)),
                )
                skipped_ids.append(spec.id)
            else:
                runnable.append(spec)
        if not runnable:
            raise ConfigError(
                [ConfigIssue("$.component.instances", "no valid instance: nothing to run")]
            )
        shared_fingerprint = _fingerprint(shared)
        with self._lock:
            restart_all = shared_fingerprint != self._shared
            plan_start: list[InstanceSpec] = []
            kept: list[str] = []
            for spec in runnable:
                running = self._running.get(spec.id)
                if (
                    running is not None
                    and not restart_all
                    and running.fingerprint == _fingerprint(spec.entry)
                ):
                    kept.append(spec.id)
                else:
                    plan_start.append(spec)
            candidate_ids = {spec.id for spec in runnable}
            removed = [i for i in self._running if i not in candidate_ids]
            # Every driver is built before anything stops: a candidate with an instance that
            # cannot be started is refused whole, with nothing touched.
            drivers: dict[str, DeviceDriver] = {}
            issues = []
            for spec in plan_start:
                try:
                    drivers[spec.id] = self._drivers[spec.adapter](spec)
                except (UnskitError, ValueError, OSError) as error:
                    issues.append(
                        ConfigIssue(
                            f"$.component.instances[id={spec.id}]", f"cannot start: {error}"
                        )
                    )
            if issues:
                for driver in drivers.values():
                    driver.close()
                raise ConfigError(issues)
            restarting = [spec.id for spec in plan_start if spec.id in self._running]
            for instance_id in [*removed, *restarting]:
                self._stop(instance_id, removed=instance_id in removed)
            for spec in plan_start:
                self._start(spec, drivers[spec.id])
            self._shared = shared_fingerprint
        outcome = ReloadOutcome(
            started=[spec.id for spec in plan_start],
            stopped=removed,
            kept=kept,
            skipped=skipped_ids,
        )
        _log.info(
            "instances: started %s, stopped %s, kept %s, skipped %s",
            outcome.started,
            outcome.stopped,
            outcome.kept,
            outcome.skipped,
        )
        return outcome

    def _start(self, spec: InstanceSpec, driver: DeviceDriver) -> None:
        runner = InstanceRunner(spec, driver, self._context)
        self._running[spec.id] = _Running(spec, runner, _fingerprint(spec.entry))
        self._runners = tuple(r.runner for r in self._running.values())
        runner.start()

    def _stop(self, instance_id: str, *, removed: bool) -> None:
        running = self._running.pop(instance_id)
        self._runners = tuple(r.runner for r in self._running.values())
        running.runner.stop()
        if removed:
            self._runtime.metrics.remove({"instance": instance_id})

    def stop_all(self) -> None:
        """Stops every instance (component drain)."""
        with self._lock:
            for instance_id in list(self._running):
                self._stop(instance_id, removed=False)

    def runner(self, instance_id: str) -> InstanceRunner:
        with self._lock:
            running = self._running.get(instance_id)
        if running is None:
            raise CommandError(ErrorCode.NO_SUCH_INSTANCE, f"no instance named {instance_id!r}")
        return running.runner

    def _raise_alarm(self, alarm: str, instance: str, context: Mapping[str, Any]) -> None:
        events = self._runtime.events
        if events is None:
            return
        try:
            events.raise_alarm(alarm, context, instance=instance)
        except UnskitError as error:
            _log.warning("alarm %s of %s not published: %s", alarm, instance, error)

    def _clear_alarm(self, alarm: str, instance: str) -> None:
        events = self._runtime.events
        if events is None:
            return
        try:
            events.clear_alarm(alarm, instance=instance)
        except UnskitError as error:
            _log.warning("alarm %s of %s not cleared: %s", alarm, instance, error)

    # -- verbs ------------------------------------------------------------------------------

    def register_verbs(self, inbox: CommandInbox) -> None:
        """sb/status, sb/signals, sb/read, sb/write, sb/pause, sb/resume."""
        for verb in (
            Verb("status", self._status, scope=Scope.BOTH, summary="connection and counters"),
            Verb("signals", self._signals, scope=Scope.BOTH, paged=True, summary="signals"),
            Verb(
                "read",
                self._read,
                scope=Scope.INSTANCE,
                body=BodySpec({"signals": Param(ListOf(Text(max_bytes=512), 1, 100))}),
                summary="read signals from the device now",
            ),
            Verb(
                "write",
                self._write,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.REQUIRED,
                body=BodySpec(
                    {
                        "signal": Param(Text(max_bytes=512)),
                        "value": Param(_WRITE_VALUE),
                        "values": Param(_WRITE_VALUES),
                    }
                ),
                summary="write one allow-listed signal (signal, value), or several that land "
                "together (values: {id: value}) (engineering units)",
            ),
            Verb("pause", self._pause, scope=Scope.INSTANCE, summary="hold polling"),
            Verb("resume", self._resume, scope=Scope.INSTANCE, summary="poll again"),
        ):
            inbox.register(verb)

    def _status(self, context: CommandContext) -> Mapping[str, Any]:
        if context.instance is not None:
            return self.runner(context.instance).status()
        with self._lock:
            runners = [running.runner for running in self._running.values()]
        return {
            "component": self._runtime.topics.component,
            "messaging": self._runtime.messaging_status(),
            "instances": [runner.status() for runner in runners],
        }

    def _signals(self, context: CommandContext) -> Page:
        ids = [context.instance] if context.instance is not None else self.instance_ids()
        items = []
        for instance_id in ids:
            for view in self.runner(instance_id).signal_views():
                items.append({"instance": instance_id, **view})
        return Page(items, extra={"total": len(items)})

    def _read(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        runner = self.runner(context.instance)
        by_id = {signal.id: signal for signal in runner.signals()}
        wanted = context.body.get("signals") or list(by_id)
        unknown = [signal_id for signal_id in wanted if signal_id not in by_id]
        if unknown and isinstance(runner.driver, PushDriver):
            # A push source can address what it does not subscribe (an OPC UA node id).
            by_id.update({i: _addressed(runner.driver, i, "signals") for i in unknown})
        elif unknown:
            raise bad_args(f"signals: unknown signal ids {unknown}")
        group = PollGroupSpec("sb-read", 1, [by_id[signal_id] for signal_id in wanted])
        readings = self.on_device(runner, lambda: runner.driver.read(group))
        return {
            "instance": context.instance,
            "readings": [_reading_view(by_id[reading.signal_id], reading) for reading in readings],
        }

    def _write(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        runner = self.runner(context.instance)
        wanted = _write_request(context.body)
        raws: dict[str, Any] = {}
        signals: dict[str, SignalSpec] = {}
        for signal_id, value in wanted.items():
            signal = self._writable(runner, context.instance, signal_id)
            signals[signal_id], raws[signal_id] = signal, raw_write_value(signal, value)
        if "values" not in context.body:
            ((signal_id, raw),) = raws.items()
            self.on_device(runner, lambda: runner.driver.write(signals[signal_id], raw))
            return {
                "instance": context.instance,
                "signal": signal_id,
                "value": context.body["value"],
                "written": raw,
            }
        driver = runner.driver
        if isinstance(driver, AtomicWriter):
            self.on_device(runner, lambda: driver.write_many(raws))
        elif len(raws) == 1:
            ((signal_id, raw),) = raws.items()
            self.on_device(runner, lambda: driver.write(signals[signal_id], raw))
        else:
            raise bad_args(f"values: {context.instance} writes one signal per request")
        return {"instance": context.instance, "values": wanted, "written": raws}

    def _writable(self, runner: InstanceRunner, instance: str, signal_id: str) -> SignalSpec:
        """The signal sb/write may write, or BAD_ARGS (and write-rejected when refused)."""
        allow = runner.spec.writes_allow
        if signal_id not in allow and WRITES_ANY not in allow:
            detail = f"allowed: {sorted(allow)}" if allow else "this instance is read-only"
            self._emit_write_rejected(instance, signal_id, sorted(allow))
            raise bad_args(f"signal {signal_id!r} is not in writes.allow ({detail})")
        signal = next((s for s in runner.signals() if s.id == signal_id), None)
        if signal is None and isinstance(runner.driver, PushDriver):
            signal = _addressed(runner.driver, signal_id, "signal")
        if signal is None:
            raise bad_args(f"signal {signal_id!r} is allow-listed but not configured")
        return signal

    def _emit_write_rejected(self, instance: str, signal_id: str, allow: list[str]) -> None:
        events = self._runtime.events
        if events is None:
            return
        try:
            events.warning(WRITE_REJECTED, {"signal": signal_id, "allow": allow}, instance=instance)
        except UnskitError as error:
            _log.warning("write-rejected of %s not published: %s", instance, error)

    def on_device(self, runner: InstanceRunner, work: Callable[[], Any]) -> Any:
        """Runs device work on the instance thread, its failures as command errors."""
        if runner.state is InstanceState.FAILED:
            message = f"{runner.spec.id} failed: {runner.last_error}"
            raise CommandError(ErrorCode.DEVICE_UNAVAILABLE, message)
        if not runner.connected:
            raise CommandError(ErrorCode.DEVICE_UNAVAILABLE, f"{runner.spec.id} is not connected")
        wait = runner.spec.timing.request_timeout_ms / 1000 + _DEVICE_WAIT_MARGIN_S
        try:
            return runner.submit(work).result(wait)
        except DeviceError as error:
            code = (
                ErrorCode.DEVICE_UNAVAILABLE if error.connection_lost else ErrorCode.BACKEND_ERROR
            )
            raise CommandError(code, str(error)) from None
        except ValueError as error:
            raise bad_args(str(error)) from None
        except TimeoutError:
            raise CommandError(
                ErrorCode.DEVICE_UNAVAILABLE, f"{runner.spec.id} did not answer in {wait:.0f} s"
            ) from None

    def _pause(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        changed = self.runner(context.instance).pause()
        return {"instance": context.instance, "paused": True, "changed": changed}

    def _resume(self, context: CommandContext) -> Mapping[str, Any]:
        assert context.instance is not None
        changed = self.runner(context.instance).resume()
        return {"instance": context.instance, "paused": False, "changed": changed}


def _reading_view(signal: SignalSpec, reading: Reading) -> dict[str, Any]:
    """One sb/read reading; a value the envelope cannot carry reads BAD with a detail saying
    why, so it never fails the reply of the others."""
    value = scale_value(signal, reading.value)
    unfit = not_encodable(value)
    detail = unfit or reading.detail
    return {
        "id": reading.signal_id,
        "value": None if unfit else value,
        "quality": "BAD" if unfit else reading.quality.value,
        "sourceTimestampMs": reading.source_timestamp_ms or None,
        **({"detail": detail} if detail else {}),
    }


def _write_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """{signal id: value} of an sb/write body: `signal` with `value`, or `values`."""
    values = body.get("values")
    if values is not None:
        if body.get("signal") is not None or body.get("value") is not None:
            raise bad_args("values: give either signal and value, or values")
        if not 1 <= len(values) <= MAX_WRITE_VALUES:
            raise bad_args(f"values: 1 to {MAX_WRITE_VALUES} signals")
        for signal_id, value in values.items():
            _WRITE_VALUE.check(value, f"values.{signal_id}")
        return dict(values)
    if body.get("signal") is None:
        raise bad_args("signal: required (or values)")
    if body.get("value") is None:
        raise bad_args("value: required")
    return {body["signal"]: body["value"]}


def _addressed(driver: PushDriver, signal_id: str, field: str) -> SignalSpec:
    try:
        return driver.signal_for(signal_id)
    except ValueError as error:
        raise bad_args(f"{field}: {error}") from None


def raw_write_value(signal: SignalSpec, value: Any) -> Any:
    """The raw value for an engineering-unit write: (value - offset) / scale, rounded for
    integer types; BOOL takes booleans only. A signal typed outside the elementary CIP types
    (an OPC UA node's DataType) is written as given: its driver checks it against the node."""
    kind = signal.type.upper()
    if kind not in TYPES and signal.scale is None and signal.offset is None:
        return value
    if isinstance(value, list):
        if signal.array_count is None:
            raise bad_args(f"value: {signal.id} is not an array")
        if len(value) != signal.array_count:
            raise bad_args(f"value: {signal.id} holds {signal.array_count} elements")
        return [_raw_element(signal, kind, item) for item in value]
    if signal.array_count is not None:
        raise bad_args(f"value: {signal.id} is an array of {signal.array_count}")
    return _raw_element(signal, kind, value)


def _raw_element(signal: SignalSpec, kind: str, value: Any) -> Any:
    if kind == "BOOL":
        if not isinstance(value, bool):
            raise bad_args(f"value: {signal.id} is BOOL and takes true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_args(f"value: {signal.id} is {kind} and takes a finite number")
    raw = (value - (signal.offset or 0.0)) / (signal.scale if signal.scale else 1.0)
    if kind in FLOAT_TYPES:
        return float(raw)
    rounded = round(raw)
    low, high = INTEGER_RANGES.get(kind, (-math.inf, math.inf))
    if not low <= rounded <= high:
        raise bad_args(f"value: {value} is raw {rounded}, outside {kind}'s {low}..{high}")
    return rounded


def _fingerprint(value: Mapping[str, Any]) -> str:
    # Structural comparison: key order and formatting never restart anything.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
