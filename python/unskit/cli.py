"""The `unskit` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from unskit.envelope import Identity, Message, MessageBuilder


def _demo(_: argparse.Namespace) -> int:
    identity = Identity("enterprise/site/line/device", "acme/plant-1/line-4/gw-01", "demo")
    message = (
        MessageBuilder("demo-reading", "1")
        .identity(identity)
        .body({"temperature": 21.5, "unit": "C", "ok": True})
        .build()
    )
    wire = message.to_bytes()
    decoded = Message.from_bytes(wire)
    print(f"built and encoded {message!r} into {len(wire)} bytes")
    print(f"decoded: {decoded.to_diagnostic_json()}")
    return 0 if decoded == message else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="unskit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the demo")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
