"""The `blobstore` backend against Azurite: one Put Blob for a small file, staged blocks in
parallel under deterministic ids for a large one, the source digest in the blob metadata,
a corrupted staged block detected and the file sent again, a store that is down, a wrong key
and a missing container (retried, the source kept), the missing extra refused at startup."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import crc32c
import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.support.azurite import ACCOUNT_KEY, Azurite
from tests.support.servers import free_port, wait_until
from unskit.config.secrets import Secret, SecretRef
from unskit.egress.verify import Algorithm, b64

# Every test here talks to Azurite.
pytestmark = pytest.mark.integration

BLOCK = 4 * MIB
BLOCKS = {"thresholdBytes": BLOCK, "blockSizeBytes": BLOCK}


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite")).start()
    yield server
    server.stop()


@pytest.fixture
def container(azurite: Azurite) -> str:
    return azurite.container()


def blob_bytes(azurite: Azurite, container: str, name: str) -> bytes:
    with azurite.service() as service:
        return bytes(service.get_blob_client(container, name).download_blob().readall())


def block_lists(azurite: Azurite, container: str, name: str) -> tuple[list[Any], list[Any]]:
    with azurite.service() as service:
        committed, uncommitted = service.get_blob_client(container, name).get_block_list("all")
        return list(committed), list(uncommitted)


def metadata(azurite: Azurite, container: str, name: str) -> dict[str, str]:
    with azurite.service() as service:
        return dict(service.get_blob_client(container, name).get_blob_properties().metadata)


def crc(data: bytes) -> str:
    return b64(crc32c.crc32c(data).to_bytes(4, "big"))


def test_small_and_staged_files_arrive_verified(harness: Harness, azurite, container):
    from unskit.egress.backends.blobstore import block_id, block_tag

    small = write_file(harness.source / "s.csv", 1000)
    big = write_file(harness.source / "d" / "big.bin", 5 * BLOCK + 7)
    st = (harness.source / "d" / "big.bin").stat()
    destination = azurite.destination(container, prefix="plant/line-1", blocks=BLOCKS)
    _, events = harness.start([destination])
    wait_until(lambda: len(events.of("file-completed")) == 2, 60, "both files")
    assert blob_bytes(azurite, container, "plant/line-1/s.csv") == small
    assert blob_bytes(azurite, container, "plant/line-1/d/big.bin") == big
    # The source digest is in the metadata of each blob.
    assert metadata(azurite, container, "plant/line-1/s.csv") == {"unskitcrc32c": crc(small)}
    assert metadata(azurite, container, "plant/line-1/d/big.bin") == {"unskitcrc32c": crc(big)}
    committed, uncommitted = block_lists(azurite, container, "plant/line-1/d/big.bin")
    tag = block_tag(st.st_size, st.st_mtime_ns, BLOCK, Algorithm.CRC32C)
    assert [b["id"] for b in committed] == [block_id(tag, n) for n in range(1, 7)]
    assert [b["size"] for b in committed] == [BLOCK] * 5 + [7]
    assert uncommitted == []
    committed, _ = block_lists(azurite, container, "plant/line-1/s.csv")
    assert committed == []  # one Put Blob, no blocks
    delivered = {d["file"]: d for d in events.of("file-delivered")}
    assert delivered["d/big.bin"]["blocks"] == 6
    assert delivered["d/big.bin"]["bytesSent"] == len(big)
    assert delivered["s.csv"]["bytesSent"] == len(small)
    assert not (harness.source / "s.csv").exists()


class RecordingJournal:
    """A Journal that notes the thread each block was recorded from."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.threads: set[str] = set()
        self.uploads: list[str | None] = []
        self.sent_total = 0
        self.lock = threading.Lock()

    def offset(self, offset: int) -> None:
        raise AssertionError("blobstore records blocks, not offsets")

    def upload(self, upload_id: str | None) -> None:
        self.uploads.append(upload_id)

    def part(self, part: Any) -> None:
        with self.lock:
            self.parts.append(part)
            self.threads.add(threading.current_thread().name)

    def forget_part(self, number: int) -> None:
        raise AssertionError("nothing was recorded before")

    def sent(self, amount: int) -> None:
        with self.lock:
            self.sent_total += amount


