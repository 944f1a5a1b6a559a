"""Two recorders in one MQTT shared subscription ($share/<group>/<filter>) on Mosquitto, fed
by the sim PLC: the broker splits the updates, each recorder writes its own files (its
process identity in their names), and every sample is recorded exactly once across both."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.recorder.conftest import (
    Rig,
    parquet_files,
    published_samples,
    read_with_duckdb,
    read_with_pyarrow,
    wait_for,
)

pytestmark = pytest.mark.integration

MIN_SAMPLES = 600


@pytest.mark.slow
def test_a_share_group_records_every_sample_exactly_once(rig: Rig, tmp_path: Path):
    output = tmp_path / "out"  # one output root for both, as a fleet on a shared volume
    first = rig.start_recorder(output, thing="rec-a", shareGroup="recorders")
    second = rig.start_recorder(output, thing="rec-b", shareGroup="recorders")
    assert first.status()["subscriptions"] == [f"$share/recorders/{rig.root}/+/+/+/data/#"]
    plc = rig.start_plc()
    wait_for(lambda: len(published_samples(rig.published())) >= MIN_SAMPLES, "samples")
    plc.runtime.shutdown()
    published = published_samples(rig.published())

    def accepted() -> int:
        return first.status()["samplesAccepted"] + second.status()["samplesAccepted"]

    wait_for(lambda: accepted() >= len(published), "both recorders to take every sample")
    assert accepted() == len(published)
    for recorder in (first, second):
        # The broker gave each a share, not one everything.
        assert 0 < recorder.status()["samplesAccepted"] < len(published)
        assert recorder.call("flush")["failed"] == 0
    identities = {first.status()["fileIdentity"], second.status()["fileIdentity"]}
    owners = Counter(
        next(i for i in identities if path.name.startswith(i)) for path in parquet_files(output)
    )
    assert set(owners) == identities
    recorded = read_with_pyarrow(output)
    assert recorded == published  # sorted lists: equal means no sample twice, none missing
    assert read_with_duckdb(output) == published
    assert len(set(recorded)) == len(recorded)
