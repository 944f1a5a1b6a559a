"""SHA-256 and CRC32C through the bindings: known vectors, every buffer type, streaming."""

from __future__ import annotations

import array
import base64
import hashlib
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unskit import Crc32c, Sha256
from unskit._reference import digests as ref

NIST = [
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (
        b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    ),
]
# Around the GIL cut-off (16 KiB) and the copy piece (256 KiB), and well past both.
SIZES = [0, 1, 16 * 1024 - 1, 16 * 1024, 256 * 1024 - 1, 256 * 1024 + 1, 3 * 1024 * 1024 + 7]


def payload(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def buffers(data: bytes) -> dict[str, object]:
    return {
        "bytes": data,
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "memoryview_of_bytearray": memoryview(bytearray(data)),
        "numpy_uint8": np.frombuffer(data, dtype=np.uint8).copy(),
        "array": array.array("B", data),
    }


@pytest.mark.parametrize(("data", "hexdigest"), NIST)
def test_sha256_nist_vectors(data, hexdigest):
    assert Sha256(data).hexdigest() == hexdigest
    assert Sha256(data).digest() == bytes.fromhex(hexdigest)


def test_sha256_million_a():
    hasher = Sha256()
    for _ in range(1000):
        hasher.update(b"a" * 1000)
    assert hasher.hexdigest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"


def test_crc32c_check_value_and_cloud_forms():
    crc = Crc32c(b"123456789")
    assert crc.value == 0xE3069283
    assert crc.digest() == bytes.fromhex("e3069283")
    assert crc.hexdigest() == "e3069283"
    assert crc.base64() == base64.b64encode(bytes.fromhex("e3069283")).decode() == "4waSgw=="
    assert Crc32c().value == 0
    assert Crc32c().base64() == "AAAAAA=="


@pytest.mark.parametrize("size", SIZES)
def test_every_buffer_type_hashes_its_bytes(size):
    data = payload(size, seed=size)
    want_sha = hashlib.sha256(data).digest()
    want_crc = ref.crc32c(data) if size <= 300_000 else None
    for kind, buffer in buffers(data).items():
        assert Sha256(buffer).digest() == want_sha, kind  # type: ignore[arg-type]
        if want_crc is not None:
            assert Crc32c(buffer).value == want_crc, kind  # type: ignore[arg-type]


def test_a_wide_numpy_array_hashes_as_its_memory():
    frame = np.arange(5000, dtype=np.uint16).reshape(50, 100)
    assert Sha256(frame).digest() == hashlib.sha256(frame.tobytes()).digest()
    assert Crc32c(frame).value == ref.crc32c(frame.tobytes())


def test_a_strided_array_is_refused_like_hashlib():
    strided = np.arange(100, dtype=np.uint8)[::2]
    with pytest.raises((BufferError, TypeError, ValueError)):
        hashlib.sha256(strided)
    with pytest.raises((BufferError, TypeError, ValueError)):
        Sha256(strided)


def test_non_buffers_are_type_errors():
    for hasher in (Sha256(), Crc32c()):
        with pytest.raises(TypeError):
            hasher.update("text")  # type: ignore[arg-type]


def test_copy_forks_the_state():
    first = Sha256(b"abc")
    second = first.copy()
    second.update(b"def")
    assert first.hexdigest() == hashlib.sha256(b"abc").hexdigest()
    assert second.hexdigest() == hashlib.sha256(b"abcdef").hexdigest()
    crc = Crc32c(b"1234")
    fork = crc.copy()
    fork.update(b"56789")
    assert (crc.value, fork.value) == (ref.crc32c(b"1234"), 0xE3069283)


def test_digest_does_not_end_the_stream():
    hasher = Sha256(b"ab")
    _ = hasher.digest()
    hasher.update(b"c")
    assert hasher.hexdigest() == NIST[1][1]


def test_other_threads_run_while_a_large_buffer_is_hashed():
    # The hash of 32 MiB runs detached: a Python thread counting meanwhile gets the GIL.
    data = payload(32 * 1024 * 1024)
    counts = []
    stop = threading.Event()

    def count():
        n = 0
        while not stop.is_set():
            n += 1
        counts.append(n)

    worker = threading.Thread(target=count)
    worker.start()
    try:
        for _ in range(3):
            Sha256(data)
    finally:
        stop.set()
        worker.join()
    assert counts[0] > 1000


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), cuts=st.lists(st.integers(0, 5000), max_size=8))
def test_streaming_in_any_split_equals_one_shot(data, cuts):
    points = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    sha, crc, ref_crc = Sha256(), Crc32c(), 0
    for i, piece in enumerate(pieces):
        buffer = (piece, bytearray(piece), memoryview(piece))[i % 3]
        sha.update(buffer)
        crc.update(buffer)
        ref_crc = ref.crc32c(piece, ref_crc)
    assert sha.digest() == ref.sha256(data) == hashlib.sha256(data).digest()
    assert crc.value == ref_crc == ref.crc32c(data)


def test_empty_buffers_of_every_shape():
    for empty in (b"", bytearray(), np.zeros((0, 3), np.uint8), np.zeros(0, np.float64)):
        assert Sha256(empty).hexdigest() == NIST[0][1]
        assert Crc32c(empty).value == 0