def transfer_of(path: Path, relative: str, journal: Any) -> Any:
    from unskit.egress.backends import Transfer
    from unskit.egress.throttle import Throttle

    st = path.stat()
    cancel = threading.Event()
    return Transfer(
        source=path,
        relative=PurePosixPath(relative),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        offset=0,
        upload_id=None,
        parts={},
        throttle=Throttle([], cancel),
        cancel=cancel,
        journal=journal,
    )


@pytest.mark.parametrize("algorithm", ["CRC32C", "SHA256"])
def test_blocks_are_staged_in_parallel_with_the_chosen_digest(
    azurite, container, tmp_path, algorithm
):
    from unskit.egress.backends import open_backend
    from unskit.egress.backends.blobstore import block_id, block_tag

    data = write_file(tmp_path / "p.bin", 8 * BLOCK)
    settings = azurite.destination(
        container,
        checksumAlgorithm=algorithm,
        blocks={**BLOCKS, "maxConcurrentBlocks": 4},
    )
    backend = open_backend(settings, None)
    journal = RecordingJournal()
    try:
        outcome = backend.deliver(transfer_of(tmp_path / "p.bin", "p.bin", journal))
    finally:
        backend.close()
    assert outcome.bytes_sent == journal.sent_total == len(data)
    # More than one staging thread recorded blocks: they went out in parallel.
    assert len(journal.threads) > 1, journal.threads
    st = (tmp_path / "p.bin").stat()
    tag = block_tag(st.st_size, st.st_mtime_ns, BLOCK, Algorithm(algorithm))
    assert journal.uploads == [tag]
    assert sorted(p.etag for p in journal.parts) == sorted(block_id(tag, n) for n in range(1, 9))
    expected = (
        hashlib.sha256(data).digest()
        if algorithm == "SHA256"
        else crc32c.crc32c(data).to_bytes(4, "big")
    )
    assert metadata(azurite, container, "p.bin") == {f"unskit{algorithm.lower()}": b64(expected)}
    assert blob_bytes(azurite, container, "p.bin") == data
    assert block_lists(azurite, container, "p.bin")[1] == []


@pytest.mark.slow
def test_a_corrupted_staged_block_is_detected_and_the_file_sent_again(
    harness: Harness, azurite, container
):
    data = write_file(harness.source / "c.bin", 6 * BLOCK)
    destination = azurite.destination(
        container,
        id="blob",
        bandwidthBytesPerSec=8 * MIB,
        blocks={**BLOCKS, "maxConcurrentBlocks": 1},
    )
    pipeline, events = harness.start([destination])
    instance = pipeline.instances["line-1"]
    wait_until(lambda: len(instance.state.parts(1, "blob")) >= 2, 30, "two recorded blocks")
    instance.pause()
    wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
    recorded = instance.state.parts(1, "blob")
    first = recorded[1]
    # Someone replaces staged block 1 with other bytes of the same size under the same id.
    with azurite.service() as service:
        blob = service.get_blob_client(container, "c.bin")
        blob.stage_block(first.etag, bytes(b ^ 0xFF for b in data[:BLOCK]))
    instance.resume()
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    failed = events.of("verification-failed")
    assert len(failed) == 1
    assert "block 1" in failed[0]["error"]
    assert "differs from the source" in failed[0]["error"]
    delivered = events.of("file-delivered")[0]
    # The resumed attempt failed verification; the next one sent the whole file again.
    assert delivered["resumedFrom"] == 0
    assert delivered["bytesSent"] == len(data)
    assert blob_bytes(azurite, container, "c.bin") == data
    assert block_lists(azurite, container, "c.bin")[1] == []


@pytest.mark.slow
def test_a_store_that_is_down_holds_only_its_own_delivery(harness: Harness, tmp_path: Path):
    data = write_file(harness.source / "f.bin", 2 * MIB)
    later = Azurite(tmp_path / "later", port=free_port())
    out = tmp_path / "out"
    _, events = harness.start(
        [{"type": "local", "path": str(out)}, later.destination("late", id="blob")]
    )
    wait_until(lambda: events.of("file-delivered"), 30, "the local delivery")
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 60, "retries of the store")
    assert (out / "f.bin").read_bytes() == data
    assert (harness.source / "f.bin").exists()
    assert not events.of("file-completed")
    later.start()
    try:
        with later.service() as service:
            service.create_container("late")
        wait_until(lambda: events.of("file-completed"), 60, "completion once the store is up")
        assert blob_bytes(later, "late", "f.bin") == data
    finally:
        later.stop()
    assert [d["destination"] for d in events.of("file-delivered")] == ["local-1", "blob"]
    assert not (harness.source / "f.bin").exists()


