"""Free-form JSON in request bodies is bounded by depth and size so that every reply that can
carry it stays inside the envelope: every such field of every component, at its bound and
one past it, on real Mosquitto with the real components (camera sim backend, ethernet-ip
against cpppo's Logix simulator)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, Rig, sim
from tests.commands.conftest import sample_document
from tests.commands.sample_component import SampleComponent
from tests.support.adapter import AdapterHarness
from tests.support.cpppo import LogixSimulator
from tests.support.mosquitto import Mosquitto
from tests.support.servers import root_logging_restored, wait_until
from unskit.cip.component import EthernetIpAdapter
from unskit.commands import MAX_FREE_FORM_DEPTH, CommandClient
from unskit.commands.fields import json_depth
from unskit.egress.component import FileEgress
from unskit.envelope import MAX_VALUE_DEPTH
from unskit.errors import CommandError


def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def nested(depth: int, leaf: Any = "leaf") -> Any:
    """An object nesting `depth` levels (0: the leaf itself)."""
    value = leaf
    for level in range(depth):
        value = {f"k{level}": value}
    return value


@dataclass
class Fleet:
    """One running component of every kind that has verbs."""

    clients: dict[str, CommandClient]
    camera: Rig


@dataclass(frozen=True)
class Case:
    """A free-form field of a verb: its depth bound, a request at the bound and one past."""

    component: str
    verb: str
    field: str
    bound: int
    at_bound: Callable[[], dict[str, Any]]
    past: Callable[[], dict[str, Any]]
    instance: str | None = None

    @property
    def id(self) -> str:
        return f"{self.component}:{self.verb}.{self.field}"


def _capture(metadata: Any) -> dict[str, Any]:
    return {"requestId": rid(), "metadata": metadata}


def _group(**fields: Any) -> dict[str, Any]:
    return {"requestId": rid(), "instances": ["cam-1", "cam-2"], **fields}


def _write(value: Any) -> dict[str, Any]:
    return {"requestId": rid(), "signal": "Counts", "value": value}


M = MAX_FREE_FORM_DEPTH
#: Every verb with a free-form field, as describe lists them (checked below).
CASES = [
    *(
        Case(
            "camera-adapter",
            verb,
            "metadata",
            M,
            lambda: _capture(nested(M)),
            lambda: _capture(nested(M + 1)),
            "cam-1",
        )
        for verb in ("capture", "capture-submit")
    ),
    *(
        Case(
            "camera-adapter",
            verb,
            "metadata",
            M,
            lambda: _group(metadata=nested(M)),
            lambda: _group(metadata=nested(M + 1)),
        )
        for verb in ("capture-group", "capture-group-submit")
    ),
    # A map of camera to profile name: flat.
    *(
        Case(
            "camera-adapter",
            verb,
            "profileOverrides",
            1,
            lambda: _group(profileOverrides={"cam-1": "thumb"}),
            lambda: _group(profileOverrides={"cam-1": {"name": "thumb"}}),
        )
        for verb in ("capture-group", "capture-group-submit")
    ),
    # A scalar or a flat array.
    Case(
        "ethernet-ip-adapter",
        "write",
        "value",
        1,
        lambda: _write(list(range(10))),
        lambda: _write([list(range(10))]),
        "plc-1",
    ),
    # Signal id to a scalar or a flat array.
    Case(
        "ethernet-ip-adapter",
        "write",
        "values",
        2,
        lambda: {"requestId": rid(), "values": {"Counts": list(range(10))}},
        lambda: {"requestId": rid(), "values": {"Counts": [list(range(10))]}},
        "plc-1",
    ),
    Case(
        "sample",
        "set-point",
        "metadata",
        M,
        lambda: {"requestId": rid(), "value": 1, "metadata": nested(M)},
        lambda: {"requestId": rid(), "value": 1, "metadata": nested(M + 1)},
        "cam-1",
    ),
]


@pytest.fixture(scope="module")
def fleet(broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with root_logging_restored():
        folder = tmp_path_factory.mktemp("fleet")
        logix = LogixSimulator(("Counts=DINT[10]",), folder / "cpppo").start()
        for name in ("camera", "adapters"):
            (folder / name).mkdir()
        cameras = CameraHarness(broker, folder / "camera")
        adapters = AdapterHarness(broker, folder / "adapters")
        try:
            camera = cameras.start(
                {
                    "cameras": [sim("cam-1"), sim("cam-2")],
                    "captureProfiles": {"thumb": {"quality": 80}},
                }
            )
            plc = {
                "instances": [
                    {
                        "id": "plc-1",
                        "connection": {"endpoint": logix.endpoint},
                        "pollGroups": [
                            {
                                "id": "fast",
                                "pollIntervalMs": 200,
                                "signals": [
                                    {
                                        "name": "counts",
                                        "tagPath": "Counts",
                                        "type": "DINT",
                                        "arrayCount": 10,
                                    }
                                ],
                            }
                        ],
                        "writes": {"allow": ["Counts"]},
                    }
                ]
            }
            cip = adapters.start(EthernetIpAdapter, adapters.document(plc))
            wait_until(
                lambda: cip.client.call("status", instance="plc-1")["connected"],
                20,
                "plc-1 to connect",
            )
            egress = {
                "global": {"stateDir": str(folder / "egress-state")},
                "instances": [
                    {
                        "id": "line-1",
                        "source": {"path": str(folder / "src")},
                        "egress": [{"type": "local", "path": str(folder / "out")}],
                    }
                ],
            }
            files = adapters.start(FileEgress, adapters.document(egress))  # type: ignore[arg-type]
            document = sample_document(broker.plain_port, folder / "sample-state", ["cam-1"])
            sample = adapters.start(SampleComponent, document)  # type: ignore[arg-type]
            yield Fleet(
                {
                    "camera-adapter": camera.client,
                    "ethernet-ip-adapter": cip.client,
                    "file-egress": files.client,
                    "sample": sample.client,
                },
                camera,
            )
        finally:
            adapters.close()
            cameras.close()
            logix.stop()


def free_form_fields(client: CommandClient) -> set[tuple[str, str, int]]:
    """(verb, field, maxDepth) of every free-form field the component's describe lists."""
    found = set()
    for verb in client.call("describe", timeout=10)["verbs"]:
        for name, field in verb["fields"].items():
            if field.get("freeForm"):
                found.add((verb["verb"].removeprefix("sb/"), name, field["maxDepth"]))
    return found


