"""`unskit egress send FILE... --config FILE`: deliver files once to every destination of
one file-egress instance, through the same pipeline the component runs, with a progress
bar per file and destination and a summary. The files are never deleted or archived;
an interrupted send resumes where it stopped when run again."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from unskit.config.loader import ConfigLoader
from unskit.egress.backends import safe_relative
from unskit.egress.config import TOKEN, component_schema, parse_component
from unskit.egress.pipeline import InstancePipeline
from unskit.egress.state import EgressState
from unskit.egress.throttle import TokenBucket
from unskit.errors import ConfigError, ConfigIssue, SecretError, UnsafePathError
from unskit.runtime.metrics import MetricsRegistry

__all__ = ["add_egress_parser", "send_main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SEND_STATE_FILE = "egress-send.sqlite3"


def add_egress_parser(commands: Any) -> None:
    """Adds `unskit egress send` to the command line."""
    egress = commands.add_parser("egress", help="file egress tools")
    tools = egress.add_subparsers(dest="egress_command", required=True)
    send = tools.add_parser(
        "send", help="deliver files once to every destination of a file-egress instance"
    )
    send.add_argument("files", nargs="+", metavar="FILE")
    send.add_argument(
        "-c", "--config", required=True, metavar="PATH", help="a file-egress configuration"
    )
    send.add_argument(
        "-t",
        "--thing",
        default="local",
        metavar="NAME",
        help="thing name (locates the progress store; default: local)",
    )
    send.add_argument("--instance", metavar="ID", help="the instance (default: the first)")
    send.add_argument(
        "--base",
        metavar="DIR",
        help="destination paths are relative to DIR (default: each file's name)",
    )
    send.add_argument(
        "--attempts",
        type=int,
        default=3,
        metavar="N",
        help="attempts per file and destination (default: 3)",
    )
    send.add_argument("--no-progress", action="store_true", help="no progress bars")
    send.set_defaults(run=send_main)


def _relative(paths: Sequence[str], base: str | None) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for text in paths:
        path = Path(os.path.abspath(text))
        rel = os.path.relpath(path, os.path.abspath(base)) if base else path.name
        rel = rel.replace(os.sep, "/")
        safe_relative(rel)  # a file outside --base would have a '..' path
        if rel in files:
            raise UnsafePathError(f"{text} and {files[rel]} would both be delivered as {rel}")
        files[rel] = path
    return files


def send_main(args: argparse.Namespace) -> int:
    """0 when every file was delivered and verified everywhere, 1 when one was not,
    2 for a configuration or usage error."""
    try:
        loader = ConfigLoader(
            args.config,
            thing=args.thing,
            component_schema=component_schema(),
            default_component=TOKEN,
        )
        config = loader.load()
        settings = parse_component(config)
        specs = {spec.id: spec for spec in settings.instances}
        instance_id = args.instance or settings.instances[0].id
        if instance_id not in specs:
            raise ConfigError([ConfigIssue("--instance", f"no instance {instance_id!r}")])
        files = _relative(args.files, args.base)
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise ConfigError([ConfigIssue("FILE", f"not a regular file: {', '.join(missing)}")])
        secrets = config.secrets() if config.credentials is not None else None
    except (ConfigError, SecretError, UnsafePathError) as error:
        print(f"unskit egress send: {error}", file=sys.stderr)
        return EXIT_USAGE
    spec = specs[instance_id]
    spec = dataclasses.replace(
        spec, retry=dataclasses.replace(spec.retry, max_attempts=max(args.attempts, 1))
    )
    if settings.state_dir is not None:
        base = settings.state_dir / config.thing_name / TOKEN
    else:
        base = config.commands.store_path(config.thing_name, TOKEN).parent
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    state = EgressState(base / SEND_STATE_FILE)
    try:
        return _send(args, spec, state, files, secrets, settings.bandwidth)
    finally:
        state.close()


def _send(
    args: argparse.Namespace,
    spec: Any,
    state: EgressState,
    files: Mapping[str, Path],
    secrets: Any,
    bandwidth: int,
) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.table import Table

    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=args.no_progress,
    )
    tasks: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    def task(dest: str, rel: str, size: int) -> Any:
        with lock:
            key = (rel, dest)
            if key not in tasks:
                tasks[key] = progress.add_task(f"{rel} -> {dest}", total=size)
            return tasks[key]

    def on_progress(_instance: str, dest: str, rel: str, done: int, size: int) -> None:
        progress.update(task(dest, rel, size), completed=done)

    def on_event(severity: str, kind: str, context: Mapping[str, Any], _instance: str) -> None:
        if kind == "file-delivered":
            size = int(context["size"])
            progress.update(task(context["destination"], context["file"], size), completed=size)
        elif severity in ("warning", "error"):
            console.print(
                f"[{severity}] {kind}: {context.get('file')} "
                f"{context.get('destination', '')} {context.get('error', '')}"
            )

    pipeline = InstancePipeline(
        spec,
        state,
        metrics=MetricsRegistry(),
        events=on_event,
        secrets=secrets,
        shared_buckets=(TokenBucket(bandwidth),),
        progress=on_progress,
        watch=False,
        files=files,
    )
    outcome: dict[str, dict[str, str]] = {}
    with progress:
        try:
            pipeline.start()
            outcome = pipeline.wait_settled(list(files))
        except KeyboardInterrupt:
            console.print("interrupted: progress kept; run the same command to resume")
            return EXIT_FAILED
        finally:
            pipeline.stop()
    table = Table(title=f"egress send ({spec.id})")
    table.add_column("file")
    for dest in spec.destinations:
        table.add_column(dest.id)
    failed = False
    for rel in files:
        states = outcome.get(rel, {})
        failed = failed or any(v != "verified" for v in states.values())
        table.add_row(rel, *(states.get(d.id, "?") for d in spec.destinations))
    # The summary goes to stdout (scripts read it); progress and warnings to stderr.
    Console().print(table)
    return EXIT_FAILED if failed else EXIT_OK
