"""`unskit demo`: the edge stack as separate component processes under one supervisor, an
embedded broker, a readable live view of the UNS traffic, a clean shutdown and a summary.

This module is the command line (the output folder emptied or refused, then the supervisor
run); the supervisor itself is in `supervisor.py`, the live view's lines in `view.py`."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from pathlib import Path
from typing import Any

from unskit.demo.plan import demo_documents, demo_peers, missing_extras, recorder_available
from unskit.demo.supervisor import EXIT_MISMATCH, Supervisor
from unskit.localhost import free_port

__all__ = ["add_demo_parser", "demo_main"]

#: Written into the output folder so a later run knows it may empty it.
MARKER = ".unskit-demo"
#: An extra the demo needs is not installed (as `unskit validate` and `unskit run` refuse one).
EXIT_MISSING_EXTRA = 2


def _prepare(output: Path) -> None:
    """Empties an output folder a previous demo left; refuses any other non-empty folder."""
    if output.exists() and any(output.iterdir()):
        if not (output / MARKER).exists():
            raise RuntimeError(
                f"{output} is not empty and was not written by `unskit demo`; "
                "choose another folder with --output"
            )
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / MARKER).write_text("written by `unskit demo`; the next run empties this folder\n")


def _address(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return text


def demo_main(args: argparse.Namespace) -> int:
    """`unskit demo`; exit 2, before anything starts, when an extra it needs is missing."""
    output = Path(args.output).resolve()
    missing = missing_extras(embedded_broker=args.broker is None)
    if missing is not None:
        print(f"unskit demo: {missing}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    if not recorder_available():
        print(
            "unskit demo: the signal-recorder is left out; pip install 'unskit[recorder]' adds it",
            file=sys.stderr,
        )
    try:
        _prepare(output)
        opcua_port, cip_port = free_port(), free_port()
        supervisor = Supervisor(
            demo_documents(output, opcua_port, cip_port),
            output,
            broker=args.broker,
            port=args.port,
            peers=demo_peers(opcua_port, cip_port),
        )
        return supervisor.run(args.duration)
    except RuntimeError as error:
        with contextlib.suppress(OSError, ValueError):  # stderr may be the closed pipe too
            print(f"unskit demo: {error}", file=sys.stderr)
        return EXIT_MISMATCH


def add_demo_parser(commands: Any) -> None:
    """Adds `demo` to the `unskit` command line."""
    parser = commands.add_parser(
        "demo",
        help="run the whole edge stack on an embedded broker and show its traffic",
        description="Starts an embedded MQTT broker and, as separate processes, the CIP adapter "
        "with a sim PLC and a class-1 I/O connection to a target simulator (`unskit "
        "cip-target-sim`), an OPC UA server (`unskit opcua-sim`) and the OPC UA adapter "
        "subscribed to it, the camera adapter with two sim cameras on a schedule, and the file "
        "egress delivering the captured images to a local folder; shows the UNS traffic, then "
        "stops everything cleanly and prints a summary. Exit 0 when every component exited 0 "
        "and every captured image was delivered with its SHA-256; 1 otherwise; 2, before "
        "anything starts, when a package it needs is not installed (the pip command is named).",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="stop after S seconds (default: at Ctrl-C)",
    )
    parser.add_argument(
        "--output",
        default="demo-output",
        metavar="DIR",
        help="configs, logs, images and delivered files go here; emptied first if a previous "
        "demo wrote it (default ./demo-output)",
    )
    broker = parser.add_mutually_exclusive_group()
    broker.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="N",
        help="port of the embedded broker on 127.0.0.1 (default: any free port)",
    )
    broker.add_argument(
        "--broker",
        type=_address,
        metavar="HOST:PORT",
        help="use this existing broker instead of the embedded one",
    )
    parser.set_defaults(run=demo_main)