@pytest.mark.parametrize(
    "component", ["camera-adapter", "ethernet-ip-adapter", "file-egress", "sample"]
)
def test_the_cases_are_every_free_form_field_describe_lists(fleet: Fleet, component: str) -> None:
    listed = free_form_fields(fleet.clients[component])
    expected = {(c.verb, c.field, c.bound) for c in CASES if c.component == component}
    assert listed == expected


def call(fleet: Fleet, case: Case, body: dict[str, Any]) -> dict[str, Any]:
    return fleet.clients[case.component].call(case.verb, body, instance=case.instance, timeout=30)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_one_past_the_bound_is_bad_args_naming_the_field(fleet: Fleet, case: Case) -> None:
    body = case.past()
    assert json_depth(body[case.field]) == case.bound + 1
    with pytest.raises(CommandError) as raised:
        call(fleet, case, body)
    assert raised.value.code == "BAD_ARGS"
    assert raised.value.message.startswith(case.field), raised.value.message


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_at_the_bound_is_accepted_and_answered(fleet: Fleet, case: Case) -> None:
    body = case.at_bound()
    assert json_depth(body[case.field]) == case.bound
    reply = call(fleet, case, body)
    assert json_depth(reply) <= MAX_VALUE_DEPTH
    if case.component == "camera-adapter":
        check_camera_replies(fleet.camera, case, body, reply)
    elif case.component == "ethernet-ip-adapter":
        assert reply[case.field] == body[case.field]
    else:
        assert reply["execution"] >= 1


def check_camera_replies(rig: Rig, case: Case, body: dict[str, Any], reply: dict[str, Any]) -> None:
    """Every reply that embeds the capture's metadata is answered and carries it intact."""
    metadata = body.get("metadata", {})
    if case.verb.startswith("capture-group"):
        group_id = reply["captureGroupId"]
        if case.verb == "capture-group":
            assert [m["metadata"] for m in reply["members"]] == [metadata, metadata]
        wait_until(
            lambda: rig.call("capture-status", {"captureGroupId": group_id})["group"]["result"],
            20,
            "the group to finish",
        )
        # The deepest reply that embeds metadata: group -> result -> members -> body.
        page = rig.call("capture-status", {"captureGroupId": group_id})
        for member in page["group"]["result"]["members"]:
            assert member["metadata"] == metadata
        for job in page["members"]:
            assert job["result"]["metadata"] == metadata
        if metadata:
            assert json_depth(page) == json_depth(metadata) + 5
        by_request = rig.call("capture-status", {"requestId": body["requestId"]})
        assert by_request == page
        capture_ids = [job["captureId"] for job in page["members"]]
    else:
        capture_id = reply["captureId"]
        job = rig.terminal(capture_id)
        assert job["result"]["metadata"] == metadata
        found = rig.call("capture-status", {"requestId": body["requestId"]}, case.instance)
        assert found == job
        capture_ids = [capture_id]
    listed = rig.call("capture-status", {"states": ["SUCCEEDED"], "limit": 1000})
    jobs = {job["captureId"]: job for job in listed["jobs"]}
    while listed["nextCursor"]:
        listed = rig.call(
            "capture-status",
            {"states": ["SUCCEEDED"], "limit": 1000, "cursor": listed["nextCursor"]},
        )
        jobs.update((job["captureId"], job) for job in listed["jobs"])
    for capture_id in capture_ids:
        assert jobs[capture_id]["result"]["metadata"] == metadata
        assert rig.announced(capture_id)[1].body["metadata"] == metadata


def test_the_issue_reproduction_31_levels_of_metadata_is_refused(fleet: Fleet) -> None:
    # 31 levels fit the envelope (the body is one more) but not the status reply (two more);
    # the inbox's body bound refuses them first, naming the field.
    body = _capture(nested(31))
    with pytest.raises(CommandError) as raised:
        fleet.camera.call("capture-submit", body, "cam-1")
    assert raised.value.code == "BAD_ARGS"
    assert raised.value.message == (
        "metadata nests 31 levels, so the body 32; the bound is 20 (commands.maxBodyDepth)"
    )
    assert fleet.camera.call("capture-status", {"states": ["ACCEPTED", "QUEUED"]})["jobs"] == []


def test_binary_metadata_is_bad_args_naming_where(fleet: Fleet) -> None:
    # The envelope carries bytes; metadata is JSON and is copied into JSON sidecars.
    with pytest.raises(CommandError) as raised:
        fleet.camera.call("capture-submit", _capture({"blob": b"\x00\x01"}), "cam-1")
    assert raised.value.code == "BAD_ARGS"
    assert raised.value.message.startswith("metadata.blob must be JSON")
