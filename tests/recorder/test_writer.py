"""The Parquet writer on its own: partitions by each sample's own time, roll limits, value
columns, tag columns, the open-file cap and leftovers of a crashed run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from unskit.recorder.config import RollPolicy
from unskit.recorder.writer import (
    METADATA_KEY,
    RecordWriter,
    Source,
    process_identity,
    recover_leftovers,
)

HOUR = 3_600_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % HOUR  # on an hour boundary
SOURCE = Source("uns", "gw-01", "ethernet-ip-adapter", "press-1", "Temp", "Program:Temp")


def sample(value: Any, at: int, **extra: Any) -> dict[str, Any]:
    return {
        "value": value,
        "quality": extra.pop("quality", "GOOD"),
        "source_timestamp_ms": at,
        "server_timestamp_ms": extra.pop("server", at),
        **extra,
    }


def writer(output: Path, clock=None, **settings: Any) -> RecordWriter:
    options: dict[str, Any] = {
        "partition_by": ("date", "hour", "device", "component", "instance"),
        "roll": RollPolicy(),
        "row_group_rows": 1000,
        "codec": "zstd",
        "level": 3,
        "variant": False,
        "fsync": True,
        "max_open_files": 8,
        "identity": process_identity(),
    }
    options.update(settings)
    if clock is not None:
        options["clock"] = clock
    return RecordWriter(output, **options)


def table(output: Path) -> pa.Table:
    dataset = ds.dataset(
        output, format="parquet", partitioning=ds.HivePartitioning.discover(infer_dictionary=True)
    )
    return dataset.to_table().sort_by("source_ts")


def test_late_samples_land_in_their_own_hour(tmp_path: Path):
    w = writer(tmp_path)
    w.add(SOURCE, [sample(1.0, T0 + 5), sample(2.0, T0 + HOUR + 5)], T0 + HOUR + 10)
    # Hours later, a sample from the first hour (a device replaying its buffer).
    w.add(SOURCE, [sample(3.0, T0 + 7)], T0 + 5 * HOUR)
    assert w.open_files == 2
    assert w.close_all() == 2
    hours = sorted(p.relative_to(tmp_path).parts[1] for p in tmp_path.rglob("*.parquet"))
    first, second = f"hour={(T0 // HOUR) % 24:02d}", f"hour={(T0 // HOUR + 1) % 24:02d}"
    assert hours == sorted([first, second])
    rows = table(tmp_path).to_pylist()
    assert [r["value_float64"] for r in rows] == [1.0, 3.0, 2.0]
    assert [r["hour"] for r in rows] == [int(first[5:]), int(first[5:]), int(second[5:])]


def test_a_sample_without_a_source_time_goes_by_server_then_receive_time(tmp_path: Path):
    w = writer(tmp_path, partition_by=("hour",))
    w.add(SOURCE, [sample(1, 0, server=T0 + 2 * HOUR), sample(2, 0, server=0)], T0 + 3 * HOUR)
    w.close_all()
    rows = table(tmp_path).to_pylist()
    by_value = {r["value_int64"]: r for r in rows}
    assert by_value[1]["hour"] == (T0 // HOUR + 2) % 24
    assert by_value[2]["hour"] == (T0 // HOUR + 3) % 24
    assert by_value[2]["source_ts"] is None
    assert by_value[2]["server_ts"] is None


def test_every_value_type_has_its_column(tmp_path: Path):
    w = writer(tmp_path)
    values = [1.5, 7, True, "on", [1, 2.5], {"a": [1, None]}, None, ["x", 1], 2**70, math.nan]
    w.add(SOURCE, [sample(v, T0 + k, status="S" if k == 3 else None) for k, v in
                   enumerate(values)], T0)  # fmt: skip
    w.close_all()
    assert w.stats.json_values == 3  # the object, the mixed list, the 2**70 integer
    rows = table(tmp_path).to_pylist()
    kinds = [r["value_type"] for r in rows]
    assert kinds == ["float64", "int64", "bool", "string", "list", "json", "null", "json",
                     "json", "float64"]  # fmt: skip
    assert rows[0]["value_float64"] == 1.5
    assert rows[1]["value_int64"] == 7
    assert rows[2]["value_bool"] is True
    assert rows[3]["value_string"] == "on"
    assert rows[3]["status"] == "S"
    assert rows[4]["value_list"] == [1.0, 2.5]
    assert json.loads(rows[5]["value_json"]) == {"a": [1, None]}
    assert all(rows[6][c] is None for c in ("value_float64", "value_int64", "value_json"))
    assert json.loads(rows[8]["value_json"]) == 2**70
    assert math.isnan(rows[9]["value_float64"])


def test_the_variant_layout_keeps_one_json_column(tmp_path: Path):
    w = writer(tmp_path, variant=True)
    w.add(SOURCE, [sample(1.5, T0), sample([1, 2], T0 + 1), sample("x", T0 + 2)], T0)
    w.close_all()
    (path,) = tmp_path.rglob("*.parquet")
    names = pq.read_schema(path).names
    assert "value_float64" not in names
    rows = table(tmp_path).to_pylist()
    assert [json.loads(r["value_json"]) for r in rows] == [1.5, [1, 2], "x"]
    assert [r["value_type"] for r in rows] == ["float64", "list", "string"]


def test_tags_become_dictionary_columns_and_files_split_by_tag_keys(tmp_path: Path):
    w = writer(tmp_path, partition_by=())
    tagged = Source(*list(SOURCE.__dict__.values())[:6], (("line", "L1"), ("shift", "A")))
    w.add(tagged, [sample(1.0, T0)], T0)
    w.add(SOURCE, [sample(2.0, T0 + 1)], T0)
    assert w.open_files == 2
    w.close_all()
    schemas = [pq.read_schema(p) for p in tmp_path.rglob("*.parquet")]
    tag_columns = sorted(tuple(n for n in s.names if n.startswith("tag_")) for s in schemas)
    assert tag_columns == [(), ("tag_line", "tag_shift")]
    with_tags = next(s for s in schemas if "tag_line" in s.names)
    assert pa.types.is_dictionary(with_tags.field("tag_line").type)
    assert all(s.metadata[METADATA_KEY] == b"1" for s in schemas)


def test_roll_by_rows_and_bytes_and_age(tmp_path: Path):
    now = [0.0]
    w = writer(tmp_path / "rows", roll=RollPolicy(max_rows=10), row_group_rows=4)
    w.add(SOURCE, [sample(float(k), T0 + k) for k in range(25)], T0)
    assert w.stats.files_closed == 2  # one batch of 25 rows: 10, 10 and 5 still open
    w.close_all()
    files = (tmp_path / "rows").rglob("*.parquet")
    assert sorted(pq.ParquetFile(p).metadata.num_rows for p in files) == [5, 10, 10]

    w = writer(tmp_path / "bytes", roll=RollPolicy(max_bytes=4096), row_group_rows=50)
    for k in range(20):
        w.add(SOURCE, [sample(f"text-{k}-{i}" * 20, T0 + i) for i in range(50)], T0)
    w.close_all()
    files = list((tmp_path / "bytes").rglob("*.parquet"))
    assert len(files) >= 2
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in files) == 1000

    w = writer(tmp_path / "age", clock=lambda: now[0], roll=RollPolicy(max_seconds=5))
    w.add(SOURCE, [sample(1.0, T0)], T0)
    now[0] = 4.9
    assert w.close_expired() == 0
    now[0] = 5.0
    assert w.close_expired() == 1
    assert w.open_files == 0


def test_the_open_file_cap_closes_the_least_recently_used(tmp_path: Path):
    now = [0.0]
    w = writer(tmp_path, clock=lambda: now[0], max_open_files=2)
    for hour in range(3):
        now[0] += 1
        w.add(SOURCE, [sample(1.0, T0 + hour * HOUR)], T0)
    assert w.open_files == 2
    assert w.stats.files_closed == 1
    (closed,) = tmp_path.rglob("*.parquet")
    assert f"hour={(T0 // HOUR) % 24:02d}" in str(closed)


def test_only_closed_files_carry_the_parquet_name(tmp_path: Path):
    w = writer(tmp_path, row_group_rows=2)
    w.add(SOURCE, [sample(float(k), T0 + k) for k in range(5)], T0)
    (path,) = w.open_paths()
    assert not path.exists()
    tmp = path.with_name(f".{path.name}.tmp")
    assert tmp.exists()  # two row groups written already
    w.close_all()
    assert path.exists()
    assert not tmp.exists()


def test_leftovers_of_a_dead_process_are_set_aside(tmp_path: Path):
    identity = process_identity()
    host = identity.rsplit("-", 2)[0]
    dead = tmp_path / "date=x" / f".{host}-999999999-abcdef-000001.parquet.tmp"
    alive = tmp_path / f".{host}-{os.getppid()}-abcdef-000001.parquet.tmp"
    ours = tmp_path / f".{identity}-000001.parquet.tmp"
    other_host = tmp_path / ".otherhost-1-abcdef-000001.parquet.tmp"
    for path in (dead, alive, ours, other_host):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PAR1 no footer")
    moved = recover_leftovers(tmp_path, identity)
    assert moved == [dead.with_name(f".{host}-999999999-abcdef-000001.parquet.abandoned")]
    assert alive.exists()
    assert ours.exists()
    assert other_host.exists()


@pytest.mark.parametrize("codec", ["snappy", "none"])
def test_other_codecs(tmp_path: Path, codec: str):
    w = writer(tmp_path, codec=codec, level=None)
    w.add(SOURCE, [sample(1.0, T0)], T0)
    w.close_all()
    (path,) = tmp_path.rglob("*.parquet")
    expected = {"snappy": "SNAPPY", "none": "UNCOMPRESSED"}[codec]
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == expected
