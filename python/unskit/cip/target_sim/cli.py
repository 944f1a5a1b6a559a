"""`unskit cip-target-sim`: the target simulator on the command line."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence

from unskit.cip.target_sim.sim import AssemblySpec, CipTargetSim
from unskit.cip.target_sim.wire import (
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_TCP_PORT,
    DEFAULT_UDP_PORT,
    FORMATS,
)
from unskit.errors import CipError

__all__ = ["main"]


def _assembly_option(text: str) -> tuple[int, AssemblySpec]:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        instance, size = int(parts[0], 0), int(parts[1], 0)
        real_time_format = parts[2] if len(parts) == 3 else None
        if not 0 <= instance <= 0xFFFF:
            raise ValueError
        return instance, AssemblySpec(size, real_time_format)  # type: ignore[arg-type]
    except (ValueError, CipError) as exc:
        detail = f": {exc}" if str(exc) else ""
        raise argparse.ArgumentTypeError(
            f"{text!r} is not INSTANCE:SIZE[:FORMAT] (FORMAT {', '.join(FORMATS)}){detail}"
        ) from None


def _port_option(text: str) -> int:
    try:
        port = int(text, 0)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port 0..65535")
    return port


def _echo_option(text: str) -> tuple[int, int]:
    try:
        out, _, in_ = text.partition(":")
        return int(out, 0), int(in_, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not OUT:IN") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unskit cip-target-sim",
        description="A class-1 EtherNet/IP target for tests and demos. Prints "
        "'READY tcp=PORT udp=PORT' when it listens; SIGTERM or SIGINT stops it (exit 0).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument(
        "--tcp-port", type=_port_option, default=DEFAULT_TCP_PORT, help="0: any free"
    )
    parser.add_argument(
        "--udp-port", type=_port_option, default=DEFAULT_UDP_PORT, help="0: any free"
    )
    parser.add_argument(
        "--assembly",
        action="append",
        type=_assembly_option,
        metavar="INSTANCE:SIZE[:FORMAT]",
        help="an assembly (repeatable); default 100:16 (input), 150:16 (output), 151:0 "
        "(configuration); FORMAT modeless, header32 or heartbeat",
    )
    parser.add_argument(
        "--echo", action="append", type=_echo_option, default=[], metavar="OUT:IN",
        help="copy each O->T image of OUT into the T->O image of IN (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--pattern",
        choices=["demo"],
        help="animate an assembly: UDINT tick count at 0, REAL sine at 4, toggling bits at 8",
    )
    parser.add_argument(
        "--pattern-instance", type=int, default=100, help="the animated assembly (100)"
    )
    parser.add_argument(
        "--pattern-ms", type=float, default=100.0, help="one tick of the pattern (100 ms)"
    )
    parser.add_argument("--min-rpi-ms", type=float, default=1.0, help="smaller RPIs: 0x0111")
    parser.add_argument(
        "--api-us", type=int, help="grant this API (us) in both directions, whatever is asked"
    )
    parser.add_argument(
        "--refuse", type=lambda t: int(t, 0), metavar="EXT", help="refuse every Forward Open"
    )
    parser.add_argument("--multicast-group", default=None, help=DEFAULT_MULTICAST_GROUP)
    parser.add_argument("-v", "--verbose", action="store_true", help="log connections")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the sim until SIGTERM or SIGINT; returns the exit code (0, or 2 for bad usage)."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(message)s",
    )
    assemblies = dict(args.assembly) if args.assembly else None
    try:
        sim = CipTargetSim(
            host=args.host,
            tcp_port=args.tcp_port,
            udp_port=args.udp_port,
            assemblies=assemblies,
            min_rpi_ms=args.min_rpi_ms,
            api_override_us=args.api_us,
            refuse=args.refuse,
            multicast_group=args.multicast_group,
        )
        for out, in_ in args.echo:
            sim.echo(out, in_)
        if args.pattern:
            sim.animate(args.pattern_instance, args.pattern_ms)
    except CipError as exc:
        print(f"cip-target-sim: {exc}", file=sys.stderr)
        return 2
    # Blocked before the service thread starts (it inherits the mask), then awaited here:
    # no handler runs at an arbitrary point, and the wait is no poll.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        try:
            sim.start()
        except OSError as exc:
            print(f"cip-target-sim: cannot listen on {args.host}: {exc}", file=sys.stderr)
            return 2
        with _closing(sim):
            print(f"READY tcp={sim.tcp_port} udp={sim.udp_port}", flush=True)
            signal.sigwait(_SIGNALS)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return 0


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def _closing(sim: CipTargetSim) -> Iterator[None]:
    try:
        yield
    finally:
        sim.stop()


if __name__ == "__main__":
    sys.exit(main())
