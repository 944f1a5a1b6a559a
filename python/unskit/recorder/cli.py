"""`unskit record query DIR --signal ID --from T --to T`: what a recorder wrote, read back
through `pyarrow.dataset` with the date/hour partitions pruned, printed or exported."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

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


def _partitioning(root: Path) -> tuple[Any, Any]:
    """The Hive partitioning of `root`, read from its directory names alone (no file is
    opened): date as text and hour as a number (compared as ranges), the others
    dictionaries like the columns of the same name inside the files."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    fields = []
    dictionaries = {}
    folder = root
    pattern = ""
    while True:
        levels = sorted(p for p in folder.iterdir() if p.is_dir() and "=" in p.name)
        if not levels:
            break
        name = levels[0].name.split("=", 1)[0]
        pattern += f"{name}=*/"
        if name == "date":
            fields.append(pa.field("date", pa.string()))
        elif name == "hour":
            fields.append(pa.field("hour", pa.int32()))
        else:
            fields.append(pa.field(name, pa.dictionary(pa.int32(), pa.string())))
            # Every value of this level, from the directory names (the files stay closed).
            values = {unquote(p.name.split("=", 1)[1]) for p in root.glob(pattern)}
            dictionaries[name] = pa.array(sorted(values), pa.string())
        folder = levels[0]
    schema = pa.schema(fields)
    return ds.partitioning(schema, flavor="hive", dictionaries=dictionaries), schema


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
    server, else receive time) as a pyarrow Table sorted by that time. Files in date, hour,
    device and instance partitions outside the query are never opened."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    partitioning, partitions = _partitioning(root)
    keys = set(partitions.names)
    by_path: list[Any] = []  # on the partition keys alone: prunes directories
    by_row: list[Any] = []
    if signal is not None:
        by_row.append(ds.field("signal_id") == signal)
    for name, value in (("device", device), ("instance", instance)):
        if value is not None:
            (by_path if name in keys else by_row).append(ds.field(name) == value)
    # The time a sample's partition was chosen by: source, else server, else receipt.
    at = pc.coalesce(ds.field("source_ts"), ds.field("server_ts"), ds.field("receive_ts"))
    if start is not None:
        by_row.append(at >= pa.scalar(start, pa.timestamp("ms", tz="UTC")))
        if "date" in keys:
            by_path.append(ds.field("date") >= start.strftime("%Y-%m-%d"))
    if end is not None:
        by_row.append(at < pa.scalar(end, pa.timestamp("ms", tz="UTC")))
        if "date" in keys:
            by_path.append(ds.field("date") <= end.strftime("%Y-%m-%d"))
    if start is not None and end is not None and "hour" in keys and start.date() == end.date():
        by_path.append((ds.field("hour") >= start.hour) & (ds.field("hour") <= end.hour))
    # Listed with the schema given, so no file is opened before the directories are pruned.
    listed = ds.dataset(
        root, format="parquet", partitioning=partitioning, schema=_empty(partitions).schema
    )
    fragments = list(listed.get_fragments(filter=_all(by_path)))
    if not fragments:
        return _empty(partitions)
    # Files written with other tag keys have other tag columns: the union of what is read.
    schema = pa.unify_schemas([f.physical_schema for f in fragments] + [partitions])
    dataset = ds.dataset(
        [f.path for f in fragments],
        format="parquet",
        partitioning=partitioning,
        partition_base_dir=str(root),
        schema=schema,
    )
    table = dataset.to_table(filter=_all(by_path + by_row))
    order = pc.coalesce(table["source_ts"], table["server_ts"], table["receive_ts"])
    return table.take(pc.sort_indices(order))


def _all(expressions: list[Any]) -> Any:
    combined = None
    for expression in expressions:
        combined = expression if combined is None else combined & expression
    return combined


def _empty(partitions: Any) -> Any:
    import pyarrow as pa

    from unskit.recorder.writer import file_schema

    schema = pa.unify_schemas([file_schema((), variant=False), partitions])
    return schema.empty_table()


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
        plain = _plain(table)
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


def _plain(table: Any) -> Any:
    """The table as CSV can hold it: dictionaries decoded, lists as JSON text."""
    import json

    import pyarrow as pa

    columns = []
    for column in table.columns:
        kind = column.type
        if pa.types.is_dictionary(kind):
            column = column.cast(kind.value_type)
        elif pa.types.is_list(kind):
            text = [None if v is None else json.dumps(v) for v in column.to_pylist()]
            column = pa.array(text, pa.string())
        columns.append(column)
    return pa.table(columns, names=table.column_names)


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
