"""The `objectstore` backend against moto_server: single PUT and multipart, resume from the
recorded parts, a corrupted part sent again, a store that is down, both checksums."""

from __future__ import annotations

import base64
import hashlib

import crc32c
import pytest

from tests.egress.conftest import MIB, Harness, write_file
from tests.support.moto import MotoServer
from tests.support.servers import free_port, wait_until
from unskit.egress.backends.objectstore import object_key
from unskit.egress.verify import Algorithm, b64, composite, new_digest

PART = 5 * MIB


def body(moto: MotoServer, bucket: str, key: str) -> bytes:
    return moto.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def test_small_and_multipart_files_arrive_verified(harness: Harness, moto, bucket):
    small = write_file(harness.source / "s.csv", 1000)
    big = write_file(harness.source / "d" / "big.bin", 12 * MIB + 7)
    destination = moto.destination(
        bucket, prefix="plant/line-1", multipart={"thresholdBytes": PART, "partSizeBytes": PART}
    )
    _, events = harness.start([destination])
    wait_until(lambda: len(events.of("file-completed")) == 2, 60, "both files")
    assert body(moto, bucket, "plant/line-1/s.csv") == small
    assert body(moto, bucket, "plant/line-1/d/big.bin") == big
    head = moto.client().head_object(
        Bucket=bucket, Key="plant/line-1/d/big.bin", ChecksumMode="ENABLED"
    )
    parts = [big[i : i + PART] for i in range(0, len(big), PART)]
    expected = composite(Algorithm.CRC32C, (crc32c.crc32c(p).to_bytes(4, "big") for p in parts))
    assert head["ChecksumCRC32C"].split("-")[0] == b64(expected)
    assert head["ETag"].strip('"').endswith("-3")
    delivered = {d["file"]: d for d in events.of("file-delivered")}
    assert delivered["d/big.bin"]["parts"] == 3
    assert not moto.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_sha256_checksums(harness: Harness, moto, bucket):
    data = write_file(harness.source / "x.bin", 6 * MIB)
    destination = moto.destination(
        bucket,
        checksumAlgorithm="SHA256",
        multipart={"thresholdBytes": PART, "partSizeBytes": PART},
    )
    _, events = harness.start([destination])
    wait_until(lambda: events.of("file-completed"), 60, "the file")
    head = moto.client().head_object(Bucket=bucket, Key="x.bin", ChecksumMode="ENABLED")
    parts = [hashlib.sha256(data[i : i + PART]).digest() for i in range(0, len(data), PART)]
    assert head["ChecksumSHA256"].split("-")[0] == b64(hashlib.sha256(b"".join(parts)).digest())


def test_a_restart_resumes_from_the_recorded_parts(harness: Harness, moto, bucket):
    data = write_file(harness.source / "r.bin", 30 * MIB)
    destination = moto.destination(
        bucket,
        bandwidthBytesPerSec=10 * MIB,
        multipart={"thresholdBytes": PART, "partSizeBytes": PART, "maxConcurrentParts": 2},
    )
    first, _ = harness.start([destination])
    state = first.state
    wait_until(lambda: len(state.parts(1, "objectstore-1")) >= 2, 30, "two recorded parts")
    first.stop()
    recorded = state.parts(1, "objectstore-1")
    assert 2 <= len(recorded) < 6
    _, events = harness.start([moto.destination(bucket, multipart=destination["multipart"])])
    wait_until(lambda: events.of("file-completed"), 60, "completion after the restart")
    delivered = events.of("file-delivered")[0]
    assert delivered["partsResumed"] == len(recorded)
    assert delivered["resumedFrom"] == sum(p.size for p in recorded.values())
    assert delivered["bytesSent"] == len(data) - delivered["resumedFrom"]
    assert body(moto, bucket, "r.bin") == data


def test_a_corrupted_part_is_detected_and_sent_again(harness: Harness, moto, bucket):
    data = write_file(harness.source / "c.bin", 30 * MIB)
    destination = moto.destination(
        bucket,
        bandwidthBytesPerSec=10 * MIB,
        multipart={"thresholdBytes": PART, "partSizeBytes": PART, "maxConcurrentParts": 1},
    )
    pipeline, events = harness.start([destination])
    instance = pipeline.instances["line-1"]
    wait_until(lambda: len(instance.state.parts(1, "objectstore-1")) >= 2, 30, "two parts")
    instance.pause()
    wait_until(lambda: instance.workers[0].current is None, 30, "the transfer to stop")
    recorded = instance.state.parts(1, "objectstore-1")
    s3 = moto.client()
    upload = s3.list_multipart_uploads(Bucket=bucket)["Uploads"][0]
    flipped = bytes(b ^ 0xFF for b in data[:PART])
    s3.upload_part(
        Bucket=bucket, Key="c.bin", UploadId=upload["UploadId"], PartNumber=1, Body=flipped
    )
    instance.resume()
    wait_until(lambda: events.of("file-completed"), 60, "completion")
    delivered = events.of("file-delivered")[0]
    # Every recorded part but the corrupted one was kept.
    assert delivered["partsResumed"] == len(recorded) - 1
    assert body(moto, bucket, "c.bin") == data


