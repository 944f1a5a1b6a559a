"""The run loops of `InstanceRunner`: a polled source's (each poll group read on its fixed
rate, the device probed while paused) and a push source's (connect and subscribe a fresh
inbox, drain what the device sent, hold and maintain, probe while paused), each running the
verbs' device work and publishing between cycles."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping

from unskit.southbound.driver import DeviceError, PollGroupSpec, PushDriver
from unskit.southbound.instance_publish import _Publishing
from unskit.southbound.push import PushInbox

# The logger keeps the name it had before this module was split out of instance.py.
_log = logging.getLogger("unskit.southbound.instance")


class _Loops(_Publishing):
    """The run loops of `InstanceRunner`: poll or drain, probe, publish, run jobs."""

    def _run_poll(self) -> None:
        groups = {group.id: group for group in self.spec.poll_groups}
        next_due: dict[str, float] = {}
        next_probe = 0.0
        while not self._stop.is_set():
            if not self.connected:
                if self._connect():
                    start = time.monotonic()
                    next_due = {group_id: start for group_id in groups}
                    next_probe = start + self.spec.timing.keepalive_probe_interval_ms / 1000
                continue
            now = time.monotonic()
            self._run_jobs()
            if not self.connected:
                continue
            if self._paused:
                if now >= next_probe:
                    next_probe = now + self.spec.timing.keepalive_probe_interval_ms / 1000
                    try:
                        self._guard(self.driver.probe)
                    except DeviceError:
                        continue
                    self._settle(answered=True)
            else:
                for group_id, due in next_due.items():
                    if now >= due and self.connected:
                        self._poll(groups[group_id], now)
                        interval = groups[group_id].interval_ms / 1000
                        # Fixed rate; a late cycle is not caught up in a burst.
                        next_due[group_id] = max(due + interval, now)
            self._publish(time.monotonic(), flush=False)
            self._set_gauges()
            self._wake.wait(self._sleep_for(next_due, next_probe))
            self._wake.clear()

    def _run_push(self, driver: PushDriver) -> None:
        next_probe = 0.0
        next_maintain: float | None = None
        held = False
        while not self._stop.is_set():
            if not self.connected:
                if self._connect(lambda deadline_s: self._subscribe(driver, deadline_s)):
                    start = time.monotonic()
                    next_maintain = start
                    next_probe = start + self.spec.timing.keepalive_probe_interval_ms / 1000
                continue
            self._run_jobs()
            now = time.monotonic()
            maintain_asked = self._drain(driver, now)
            if not self.connected:
                continue
            if self._paused != held:
                paused = self._paused
                try:
                    self._guard(functools.partial(driver.hold, paused))
                except DeviceError:
                    continue
                held = paused
            if maintain_asked or (next_maintain is not None and now >= next_maintain):
                try:
                    after = self._guard(driver.maintain)
                except DeviceError:
                    continue
                next_maintain = None if after is None else time.monotonic() + max(after, 0.0)
            if self._paused and now >= next_probe:
                next_probe = now + self.spec.timing.keepalive_probe_interval_ms / 1000
                try:
                    self._guard(driver.probe)
                except DeviceError:
                    continue
                self._settle(answered=True)
            # Pushed data proves the connection once it has stayed up a window since.
            self._settle(answered=False)
            self._publish(time.monotonic(), flush=False)
            self._set_gauges()
            wakes = [
                w
                for w in (next_maintain, self._table.next_window(), self._proof_due())
                if w is not None
            ]
            if self._paused:
                wakes.append(next_probe)
            timeout = max(0.0, min(wakes) - time.monotonic()) if wakes else 1.0
            self._wake.wait(timeout)
            self._wake.clear()

    def _subscribe(self, driver: PushDriver, deadline_s: float) -> None:
        """Connects, attaches a fresh inbox and has the driver start sending."""
        driver.connect(deadline_s)
        self._detach_inbox()
        self._inbox = PushInbox(self.spec.id, self._wake.set)
        driver.subscribe(self._inbox)
        self._define(driver)

    def _define(self, driver: PushDriver) -> None:
        self._table.define([("push", signal) for signal in driver.signals()], time.monotonic())

    def _drain(self, driver: PushDriver, now: float) -> bool:
        """Moves what the driver sent into the signal table; returns whether the driver
        asked for maintain. A loss it reported moves the instance to backoff."""
        inbox = self._inbox
        if inbox is None:
            return False
        lost, changed, maintain = inbox.take_flags()
        if changed:
            self._define(driver)
        readings = inbox.take()
        alive = inbox.take_alive()
        dropped = inbox.take_dropped()
        if dropped:
            self._context.counter(self.spec.id, "samplesDropped", None).inc(dropped)
        if readings and not self._paused:
            self._table.accept(readings, int(time.time() * 1000), now)
        if alive and not self._paused:
            self._table.touch(alive, now)
        if lost is not None and self.connected:
            self._lost(lost)
        if readings or alive or dropped:
            self._settle(answered=True)
        return maintain

    def _sleep_for(self, next_due: Mapping[str, float], next_probe: float) -> float:
        now = time.monotonic()
        wakes = [next_probe] if self._paused else list(next_due.values())
        window = self._table.next_window()
        if window is not None:
            wakes.append(window)
        return max(0.0, min(wakes, default=now + 1.0) - now)

    def _poll(self, group: PollGroupSpec, now: float) -> None:
        counter = self._context.counter
        try:
            readings = self._guard(lambda: self.driver.read(group)) or []
        except DeviceError as error:
            counter(self.spec.id, "readErrors", group.id).inc()
            _log.debug("instance %s: read of %s failed: %s", self.spec.id, group.id, error)
            return
        counter(self.spec.id, "reads", group.id).inc()
        self._settle(answered=True)
        bad = sum(1 for reading in readings if reading.quality.value != "GOOD")
        if bad:
            counter(self.spec.id, "readErrors", group.id).inc(bad)
        self._table.accept(readings, int(time.time() * 1000), now)
