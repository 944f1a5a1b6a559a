"""Replies that embed capture metadata stay small whatever `limit` or the group size asks:
pages are cut by size, and a group's copies of its metadata are bounded."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, Rig, sim
from tests.support.tiers import server_fixture
from unskit.commands.fields import REPLY_BUDGET_BYTES, json_size
from unskit.errors import CommandError

CAMERAS = 18


def metadata_of(size: int) -> dict[str, str]:
    metadata = {"blob": "x" * (size - len('{"blob":""}'))}
    assert json_size(metadata) == size
    return metadata


@server_fixture
def rig(harness: CameraHarness) -> Rig:
    return harness.start(
        {
            "cameras": [sim(f"cam-{i}") for i in range(CAMERAS)],
            "limits": {"maxMetadataBytes": 65536, "maxCamerasPerGroup": CAMERAS},
        }
    )


def all_pages(rig: Rig, body: dict[str, Any], key: str) -> list[list[dict[str, Any]]]:
    page = rig.call("capture-status", {**body, "limit": 1000})
    got = [page[key]]
    while page["nextCursor"] is not None:
        page = rig.call("capture-status", {**body, "limit": 1000, "cursor": page["nextCursor"]})
        got.append(page[key])
    return got


def test_group_metadata_copies_and_pages_stay_within_the_budget(rig: Rig) -> None:
    # The largest metadata whose copies in 17 members fit the budget, 18 do not.
    metadata = metadata_of(REPLY_BUDGET_BYTES // (CAMERAS - 1))
    every = [f"cam-{i}" for i in range(CAMERAS)]
    with pytest.raises(CommandError) as raised:
        rig.call("capture-group", {"requestId": "all", "instances": every, "metadata": metadata})
    assert raised.value.code == "BAD_ARGS"
    assert raised.value.message.startswith("metadata encodes to")
    assert rig.call("capture-status", {"states": ["ACCEPTED", "QUEUED"]})["jobs"] == []

    request_id = f"r-{uuid.uuid4().hex[:8]}"
    members = every[: CAMERAS - 1]
    body = {"requestId": request_id, "instances": members, "metadata": metadata}
    reply = rig.call("capture-group", body)
    assert reply["state"] == "COMPLETED"
    assert [m["metadata"] for m in reply["members"]] == [metadata] * len(members)
    # A page of `limit` jobs each carrying the metadata would pass the budget: it is cut,
    # and the cursor goes on from the cut.
    for lookup, key in (
        ({"requestId": request_id}, "members"),
        ({"states": ["SUCCEEDED"]}, "jobs"),
    ):
        pages = all_pages(rig, lookup, key)
        assert len(pages) > 1
        largest = max(json_size(item) for page in pages for item in page)
        for page in pages:
            assert json_size(page) <= REPLY_BUDGET_BYTES + largest
        ids = [job["captureId"] for page in pages for job in page]
        assert ids == [m["captureId"] for m in reply["members"]]
