"""write_hashed: the file on disk, its size and digests, in one pass."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from unskit import WrittenFile, write_hashed
from unskit._reference import digests as ref
from unskit.digests import crc32c_base64


def payload(size: int) -> bytes:
    return np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("size", [0, 10, 256 * 1024, 5 * 1024 * 1024 + 3])
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "numpy"])
def test_file_and_digests_match_hashlib(tmp_path, size, kind):
    data = payload(size)
    buffer = {"bytes": data, "bytearray": bytearray(data), "numpy": np.frombuffer(data, np.uint8)}
    path = tmp_path / "image.bin"
    written = write_hashed(path, buffer[kind], algorithms=("sha256", "crc32c"))
    on_disk = path.read_bytes()
    assert on_disk == data
    assert written == WrittenFile(path, size, hashlib.sha256(on_disk).digest(), written.crc32c)
    assert written.sha256_hex == hashlib.sha256(on_disk).hexdigest()
    if size <= 256 * 1024:
        assert written.crc32c == ref.crc32c(on_disk)
    assert written.crc32c_base64 == crc32c_base64(written.crc32c or 0)


def test_only_the_asked_digests_and_fsync(tmp_path):
    path = tmp_path / "a.bin"
    written = write_hashed(str(path), b"123456789", fsync=True, algorithms=["crc32c"])
    assert (written.size, written.sha256, written.crc32c) == (9, None, 0xE3069283)
    assert written.crc32c_base64 == "4waSgw=="
    assert written.sha256_hex is None
    default = write_hashed(path, b"abc")
    assert default.crc32c is None
    assert default.sha256_hex == hashlib.sha256(b"abc").hexdigest()


def test_truncates_an_existing_file(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 1000)
    write_hashed(path, b"short")
    assert path.read_bytes() == b"short"


def test_unknown_algorithm_is_refused_before_writing(tmp_path):
    path = tmp_path / "a.bin"
    with pytest.raises(ValueError, match="md5"):
        write_hashed(path, b"abc", algorithms=("md5",))
    assert not path.exists()


def test_io_errors_are_os_errors_naming_the_file(tmp_path):
    missing = tmp_path / "no-such-dir" / "a.bin"
    with pytest.raises(FileNotFoundError) as caught:
        write_hashed(missing, b"abc")
    assert caught.value.filename == str(missing)
    with pytest.raises(IsADirectoryError):
        write_hashed(tmp_path, b"abc")
