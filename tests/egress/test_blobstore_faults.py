"""The `blobstore` backend against a misbehaving Azure endpoint (a proxy in front of Azurite):
a storm of 503s, a block acknowledged but never stored, a Put Blob stored with other bytes.
Each gives a clear error and a retry, and the file arrives whole; none is ever half-written
or lost."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.egress.test_blobstore import blob_bytes, block_lists
from tests.support.azurite import ACCOUNT, Azurite
from tests.support.blobproxy import BlobProxy
from tests.support.servers import wait_until

pytestmark = pytest.mark.integration

BLOCK = 4 * MIB
BLOCKS = {"thresholdBytes": BLOCK, "blockSizeBytes": BLOCK, "maxConcurrentBlocks": 1}


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite")).start()
    yield server
    server.stop()


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[BlobProxy]:
    server = BlobProxy(azurite.port).start()
    yield server
    server.stop()


def nth(kind: str, numbers: set[int], action: str):
    """A rule applying `action` to the requests of `kind` (a comp value) numbered `numbers`."""
    counter = itertools.count(1)
    lock = threading.Lock()

    def rule(method: str, comp: str, _body: bytes) -> str:
        if method != "PUT" or comp != kind:
            return "forward"
        with lock:
            number = next(counter)
        return action if number in numbers else "forward"

    return rule


@pytest.mark.slow
def test_a_503_storm_is_retried_and_the_upload_resumes(
    harness: Harness, azurite: Azurite, proxy: BlobProxy
):
    container = azurite.container()
    data = write_file(harness.source / "storm.bin", 3 * BLOCK)
    # Block 1 goes through; the next three requests for a block (one attempt's worth, with
    # the SDK's two quick retries) are refused as busy.
    proxy.rule = nth("block", {2, 3, 4}, "busy")
    destination = azurite.destination(
        container, id="blob", endpointUrl=proxy.url(ACCOUNT), blocks=BLOCKS
    )
    _, events = harness.start([destination])
    wait_until(lambda: events.of("file-completed"), 60, "completion after the storm")
    retries = events.of("delivery-retry")
    assert len(retries) == 1
    assert "ServerBusy (HTTP 503) The server is busy." in retries[0]["error"]
    assert "block 2" in retries[0]["error"]
    assert [a for _, c, a in proxy.log if c == "block"].count("busy") == 3
    delivered = events.of("file-delivered")[0]
    # Block 1 and, if it was already in flight when block 2 failed, block 3 were kept.
    assert delivered["blocksResumed"] in (1, 2)
    assert delivered["bytesSent"] == len(data) - delivered["blocksResumed"] * BLOCK
    assert blob_bytes(azurite, container, "storm.bin") == data
    assert block_lists(azurite, container, "storm.bin")[1] == []


def test_a_block_acknowledged_but_not_stored_is_staged_again(
    harness: Harness, azurite: Azurite, proxy: BlobProxy
):
    container = azurite.container()
    data = write_file(harness.source / "lost.bin", 3 * BLOCK)
    proxy.rule = nth("block", {2}, "drop")
    destination = azurite.destination(
        container, id="blob", endpointUrl=proxy.url(ACCOUNT), blocks=BLOCKS
    )
    _, events = harness.start([destination])
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    retries = events.of("delivery-retry")
    assert len(retries) == 1
    assert "commit" in retries[0]["error"]
    assert "InvalidBlockList (HTTP 400)" in retries[0]["error"]
    delivered = events.of("file-delivered")[0]
    # Only the block the service never stored was sent again.
    assert delivered["blocksResumed"] == 2
    assert delivered["bytesSent"] == BLOCK
    assert blob_bytes(azurite, container, "lost.bin") == data


def test_a_put_stored_with_other_bytes_fails_verification_and_is_sent_again(
    harness: Harness, azurite: Azurite, proxy: BlobProxy
):
    container = azurite.container()
    data = write_file(harness.source / "lie.csv", 5000)
    proxy.rule = nth("", {1}, "flip")
    destination = azurite.destination(container, id="blob", endpointUrl=proxy.url(ACCOUNT))
    _, events = harness.start([destination])
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    failed = events.of("verification-failed")
    assert len(failed) == 1
    assert "stored MD5" in failed[0]["error"]
    assert "differs from the source" in failed[0]["error"]
    assert [a for _, c, a in proxy.log if c == ""].count("flip") == 1
    assert blob_bytes(azurite, container, "lie.csv") == data
    assert len(events.of("file-delivered")) == 1