def test_a_wrong_key_is_retried_with_a_clear_error_and_never_logged(
    harness: Harness, azurite, container, caplog: pytest.LogCaptureFixture
):
    import base64

    wrong = base64.b64encode(b"not-the-account-key-of-this-store" * 2).decode()
    write_file(harness.source / "k.bin", 1000)
    destination = azurite.destination(container, id="blob", accountKey=wrong)
    with caplog.at_level(logging.DEBUG):
        _, events = harness.start([destination])
        wait_until(lambda: len(events.of("delivery-retry")) >= 2, 60, "two refused attempts")
    error = events.of("delivery-retry")[0]["error"]
    assert "HTTP 403" in error, error
    assert "Authorization" in error, error
    assert (harness.source / "k.bin").exists()
    assert not events.of("file-delivered")
    assert wrong not in caplog.text
    assert wrong not in str(events.items)


def test_a_missing_container_is_named_and_retried_until_it_exists(
    harness: Harness, azurite, container
):
    data = write_file(harness.source / "m.bin", 3 * BLOCK)
    destination = azurite.destination("no-such-container", id="blob", blocks=BLOCKS)
    _, events = harness.start([destination])
    wait_until(lambda: events.of("delivery-retry"), 30, "a refused attempt")
    error = events.of("delivery-retry")[0]["error"]
    assert "ContainerNotFound" in error, error
    assert "no-such-container" in error, error
    assert (harness.source / "m.bin").exists()
    with azurite.service() as service:
        service.create_container("no-such-container")
    try:
        wait_until(lambda: events.of("file-completed"), 60, "completion once it exists")
        assert blob_bytes(azurite, "no-such-container", "m.bin") == data
    finally:
        with azurite.service() as service:
            service.delete_container("no-such-container")


class Vault:
    def __init__(self, bundles: dict[str, dict[str, str]]) -> None:
        self.bundles = bundles

    def resolve(self, ref: SecretRef) -> Secret:
        from unskit.errors import SecretError

        try:
            return Secret(self.bundles[ref.name][ref.field or ""])
        except KeyError as exc:
            raise SecretError(f"{ref} is not in the vault") from exc


@pytest.mark.parametrize("field", ["accountKey", "connectionString"])
def test_a_credentials_bundle_and_no_key_in_repr_or_logs(
    azurite, container, tmp_path, field, caplog: pytest.LogCaptureFixture
):
    from unskit.egress.backends import open_backend

    value = ACCOUNT_KEY if field == "accountKey" else azurite.connection_string
    settings = azurite.destination(container)
    del settings["accountKey"]
    settings["credentials"] = {"$secret": "azure"}
    write_file(tmp_path / "v.bin", 1000)
    with caplog.at_level(logging.DEBUG):
        backend = open_backend(settings, Vault({"azure": {field: value}}))
        try:
            backend.deliver(transfer_of(tmp_path / "v.bin", "v.bin", RecordingJournal()))
            text = repr(backend) + str(backend)
        finally:
            backend.close()
    assert blob_bytes(azurite, container, "v.bin") == (tmp_path / "v.bin").read_bytes()
    assert ACCOUNT_KEY not in text
    assert ACCOUNT_KEY not in caplog.text


def test_a_plain_connection_string_gives_only_its_key(azurite, container, tmp_path):
    from unskit.egress.backends import open_backend

    settings = azurite.destination(container)
    # Only the key is taken: the endpoint in the string points nowhere and is ignored.
    settings["connectionString"] = (
        f"AccountName=other;AccountKey={settings.pop('accountKey')};"
        "BlobEndpoint=http://127.0.0.1:9/none;"
    )
    write_file(tmp_path / "w.bin", 10)
    backend = open_backend(settings, None)
    try:
        backend.deliver(transfer_of(tmp_path / "w.bin", "w.bin", RecordingJournal()))
    finally:
        backend.close()
    assert blob_bytes(azurite, container, "w.bin") == (tmp_path / "w.bin").read_bytes()