def test_a_store_that_is_down_holds_only_its_own_delivery(harness: Harness, moto, tmp_path):
    data = write_file(harness.source / "f.bin", 2 * MIB)
    later = MotoServer(tmp_path / "later.log", port=free_port())
    out = tmp_path / "out"
    _, events = harness.start(
        [{"type": "local", "path": str(out)}, later.destination("late-bucket")]
    )
    wait_until(lambda: events.of("file-delivered"), 30, "the local delivery")
    wait_until(lambda: len(events.of("delivery-retry")) >= 2, 30, "retries of the store")
    assert (out / "f.bin").read_bytes() == data
    assert (harness.source / "f.bin").exists()
    later.start()
    try:
        later.client().create_bucket(Bucket="late-bucket")
        wait_until(lambda: events.of("file-completed"), 60, "completion once the store is up")
        assert body(later, "late-bucket", "f.bin") == data
    finally:
        later.stop()
    assert [d["destination"] for d in events.of("file-delivered")] == [
        "local-1",
        "objectstore-2",
    ]


def test_object_keys_join_the_prefix_and_refuse_escapes():
    from pathlib import PurePosixPath

    assert object_key("", PurePosixPath("a/b.csv")) == "a/b.csv"
    assert object_key("in", PurePosixPath("a/b.csv")) == "in/a/b.csv"
    assert object_key("in/", PurePosixPath("a/b.csv")) == "in/a/b.csv"
    with pytest.raises(ValueError, match="plain relative path"):
        object_key("in", PurePosixPath("../b.csv"))


def test_the_one_digest_function_matches_known_values():
    crc = new_digest("CRC32C")
    crc.update(b"hello")
    assert base64.b64encode(crc.digest()).decode() == "mnG7TA=="
    check = new_digest(Algorithm.CRC32C)
    check.update(b"123456789")
    assert check.digest() == bytes.fromhex("e3069283")
    sha = new_digest("SHA256")
    sha.update(b"abc")
    assert sha.digest() == hashlib.sha256(b"abc").digest()


def test_an_upload_completed_before_a_crash_is_verified_not_sent_again(
    harness: Harness, moto, bucket, tmp_path
):
    from unskit.egress.state import EgressState, Part

    data = write_file(harness.source / "m.bin", 12 * MIB)
    s3 = moto.client()
    upload = s3.create_multipart_upload(Bucket=bucket, Key="m.bin", ChecksumAlgorithm="CRC32C")
    parts = []
    for number, start in enumerate(range(0, len(data), PART), 1):
        chunk = data[start : start + PART]
        checksum = crc32c.crc32c(chunk).to_bytes(4, "big")
        reply = s3.upload_part(
            Bucket=bucket,
            Key="m.bin",
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=chunk,
            ChecksumCRC32C=b64(checksum),
        )
        parts.append(Part(number, reply["ETag"], checksum, len(chunk)))
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="m.bin",
        UploadId=upload["UploadId"],
        MultipartUpload={
            "Parts": [
                {"PartNumber": p.number, "ETag": p.etag, "ChecksumCRC32C": b64(p.checksum)}
                for p in parts
            ]
        },
    )
    st = (harness.source / "m.bin").stat()
    state = EgressState(tmp_path / "state" / "egress.sqlite3")
    file_id = state.add_file("line-1", "m.bin", st.st_size, st.st_mtime_ns, ["objectstore-1"])
    state.save_upload(file_id, "objectstore-1", upload["UploadId"])
    for part in parts:
        state.save_part(file_id, "objectstore-1", part, 0)
    state.close()
    destination = moto.destination(
        bucket, multipart={"thresholdBytes": PART, "partSizeBytes": PART}
    )
    _, events = harness.start([destination])
    wait_until(lambda: events.of("file-completed"), 30, "the completion")
    delivered = events.of("file-delivered")[0]
    assert delivered["bytesSent"] == 0
    assert delivered["alreadyDelivered"] is True
    assert body(moto, bucket, "m.bin") == data
