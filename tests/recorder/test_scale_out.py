"""Two recorders in one consumer group, fed by sim PLCs: on Mosquitto the broker splits the
updates through $share/<group>/<filter>; on the NATS cluster, which accepts such a filter and
delivers nothing, each takes the devices of its partition. Each recorder writes its own files
(its process identity in their names), and every sample is recorded exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.recorder.conftest import (
    Rig,
    Running,
    parquet_files,
    published_samples,
    read_with_duckdb,
    read_with_pyarrow,
    wait_for,
)
from tests.support.adapter import Adapter
from tests.support.nats import NatsCluster

pytestmark = pytest.mark.integration

MIN_SAMPLES = 600


def _record_shared(
    rig: Rig, plcs: list[Adapter], first: Running, second: Running
) -> list[tuple[Any, ...]]:
    """Runs the PLCs for MIN_SAMPLES samples, stops them, waits until the two recorders took
    every one between them, checks each took a share (not one everything) and flushed
    cleanly; returns the published samples."""
    wait_for(lambda: len(published_samples(rig.published())) >= MIN_SAMPLES, "samples")
    for plc in plcs:
        plc.runtime.shutdown()
    published = published_samples(rig.published())

    def accepted() -> int:
        return int(first.status()["samplesAccepted"] + second.status()["samplesAccepted"])

    wait_for(lambda: accepted() >= len(published), "both recorders to take every sample")
    assert accepted() == len(published)
    for recorder in (first, second):
        assert 0 < recorder.status()["samplesAccepted"] < len(published)
        assert recorder.call("flush")["failed"] == 0
    return published


@pytest.mark.slow
def test_a_share_group_records_every_sample_exactly_once(rig: Rig, tmp_path: Path):
    output = tmp_path / "out"  # one output root for both, as a fleet on a shared volume
    first = rig.start_recorder(output, thing="rec-a", shareGroup="recorders")
    second = rig.start_recorder(output, thing="rec-b", shareGroup="recorders")
    assert first.status()["subscriptions"] == [f"$share/recorders/{rig.root}/+/+/+/data/#"]
    published = _record_shared(rig, [rig.start_plc()], first, second)
    identities = {first.status()["fileIdentity"], second.status()["fileIdentity"]}
    owners = Counter(
        next(i for i in identities if path.name.startswith(i)) for path in parquet_files(output)
    )
    assert set(owners) == identities
    recorded = read_with_pyarrow(output)
    assert recorded == published  # sorted lists: equal means no sample twice, none missing
    assert read_with_duckdb(output) == published
    # (Two polls caught up within one millisecond publish two equal rows: the multiset
    # equality above is the exactly-once check, not the rows being distinct.)


@pytest.mark.slow
def test_a_consumer_group_falls_back_to_its_partition_where_share_delivers_nothing(
    nats: NatsCluster, tmp_path: Path
):
    # The NATS cluster accepts $share filters and delivers nothing through them: the group's
    # probe finds that out and each recorder takes the devices its partition names.
    broker = SimpleNamespace(plain_port=nats.nodes[0].mqtt_port)
    rig = Rig(broker, tmp_path)  # type: ignore[arg-type]
    try:
        output = tmp_path / "out"
        group = {
            "name": "recorders",
            "devices": ["gw-1", "gw-2"],
            "partitions": {"rec-a": ["gw-1"], "rec-b": ["gw-2"]},
        }
        first = rig.start_recorder(
            output, thing="rec-a", consumerGroup={**group, "member": "rec-a"}
        )
        second = rig.start_recorder(
            output, thing="rec-b", consumerGroup={**group, "member": "rec-b"}
        )
        assert first.status()["consumerGroup"]["mode"] == "partitioned"
        assert first.status()["subscriptions"] == [f"{rig.root}/gw-1/+/+/data/#"]
        assert second.status()["subscriptions"] == [f"{rig.root}/gw-2/+/+/data/#"]
        plcs = [rig.start_plc(thing=thing) for thing in ("gw-1", "gw-2")]
        published = _record_shared(rig, plcs, first, second)
        assert read_with_pyarrow(output) == published
    finally:
        rig.close()