@pytest.mark.parametrize("intact", [True, False])
def test_a_blob_committed_before_a_crash_is_verified_not_sent_again(
    harness: Harness, azurite, container, tmp_path, intact: bool
):
    from azure.storage.blob import BlobBlock

    from unskit.egress.backends.blobstore import block_id, block_tag
    from unskit.egress.records import Part
    from unskit.egress.state import EgressState

    data = write_file(harness.source / "m.bin", 3 * BLOCK)
    st = (harness.source / "m.bin").stat()
    tag = block_tag(st.st_size, st.st_mtime_ns, BLOCK, Algorithm.CRC32C)
    parts = []
    with azurite.service() as service:
        blob = service.get_blob_client(container, "m.bin")
        for number in range(1, 4):
            chunk = data[(number - 1) * BLOCK : number * BLOCK]
            parts.append(
                Part(number, block_id(tag, number), crc32c.crc32c(chunk).to_bytes(4, "big"), BLOCK)
            )
            # Not intact: block 2 holds other bytes of the same size than those recorded.
            stored = chunk if intact or number != 2 else bytes(b ^ 1 for b in chunk)
            blob.stage_block(block_id(tag, number), stored)
        blob.commit_block_list(
            [BlobBlock(block_id=p.etag) for p in parts], metadata={"unskitcrc32c": crc(data)}
        )
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "m.bin", st.st_size, st.st_mtime_ns, ["blob"])
    state.save_upload(file_id, "blob", tag)
    for part in parts:
        state.save_part(file_id, "blob", part, 0)
    state.close()
    _, events = harness.start([azurite.destination(container, id="blob", blocks=BLOCKS)])
    wait_until(lambda: events.of("file-completed"), 30, "the completion")
    delivered = events.of("file-delivered")[0]
    if intact:
        assert delivered["bytesSent"] == 0
        assert delivered["alreadyDelivered"] is True
    else:
        assert delivered["bytesSent"] == len(data)
        assert "alreadyDelivered" not in delivered
    assert blob_bytes(azurite, container, "m.bin") == data


@pytest.mark.slow
def test_https_with_a_private_ca_and_a_certificate_it_does_not_trust(tmp_path, pki):
    from unskit.egress.backends import open_backend
    from unskit.errors import DestinationError

    secure = Azurite(tmp_path / "tls", tls=pki).start()
    try:
        container = secure.container()
        data = write_file(tmp_path / "t.bin", 2 * BLOCK + 3)
        backend = open_backend(secure.destination(container, blocks=BLOCKS), None)
        try:
            # Over HTTPS the blocks go without their MD5: TLS already guarantees the bytes.
            assert backend._block_md5 is False  # type: ignore[attr-defined]
            outcome = backend.deliver(transfer_of(tmp_path / "t.bin", "t.bin", RecordingJournal()))
        finally:
            backend.close()
        assert outcome.detail["blocks"] == 3
        assert blob_bytes(secure, container, "t.bin") == data
        untrusted = secure.destination(container, caPath=str(pki.other_ca))
        backend = open_backend(untrusted, None)
        try:
            with pytest.raises(DestinationError, match="CERTIFICATE_VERIFY_FAILED"):
                backend.deliver(transfer_of(tmp_path / "t.bin", "t.bin", RecordingJournal()))
        finally:
            backend.close()
    finally:
        secure.stop()


def test_discard_drops_staged_blocks_but_never_a_committed_blob(azurite, container):
    from unskit.egress.backends import open_backend

    backend = open_backend(azurite.destination(container), None)
    try:
        with azurite.service() as service:
            staged = service.get_blob_client(container, "gone.bin")
            staged.stage_block("YmxvY2stMQ==", b"x" * 1000)
            kept = service.get_blob_client(container, "kept.bin")
            kept.upload_blob(b"committed", overwrite=True)
            kept.stage_block("YmxvY2stMQ==", b"y" * 1000)
        backend.discard(PurePosixPath("gone.bin"), "tag")
        backend.discard(PurePosixPath("kept.bin"), "tag")
    finally:
        backend.close()
    with azurite.service() as service:
        names = [b.name for b in service.get_container_client(container).list_blobs()]
    assert names == ["kept.bin"]
    assert blob_bytes(azurite, container, "kept.bin") == b"committed"
    with pytest.raises(Exception, match="BlobNotFound"):
        block_lists(azurite, container, "gone.bin")
