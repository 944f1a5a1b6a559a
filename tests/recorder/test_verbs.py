"""sb/status, sb/flush, sb/pause, sb/resume and reload-config on a running recorder; the file
egress delivering its closed files; `unskit record query` reading them back."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.recorder.conftest import (
    Rig,
    data_topic,
    parquet_files,
    read_with_duckdb,
    update,
    wait_for,
)
from unskit.egress.component import FileEgress
from unskit.errors import CommandError
from unskit.recorder.cli import query
from unskit.topics import unshared_filter

pytestmark = pytest.mark.integration

HOUR = 3_600_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % (24 * HOUR)  # midnight UTC


def sample(value, at):
    return {"value": value, "source_timestamp_ms": at, "server_timestamp_ms": at}


def test_pause_resume_and_status(rig: Rig, tmp_path: Path):
    recorder = rig.start_recorder(tmp_path / "out")
    topic = data_topic(rig.root, "s")
    rig.listener.publish(topic, update("s", [sample(1.0, T0)]))
    wait_for(lambda: recorder.status()["rowsBuffered"] == 1, "the first sample")
    status = recorder.status()
    assert status["openFiles"] == 1
    assert status["filesClosed"] == 0
    assert status["paused"] is False

    assert recorder.call("pause") == {"paused": True, "changed": True}
    assert recorder.call("pause")["changed"] is False
    status = recorder.status()
    assert status["subscriptions"] == []
    assert status["openFiles"] == 0  # pausing closes the open files
    assert status["filesClosed"] == 1
    rig.listener.publish(topic, update("s", [sample(2.0, T0 + 1)]))  # not recorded
    assert recorder.call("resume") == {"paused": False, "changed": True}
    wait_for(rig.runtimes[-1].get_messaging().subscriptions_acknowledged, "the SUBACK")
    rig.listener.publish(topic, update("s", [sample(3.0, T0 + 2)]))
    wait_for(lambda: recorder.status()["samplesAccepted"] == 2, "the sample after resume")
    assert recorder.call("flush") == {"closed": 1, "failed": 0}
    assert recorder.call("flush") == {"closed": 0, "failed": 0}
    status = recorder.status()
    assert status["filesClosed"] == 2
    assert status["bytesWritten"] == sum(p.stat().st_size for p in parquet_files(tmp_path / "out"))
    assert sorted(r[4] for r in read_with_duckdb(tmp_path / "out")) == [1.0, 3.0]


def test_reload_config_changes_filters_and_codec_live(rig: Rig, tmp_path: Path):
    output = tmp_path / "out"
    recorder = rig.start_recorder(output)
    rig.listener.publish(data_topic(rig.root, "a"), update("a", [sample(1.0, T0)]))
    wait_for(lambda: recorder.status()["rowsBuffered"] == 1, "the first sample")
    only_b = f"{rig.root}/+/+/+/data/b"
    reply = recorder.reload(
        {"output": {"path": str(output)}, "topics": {"include": [only_b]},
         "compression": {"codec": "snappy"}}
    )  # fmt: skip
    assert reply["started"] == [only_b]
    assert reply["stopped"] == [f"{rig.root}/+/+/+/data/#"]
    status = recorder.status()
    assert status["subscriptions"] == [only_b]
    assert status["filesClosed"] == 1  # the writer changed: the open file was closed first
    wait_for(rig.runtimes[-1].get_messaging().subscriptions_acknowledged, "the SUBACK")
    rig.listener.publish(data_topic(rig.root, "a"), update("a", [sample(2.0, T0 + 1)]))
    rig.listener.publish(data_topic(rig.root, "b"), update("b", [sample(3.0, T0 + 2)]))
    wait_for(lambda: recorder.status()["samplesAccepted"] == 2, "the b sample")
    recorder.call("flush")
    codecs = sorted(
        pq.ParquetFile(p).metadata.row_group(0).column(0).compression for p in parquet_files(output)
    )
    assert codecs == ["SNAPPY", "ZSTD"]
    assert sorted(r[4] for r in read_with_duckdb(output)) == [1.0, 3.0]
    # A rejected change keeps the running configuration.
    with pytest.raises(CommandError, match=r"topics.include\[0\]"):
        recorder.reload({"output": {"path": str(output)}, "topics": {"include": ["a/#/b"]}})
    assert recorder.status()["subscriptions"] == [only_b]


@pytest.mark.slow
def test_the_file_egress_delivers_the_closed_files(rig: Rig, tmp_path: Path):
    output, delivered = tmp_path / "out", tmp_path / "delivered"
    recorder = rig.start_recorder(output, rowGroupRows=10, roll={"maxRows": 40})
    egress = rig.start_component(
        FileEgress,
        {
            "global": {"stateDir": str(tmp_path / "egress-state")},
            "instances": [
                {
                    "id": "signals",
                    "source": {"path": str(output), "include": ["*.parquet"], "settleSeconds": 0},
                    "onComplete": {"action": "archive", "archiveDir": str(tmp_path / "sent")},
                    "egress": [{"id": "lake", "type": "local", "path": str(delivered)}],
                }
            ],
        },
        "egress",
        delivered,
    )
    for k in range(100):
        rig.listener.publish(data_topic(rig.root, "s"), update("s", [sample(float(k), T0 + k)]))
    wait_for(lambda: recorder.status()["samplesAccepted"] == 100, "100 samples")
    recorder.call("flush")
    closed = recorder.status()["filesClosed"]
    assert closed == 3  # 40 + 40 + 20
    wait_for(lambda: len(list(delivered.rglob("*.parquet"))) == closed, "every file delivered")
    wait_for(lambda: not list(output.rglob("*.parquet")), "the sources archived")
    sent = {p.relative_to(tmp_path / "sent"): p for p in (tmp_path / "sent").rglob("*.parquet")}
    for path in delivered.rglob("*.parquet"):
        relative = path.relative_to(delivered)
        assert relative.parts[0].startswith("date=")  # the partitions travel with the files
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest == hashlib.sha256(sent[relative].read_bytes()).hexdigest()
    assert sorted(r[4] for r in read_with_duckdb(delivered)) == [float(k) for k in range(100)]
    assert not list(delivered.rglob("*.tmp"))
    assert egress.status()["instances"]


def _record_days(rig: Rig, output: Path) -> None:
    recorder = rig.start_recorder(output)
    for day in range(3):
        for hour in (1, 5):
            at = T0 + day * 24 * HOUR + hour * HOUR
            samples = [sample(float(day * 100 + hour * 10 + i), at + i) for i in range(3)]
            rig.listener.publish(data_topic(rig.root, "s"), update("s", samples))
            rig.listener.publish(data_topic(rig.root, "t"), update("t", [sample(-1.0, at)]))
    wait_for(lambda: recorder.status()["samplesAccepted"] == 24, "24 samples")
    recorder.call("flush")


def test_query_prunes_partitions_and_exports(rig: Rig, tmp_path: Path):
    output = tmp_path / "out"
    _record_days(rig, output)
    # A file that is not Parquet, in a day outside the query: opening it would fail.
    day0 = sorted(output.glob("date=*"))[0]
    (day0 / "hour=01" / "broken.parquet").write_bytes(b"not parquet")

    def at(ms: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)

    start = T0 + 24 * HOUR
    table = query(output, "s", at(start), at(T0 + 2 * 24 * HOUR + 5 * HOUR + 2))
    expected = [110.0, 111.0, 112.0, 150.0, 151.0, 152.0, 210.0, 211.0, 212.0, 250.0, 251.0]
    assert table.column("value_float64").to_pylist() == expected

    csv_path = tmp_path / "s.csv"
    command = [sys.executable, "-m", "unskit.cli", "record", "query", str(output), "--signal",
               "s", "--from", at(start).isoformat(), "--to", str(T0 + 2 * 24 * HOUR),
               "--format", "csv", "--output", str(csv_path)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    with csv_path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(r["value_float64"]) for r in rows] == [110.0, 111.0, 112.0, 150.0, 151.0,
                                                         152.0]  # fmt: skip
    assert {r["signal_id"] for r in rows} == {"s"}

    parquet_path = tmp_path / "s.parquet"
    command[command.index("csv")] = "parquet"
    command[-1] = str(parquet_path)
    assert subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    assert pq.read_table(parquet_path).num_rows == 6

    printed = subprocess.run(command[:-4], capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert len(printed.stdout.splitlines()) == 6
    assert "6 rows" in printed.stderr

    bad = subprocess.run([*command[:6], "--from", "yesterday"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert bad.returncode == 2
    assert "--from/--to" in bad.stderr


def test_a_shared_filter_matches_the_topics_of_its_filter():
    assert unshared_filter("$share/g/a/+/b/#") == "a/+/b/#"
    assert unshared_filter("a/b") == "a/b"
    assert unshared_filter("$share/g") == "$share/g"
    assert unshared_filter("$SYS/#") == "$SYS/#"
