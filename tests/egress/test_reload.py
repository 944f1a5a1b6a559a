"""Live reload of the file-egress configuration (issue 16 item 5) through sb/reload-config:
an instance or destination added, changed or removed without restarting the others, a
transfer in flight resuming from its recorded offset on the changed instance, `global`
restarting every instance, and a candidate that cannot start refused whole."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.egress.conftest import MIB, write_file
from tests.support.adapter import Adapter, AdapterHarness
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from unskit.egress.component import FileEgress
from unskit.errors import CommandError

pytestmark = pytest.mark.integration


@pytest.fixture
def adapters(broker: Mosquitto, tmp_path: Path, restore_root_logging: None):
    harness = AdapterHarness(broker, tmp_path)
    yield harness
    harness.close()


def instance(tmp_path: Path, name: str, *destinations: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": name,
        "source": {"path": str(tmp_path / name / "src"), "settleSeconds": 0},
        "egress": list(destinations) or [local(tmp_path / name / "out")],
    }


def local(path: Path, **settings: Any) -> dict[str, Any]:
    return {"type": "local", "id": "out", "path": str(path), **settings}


def start(adapters: AdapterHarness, tmp_path: Path, *instances: dict[str, Any]) -> Adapter:
    component = {
        "global": {
            "stateDir": str(tmp_path / "egress-state"),
            "retry": {"initialBackoffMs": 100, "maxBackoffMs": 500},
        },
        "instances": list(instances),
    }
    return adapters.start(FileEgress, adapters.document(component))


def delivered(adapter: Adapter, instance_id: str) -> int:
    return adapter.client.call("status", instance=instance_id)["files"].get("completed", 0)


def test_instances_are_added_changed_and_removed_without_touching_the_others(
    adapters: AdapterHarness, tmp_path: Path
):
    a, b = instance(tmp_path, "a"), instance(tmp_path, "b")
    adapter = start(adapters, tmp_path, a, b)
    client = adapter.client
    client.call("pause", instance="a")
    document = copy.deepcopy(adapter.document)
    second = tmp_path / "b" / "second"
    document["component"]["instances"] = [
        a,
        {**b, "egress": [*b["egress"], local(second, id="second")]},
        instance(tmp_path, "c"),
    ]
    outcome = adapter.reload(document)
    assert outcome == {"started": ["b", "c"], "stopped": [], "kept": ["a"], "skipped": []}
    # The untouched instance keeps its pause; the changed one runs on its new settings.
    assert client.call("status", instance="a")["paused"] is True
    data = write_file(tmp_path / "b" / "src" / "x.bin", 1000)
    write_file(tmp_path / "c" / "src" / "y.bin", 1000)
    wait_until(lambda: delivered(adapter, "b") == 1 and delivered(adapter, "c") == 1, 20, "b, c")
    assert (second / "x.bin").read_bytes() == data
    assert (tmp_path / "b" / "out" / "x.bin").read_bytes() == data

    document["component"]["instances"] = [a, instance(tmp_path, "c")]
    outcome = adapter.reload(document)
    assert outcome == {"started": [], "stopped": ["b"], "kept": ["a", "c"], "skipped": []}
    with pytest.raises(CommandError, match="NO_SUCH_INSTANCE"):
        client.call("status", instance="b")
    # The event and the reload's reply travel separately: wait for the event to arrive.
    applied_topic = adapter.runtime.topics.topic("evt", "info", "config-applied")

    def applied() -> list[Any]:
        return [m.body["context"] for m in adapter.seen.on(applied_topic)]

    wait_until(lambda: any(c["stopped"] == ["b"] for c in applied()), 10, "config-applied")
    assert applied()[-1]["stopped"] == ["b"]


def test_a_transfer_in_flight_resumes_on_the_changed_instance(
    adapters: AdapterHarness, tmp_path: Path
):
    out = tmp_path / "a" / "out"
    slow = instance(tmp_path, "a", local(out, bandwidthBytesPerSec=8 * MIB))
    adapter = start(adapters, tmp_path, slow)
    data = write_file(tmp_path / "a" / "src" / "big.bin", 32 * MIB)

    def offset() -> int:
        queue = adapter.client.call("status", instance="a")["queue"]
        return queue[0]["destinations"]["out"]["offset"] if queue else 0

    # The local backend records its offset every 8 MiB.
    wait_until(lambda: offset() >= 8 * MIB, 30, "a recorded offset")
    document = copy.deepcopy(adapter.document)
    document["component"]["instances"] = [
        instance(tmp_path, "a", local(out, bandwidthBytesPerSec=64 * MIB))
    ]
    recorded = offset()
    assert adapter.reload(document)["started"] == ["a"]
    wait_until(lambda: delivered(adapter, "a") == 1, 30, "the file")
    assert (out / "big.bin").read_bytes() == data
    events = [
        m.body["context"]
        for m in adapter.seen.on(
            adapter.runtime.topics.topic("evt", "info", "file-delivered", instance="a")
        )
    ]
    assert events[-1]["resumedFrom"] >= recorded > 0
    assert events[-1]["bytesSent"] < len(data)


def test_a_global_change_restarts_every_instance(adapters: AdapterHarness, tmp_path: Path):
    a, b = instance(tmp_path, "a"), instance(tmp_path, "b")
    adapter = start(adapters, tmp_path, a, b)
    document = copy.deepcopy(adapter.document)
    document["component"]["global"]["bandwidthBytesPerSec"] = 64 * MIB
    outcome = adapter.reload(document)
    assert outcome == {"started": ["a", "b"], "stopped": [], "kept": [], "skipped": []}
    write_file(tmp_path / "a" / "src" / "x.bin", 1000)
    wait_until(lambda: delivered(adapter, "a") == 1, 20, "delivery after the restart")


@pytest.mark.parametrize(
    ("change", "path"),
    [
        # The schema refuses it before the component sees it.
        (lambda d: d["egress"][0].update(maxConcurrentFiles=0), "maxConcurrentFiles"),
        # The component's rules refuse it.
        (lambda d: d["egress"].append(dict(d["egress"][0])), "duplicate egress id"),
    ],
)
def test_a_bad_candidate_is_refused_whole_and_the_running_one_kept(
    adapters: AdapterHarness, tmp_path: Path, change, path: str
):
    a = instance(tmp_path, "a")
    adapter = start(adapters, tmp_path, a)
    document = copy.deepcopy(adapter.document)
    candidate = copy.deepcopy(a)
    change(candidate)
    document["component"]["instances"] = [candidate, instance(tmp_path, "new")]
    with pytest.raises(CommandError, match="BAD_ARGS") as refused:
        adapter.reload(document)
    assert path in str(refused.value)
    with pytest.raises(CommandError, match="NO_SUCH_INSTANCE"):
        adapter.client.call("status", instance="new")
    data = write_file(tmp_path / "a" / "src" / "x.bin", 1000)
    wait_until(lambda: delivered(adapter, "a") == 1, 20, "the running instance delivering")
    assert (tmp_path / "a" / "out" / "x.bin").read_bytes() == data


def test_the_state_directory_applies_only_at_restart(adapters: AdapterHarness, tmp_path: Path):
    adapter = start(adapters, tmp_path, instance(tmp_path, "a"))
    document = copy.deepcopy(adapter.document)
    document["component"]["global"]["stateDir"] = str(tmp_path / "elsewhere")
    with pytest.raises(CommandError, match=r"stateDir: applies only at restart"):
        adapter.reload(document)
    assert adapter.client.call("status", instance="a")["paused"] is False
