"""`unskit fleet-sim`: K simulated gateways x M signals into a broker, measured at one
subscriber; prints a table (or `--json`). Exit 0 when the run completed, 1 when a client
could not connect, 2 for bad options."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from unskit.errors import MessagingError
from unskit.fleet.sim import FleetOptions, FleetReport, run_fleet

__all__ = ["add_fleet_parser", "fleet_sim", "parse_endpoints"]


def parse_endpoints(values: list[str]) -> tuple[tuple[str, int], ...]:
    """HOST:PORT entries (each may be a comma-separated list) in order; ValueError names
    the bad one."""
    endpoints: list[tuple[str, int]] = []
    for value in values:
        for item in value.split(","):
            text = item.strip()
            host, _, port = text.rpartition(":")
            host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
            if not host or not port.isdigit():
                raise ValueError(f"--broker expects HOST:PORT, not {text!r}")
            endpoints.append((host, int(port)))
    return tuple(endpoints)


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C or SIGTERM ends the run early; it still drains and reports."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop.set())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _table(report: FleetReport) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3f} ms"

    rows: list[tuple[str, str]] = [
        ("brokers", ", ".join(report.brokers)),
        ("gateways x signals", f"{report.gateways} x {report.signals}"),
        ("rate per signal", f"{report.rate:g}/s (QoS {report.qos})"),
        (
            "publishing window",
            f"{report.duration_s:.2f} s" + (" (stopped)" if report.stopped_early else ""),
        ),
        ("offered", f"{report.offered_msgs_per_s:,.1f} msgs/s"),
        ("delivered", f"{report.delivered_msgs_per_s:,.1f} msgs/s"),
        ("latency p50", ms(report.latency_p50_ms)),
        ("latency p99", ms(report.latency_p99_ms)),
        ("latency max", ms(report.latency_max_ms)),
        ("simulator CPU", f"{report.cpu_s:.2f} s (gateways and subscriber, one process)"),
        ("produced", f"{report.produced:,}"),
        ("published", f"{report.published:,} ({report.publish_errors:,} errors)"),
        ("delivered samples", f"{report.delivered:,} ({report.duplicates:,} duplicates)"),
        ("lost", f"{report.lost:,} ({report.loss_ratio:.4%}; {report.overflowed:,} overflowed)"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def fleet_sim(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Runs the simulator from parsed arguments and prints its report (to stdout)."""
    out = out or sys.stdout
    parser: argparse.ArgumentParser = args.fleet_parser
    try:
        options = FleetOptions(
            brokers=parse_endpoints(args.broker or ["127.0.0.1:1883"]),
            gateways=args.gateways,
            signals=args.signals,
            rate=args.rate,
            duration=args.duration,
            qos=args.qos,
            connect_timeout=args.connect_timeout,
            queue=args.queue,
        )
    except ValueError as error:
        parser.error(str(error))  # exit 2 with the usage line
    stop = threading.Event()
    try:
        with _stop_on_signals(stop):
            report = run_fleet(options, stop)
    except MessagingError as error:
        print(f"unskit fleet-sim: {error}", file=sys.stderr)
        return 1
    if args.json:
        out.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        out.write(_table(report) + "\n")
    out.flush()
    return 0


def add_fleet_parser(commands: Any) -> None:
    """Adds `fleet-sim` to the `unskit` command line."""
    parser = commands.add_parser(
        "fleet-sim",
        help="K simulated gateways x M signals into a broker: msgs/s, latency, loss",
        description="Runs K simulated gateways, each a real messaging client and southbound "
        "instance publishing M changing signals, and one subscriber that counts them.",
    )
    parser.add_argument(
        "--broker",
        action="append",
        metavar="HOST:PORT",
        help="broker endpoint; repeat it (or give a comma-separated list) for an endpoint "
        "list: gateway i starts at entry i mod n, the rest is its failover "
        "(default 127.0.0.1:1883)",
    )
    parser.add_argument("--gateways", "-k", type=int, default=4, help="K gateways (default 4)")
    parser.add_argument("--signals", "-m", type=int, default=10, help="M signals each (default 10)")
    parser.add_argument(
        "--rate", type=float, default=1.0, help="changes per second per signal (default 1)"
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="publishing seconds (default 10)"
    )
    parser.add_argument("--qos", type=int, default=1, help="0, 1 or 2 (default 1)")
    parser.add_argument(
        "--queue",
        type=int,
        default=10_000,
        help="the subscriber's bounded queue; an overflow is counted as loss (default 10000)",
    )
    parser.add_argument(
        "--connect-timeout", type=float, default=10.0, metavar="S", help="default 10"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=fleet_sim, fleet_parser=parser)
