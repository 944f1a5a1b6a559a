"""The recorder against a real Mosquitto fed by the ethernet-ip-adapter's sim backend: every
published sample is in the closed Parquet files, read back by pyarrow and by DuckDB."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.recorder.conftest import (
    Rig,
    leftovers,
    parquet_files,
    published_samples,
    read_with_duckdb,
    read_with_pyarrow,
    wait_for,
)
from unskit.recorder.writer import METADATA_KEY, SCHEMA_VERSION

pytestmark = pytest.mark.integration

MIN_SAMPLES = 400


def _accepted(recorder) -> int:
    return recorder.app.recorder.counts.samples


@pytest.mark.slow
def test_every_sample_of_the_sim_plc_is_recorded(rig: Rig, tmp_path: Path):
    output = tmp_path / "out"
    recorder = rig.start_recorder(output, rowGroupRows=64, roll={"maxRows": 300})
    plc = rig.start_plc()
    wait_for(lambda: len(published_samples(rig.published())) >= MIN_SAMPLES, "samples")
    plc.runtime.shutdown()
    published = published_samples(rig.published())
    wait_for(lambda: _accepted(recorder) >= len(published), "the recorder to take them all")
    status = recorder.status()
    assert status["samplesAccepted"] == len(published)
    assert status["filesClosed"] >= 1  # maxRows 300 rolled at least once
    flushed = recorder.call("flush")
    assert flushed["failed"] == 0
    status = recorder.status()
    assert status["openFiles"] == 0
    assert status["rowsBuffered"] == 0
    assert status["samplesRecorded"] == len(published)
    assert status["lastError"] is None

    files = parquet_files(output)
    assert len(files) == status["filesClosed"] >= 2
    assert leftovers(output) == []
    for path in files:
        # Hive directories: date, hour, device, component, instance.
        keys = [part.split("=")[0] for part in path.relative_to(output).parts[:-1]]
        assert keys == ["date", "hour", "device", "component", "instance"]
        metadata = pq.read_schema(path).metadata
        assert metadata[METADATA_KEY] == SCHEMA_VERSION.encode()
        assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
        assert pq.ParquetFile(path).metadata.num_rows <= 300

    assert read_with_pyarrow(output) == published
    assert read_with_duckdb(output) == published
    kinds = {row[0]: type(row[4]) for row in published}
    assert kinds == {"Temp": float, "Count": int, "Flag": bool, "Counts": tuple}
