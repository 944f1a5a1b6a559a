"""`unskit record query DIR --signal ID --from T --to T`: what a recorder wrote, read back
through `pyarrow.dataset` with the date/hour partitions pruned, printed or exported."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from unskit.recorder.config import extra_installed, missing_extra

__all__ = ["add_record_parser", "parse_time", "query"]

EXIT_OK = 0
EXIT_USAGE = 2
#: Rows printed as a table before the rest is summarised (exports are never cut).
TABLE_ROWS = 1_000
SHOWN = (
    "source_ts",
    "server_ts",
    "device",
    "component",
    "instance",
    "signal_id",
    "quality",
    "value_type",
)


def parse_time(text: str) -> dt.datetime:
    """ISO 8601 (a naive time is UTC) or epoch milliseconds, as an aware UTC datetime."""
    if text.isdigit():
        return dt.datetime.fromtimestamp(int(text) / 1000, tz=dt.timezone.utc)
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def _dataset(root: Path) -> Any:
    import pyarrow as pa
    import pyarrow.dataset as ds

    discovered = ds.dataset(
        root,
        format="parquet",
        partitioning=ds.HivePartitioning.discover(infer_dictionary=True),
        exclude_invalid_files=False,
    )
    fields = []
    for found in discovered.partitioning.schema if discovered.partitioning else []:
        # date and hour compare as ranges (string and integer); the others stay dictionaries
        # like the columns of the same name inside the files.
        if found.name == "date":
            fields.append(pa.field("date", pa.string()))
        elif found.name == "hour":
            fields.append(pa.field("hour", pa.int32()))
        else:
            fields.append(found)
    partitioning = ds.partitioning(pa.schema(fields), flavor="hive")
    # Files written with different tag keys have different tag columns: read them all.
    schemas = [f.physical_schema for f in discovered.get_fragments()]
    unified = pa.unify_schemas(
        [*schemas, pa.schema([f for f in fields if f.name not in _names(schemas)])]
    )
    return ds.dataset(root, format="parquet", partitioning=partitioning, schema=unified)


def _names(schemas: list[Any]) -> set[str]:
    return {name for schema in schemas for name in schema.names}


def query(
    root: Path,
    signal: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    *,
    device: str | None = None,
    instance: str | None = None,
) -> Any:
    """The recorded rows of `signal` with start <= time < end (source timestamp, else
    server, else receive time), as a pyarrow Table
    sorted by source timestamp. The date and hour partitions outside the range are never
    opened."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    dataset = _dataset(root)
    names = set(dataset.schema.names)
    condition = None

    def both(expression: Any) -> None:
        nonlocal condition
        condition = expression if condition is None else condition & expression

    if signal is not None:
        both(ds.field("signal_id") == signal)
    if device is not None:
        both(ds.field("device") == device)
    if instance is not None:
        both(ds.field("instance") == instance)
    # The instance a sample's partition was chosen by: source, else server, else receipt.
    at = pc.coalesce(ds.field("source_ts"), ds.field("server_ts"), ds.field("receive_ts"))
    if start is not None:
        both(at >= start)
        if "date" in names:
            both(ds.field("date") >= start.strftime("%Y-%m-%d"))
    if end is not None:
        both(at < end)
        if "date" in names:
            both(ds.field("date") <= end.strftime("%Y-%m-%d"))
    if start is not None and end is not None and "hour" in names and start.date() == end.date():
        both((ds.field("hour") >= start.hour) & (ds.field("hour") <= end.hour))
    table = dataset.to_table(filter=condition)
    return table.sort_by([("source_ts", "ascending"), ("receive_ts", "ascending")])


def _value(row: dict[str, Any]) -> Any:
    kind = row.get("value_type")
    if kind in (None, "null"):
        return None
    return row.get(f"value_{kind}", row.get("value_json"))


def _run(args: argparse.Namespace) -> int:
    if not extra_installed():
        print(f"unskit record: {missing_extra()}", file=sys.stderr)
        return EXIT_USAGE
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    root = Path(args.dir)
    if not root.is_dir():
        print(f"unskit record query: {root} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        start = parse_time(args.start) if args.start else None
        end = parse_time(args.end) if args.end else None
    except ValueError as error:
        print(f"unskit record query: --from/--to: {error}", file=sys.stderr)
        return EXIT_USAGE
    table = query(root, args.signal, start, end, device=args.device, instance=args.instance)
    if args.format == "parquet":
        if not args.output:
            print("unskit record query: --format parquet needs --output FILE", file=sys.stderr)
            return EXIT_USAGE
        pq.write_table(table, args.output, compression="zstd")
    elif args.format == "csv":
        # CSV has no dictionaries or lists: decoded, and lists as their text.
        plain = table.cast(_csv_schema(table.schema))
        if args.output:
            pacsv.write_csv(plain, args.output)
        else:
            sink = _StdoutSink()
            pacsv.write_csv(plain, sink)
    else:
        for row in table.slice(0, TABLE_ROWS).to_pylist():
            cells = [str(row.get(name)) for name in SHOWN if name in row]
            print("  ".join([*cells, repr(_value(row))]))
        if table.num_rows > TABLE_ROWS:
            print(f"... {table.num_rows - TABLE_ROWS} more rows (use --format csv)")
    if args.output or args.format != "csv":
        print(f"{table.num_rows} rows", file=sys.stderr)
    return EXIT_OK


def _csv_schema(schema: Any) -> Any:
    import pyarrow as pa

    fields = []
    for f in schema:
        kind = f.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        elif pa.types.is_list(kind):
            kind = pa.string()
        fields.append(pa.field(f.name, kind))
    return pa.schema(fields)


class _StdoutSink:
    """A binary file-like object over stdout for pyarrow's CSV writer."""

    closed = False

    def write(self, data: bytes) -> int:
        sys.stdout.buffer.write(data)
        return len(data)

    def flush(self) -> None:
        sys.stdout.buffer.flush()


def add_record_parser(commands: Any) -> None:
    """Adds `unskit record query` to the command line."""
    record = commands.add_parser("record", help="read what a signal-recorder wrote")
    verbs = record.add_subparsers(dest="record_command", required=True)
    q = verbs.add_parser(
        "query", help="print or export recorded samples (pyarrow.dataset, partitions pruned)"
    )
    q.add_argument("dir", metavar="DIR", help="the recorder's output.path")
    q.add_argument("--signal", metavar="ID", help="one signal id")
    q.add_argument("--device", metavar="NAME")
    q.add_argument("--instance", metavar="NAME")
    q.add_argument("--from", dest="start", metavar="T", help="ISO 8601 (UTC if naive) or epoch ms")
    q.add_argument("--to", dest="end", metavar="T", help="exclusive end, same forms")
    q.add_argument("--format", choices=("table", "csv", "parquet"), default="table")
    q.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    record.set_defaults(run=_run)
