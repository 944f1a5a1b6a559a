"""The fault schedule: each fault is injected for real (a signal, a full filesystem, a
dropped socket, a stepped wall clock), held, healed, and then the stack must be ready again.
A fault says which components' readiness must turn off, and within what bound: readiness is
the local broker link (docs/decisions.md), so only broker faults and a killed component
turn it off; under every other fault it must stay on."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.chaos.stack import COMPONENTS, KEEPALIVE_S, PROBE_PERIOD_S, Stack, established_to
from tests.support.servers import wait_until

#: A dropped broker connection is noticed at once: readiness is off by the next probe or two.
DROP_BOUND_S = 1.5 + 2 * PROBE_PERIOD_S
#: A stopped broker answers nothing: the client gives up after about 1.5 keepalives.
STALL_BOUND_S = 2 * KEEPALIVE_S + 2.0 + 2 * PROBE_PERIOD_S
#: After a fault is healed, every component is ready again within this.
RECOVERY_S = 30.0


@dataclass
class Fault:
    name: str
    inject: Callable[[Stack], str]
    heal: Callable[[Stack], None]
    hold_s: float
    #: Components whose readiness must turn off, and within how long of the injection.
    expect_down: Callable[[Stack], tuple[str, ...]] = lambda _stack: ()
    bound_s: float = 0.0
    #: How long after the stack is ready the fault strikes (a random point, for some).
    delay_s: float = 0.0


@dataclass
class Injected:
    """One fault as it happened (monotonic times)."""

    fault: str
    detail: str
    injected: float
    healed: float = 0.0
    recovered: float = 0.0
    expect_down: tuple[str, ...] = ()
    bound_s: float = 0.0
    #: Per component, seconds from injection to readiness off (None: never seen off).
    seen_down: dict[str, float | None] = field(default_factory=dict)
    #: Components not expected down that did turn not-ready during the fault.
    flapped: list[str] = field(default_factory=list)


def _broker_kill(stack: Stack) -> str:
    assert stack.broker.process is not None
    pid = stack.broker.process.pid
    stack.broker.process.kill()
    stack.broker.process.wait(10)
    stack.broker.process = None
    return f"SIGKILL pid {pid}"


def _broker_restart(stack: Stack) -> None:
    stack.broker.start()  # same ports, same persistence folder


def _broker_stop(stack: Stack) -> str:
    assert stack.broker.process is not None
    os.kill(stack.broker.process.pid, signal.SIGSTOP)
    return f"SIGSTOP pid {stack.broker.process.pid}, keepalive {KEEPALIVE_S} s"


def _broker_continue(stack: Stack) -> None:
    assert stack.broker.process is not None
    os.kill(stack.broker.process.pid, signal.SIGCONT)


def _plc_kill(stack: Stack) -> str:
    assert stack.plc.process is not None
    pid = stack.plc.process.pid
    stack.plc.process.kill()
    stack.plc.process.wait(10)
    stack.plc.process = None
    return f"SIGKILL cpppo pid {pid}"


def _sftp_kill(stack: Stack) -> str:
    assert stack.sftp.process is not None
    pid = stack.sftp.process.pid
    stack.sftp.kill()
    return f"SIGKILL sshd pid {pid} and its sessions"


def _fill(stack: Stack) -> str:
    filler = stack.fill_storage()
    return f"tmpfs full ({filler.stat().st_size // 1024} KiB filler)"


def _unfill(stack: Stack) -> None:
    stack.empty_storage()


def _clock(offset_ms: int) -> Callable[[Stack], str]:
    def inject(stack: Stack) -> str:
        stack.set_clock_offset(offset_ms)
        return f"components' wall clock {offset_ms / 3_600_000:+.0f} h"

    return inject


def _clock_back(stack: Stack) -> None:
    stack.set_clock_offset(0)


def _restart(name: str) -> Callable[[Stack], None]:
    return lambda stack: stack.start_component(name)


def component_kill(rng: random.Random) -> Fault:
    """SIGKILL to a component chosen by the seed, at a point chosen by the seed."""
    name = rng.choice(COMPONENTS)
    delay = rng.uniform(0.0, 1.5)

    def inject(stack: Stack) -> str:
        process = stack.components[name].process
        assert process is not None
        pid = process.pid
        stack.kill_component(name)
        return f"SIGKILL {name} pid {pid} after {delay:.2f} s"

    return Fault(
        f"kill {name}",
        inject,
        _restart(name),
        hold_s=0.5,
        expect_down=lambda _stack: (name,),
        bound_s=DROP_BOUND_S,
        delay_s=delay,
    )


def schedule(rng: random.Random) -> list[Fault]:
    """Every kind of fault once, in an order chosen by the seed."""
    faults = [
        Fault(
            "broker SIGKILL + restart",
            _broker_kill,
            _broker_restart,
            hold_s=1.0,
            expect_down=lambda _stack: COMPONENTS,
            bound_s=DROP_BOUND_S,
        ),
        Fault(
            "broker SIGSTOP > keepalive",
            _broker_stop,
            _broker_continue,
            hold_s=STALL_BOUND_S + 1.0,
            expect_down=lambda _stack: COMPONENTS,
            bound_s=STALL_BOUND_S,
        ),
        Fault("PLC (cpppo) SIGKILL + restart", _plc_kill, lambda s: _restart_plc(s), hold_s=2.0),
        Fault(
            "sftp server SIGKILL + restart",
            _sftp_kill,
            lambda s: _restart_sftp(s),
            hold_s=3.0,
        ),
        Fault("camera storage full", _fill, _unfill, hold_s=3.0),
        # Two, so a round more often catches the camera or the egress in the middle of a file.
        component_kill(rng),
        component_kill(rng),
        Fault("wall clock +1 h", _clock(3_600_000), _clock_back, hold_s=3.0),
        Fault("wall clock -1 h", _clock(-3_600_000), _clock_back, hold_s=3.0),
    ]
    rng.shuffle(faults)
    return faults


def _restart_plc(stack: Stack) -> None:
    stack.plc.start()
    # Felt and healed: the CIP adapter connects to the new PLC on its own.
    wait_until(
        lambda: established_to(stack.plc.port), RECOVERY_S, "the CIP adapter back on the PLC"
    )


def _restart_sftp(stack: Stack) -> None:
    stack.sftp.start()
    # The camera keeps capturing, so the egress has files to send and connects again.
    wait_until(
        lambda: established_to(stack.sftp.port), RECOVERY_S, "the egress back on the sftp server"
    )


def all_ready(stack: Stack) -> bool:
    return all(stack.readiness.probe(c.health_port) for c in stack.components.values())


def run_fault(stack: Stack, fault: Fault) -> Injected:
    """Injects, holds, heals; then waits (bounded) until every component is ready again."""
    wait_until(lambda: all_ready(stack), RECOVERY_S, f"every component ready before {fault.name}")
    # The random point is the fault itself, not a synchronisation.
    time.sleep(fault.delay_s)
    started = time.monotonic()
    detail = fault.inject(stack)
    record = Injected(
        fault.name, detail, started, expect_down=fault.expect_down(stack), bound_s=fault.bound_s
    )
    # Holding a fault is the fault: the outage has to last this long.
    time.sleep(fault.hold_s)
    fault.heal(stack)
    record.healed = time.monotonic()
    wait_until(lambda: all_ready(stack), RECOVERY_S, f"every component ready after {fault.name}")
    record.recovered = time.monotonic()
    # The poller samples every PROBE_PERIOD_S: let it record the recovery too.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not all(
        stack.readiness.ready_at(name, time.monotonic()) for name in stack.components
    ):
        time.sleep(PROBE_PERIOD_S)
    for name in stack.components:
        # Up to now: the next fault is injected only after this returns.
        changes = stack.readiness.between(name, record.injected, time.monotonic())
        off = [at for at, ready in changes if not ready]
        if name in record.expect_down:
            record.seen_down[name] = (off[0] - record.injected) if off else None
        elif off:
            record.flapped.append(name)
    return record
