"""Image kernels: ours (Rust, through unskit) beside the usual Python tools, same run.

SHA-256 against hashlib (OpenSSL), CRC32C against the `crc32c` package (C, SSE4.2),
thumbnails against OpenCV (INTER_AREA resize + libjpeg-turbo), write-and-hash against a
Python loop of file writes and hashlib updates."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import cv2
import numpy as np
import pytest

from benches.interleaved import compare
from unskit import Crc32c, Sha256, make_thumbnail, thumbnail_from_jpeg, write_hashed

MIB = 1024 * 1024
CHUNK = MIB
TARGETS = {
    "sha256": 0.95,
    "sha256_file": 0.95,
    "crc32c": 0.9,
    "thumbnail_raw": 1.0,
    "thumbnail_jpeg": 1.0,
}
QUALITY = 80
DATA = {
    "1MiB": np.random.default_rng(1).integers(0, 256, MIB, dtype=np.uint8).tobytes(),
    "64MiB": np.random.default_rng(2).integers(0, 256, 64 * MIB, dtype=np.uint8).tobytes(),
}


def camera_frame() -> np.ndarray:
    """A 1920x1080 BGR frame with a photo's mix of smooth areas, edges and grain."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:1080, 0:1920]
    base = np.stack([x * 255 // 1920, y * 255 // 1080, (x + y) * 255 // 3000], axis=-1)
    blobs = cv2.GaussianBlur(rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8), (31, 31), 8)
    grain = rng.integers(-6, 7, (1080, 1920, 3))
    return np.clip(base // 2 + blobs // 2 + grain, 0, 255).astype(np.uint8)


FRAME = camera_frame()
FRAME_JPEG = cv2.imencode(".jpg", FRAME, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
THUMB_WIDTH, THUMB_HEIGHT = 320, 180


def cv2_thumbnail(frame: np.ndarray) -> bytes:
    small = cv2.resize(frame, (THUMB_WIDTH, THUMB_HEIGHT), interpolation=cv2.INTER_AREA)
    return cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, QUALITY])[1].tobytes()


def cv2_thumbnail_from_jpeg(jpeg: bytes) -> bytes:
    reduced = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_REDUCED_COLOR_4)
    return cv2_thumbnail(reduced)


def hash_file(path: Path, make: Callable[[], Any]) -> bytes:
    hasher = make()
    with path.open("rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    return bytes(hasher.digest())


def python_write_and_hash(path: Path, data: bytes) -> bytes:
    hasher = hashlib.sha256()
    view = memoryview(data)
    with path.open("wb", buffering=0) as f:
        for start in range(0, len(view), CHUNK):
            piece = view[start : start + CHUNK]
            hasher.update(piece)
            f.write(piece)
    return hasher.digest()


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("bench-image") / "64MiB.bin"
    path.write_bytes(DATA["64MiB"])
    yield path
    path.unlink()


def record(
    ratio: Callable[..., dict[str, Any]],
    key: str,
    ops: tuple[float, float],
    anchor: str,
    target: float | None,
    **extra: Any,
) -> None:
    row = ratio(f"image.{key}", ops[0], anchor, ops[1], target=target, **extra)
    print(f"\n{row['name']}: ours/anchor = {row['ratio']}x (target {target})")


@pytest.mark.parametrize("size", list(DATA))
def test_sha256(benchmark, ratio, size: str) -> None:
    data = DATA[size]
    benchmark.group = f"image sha256 {size}"
    assert Sha256(data).digest() == hashlib.sha256(data).digest()
    ops = compare(
        benchmark,
        lambda: Sha256(data).digest(),
        lambda: hashlib.sha256(data).digest(),
        len(data) / 1.5e9,
    )
    record(ratio, f"sha256.{size}", ops, "hashlib", TARGETS["sha256"])


def test_sha256_file(benchmark, ratio, big_file: Path) -> None:
    benchmark.group = "image sha256 64MiB file in 1MiB reads"
    assert hash_file(big_file, Sha256) == hashlib.sha256(DATA["64MiB"]).digest()
    ops = compare(
        benchmark,
        lambda: hash_file(big_file, Sha256),
        lambda: hash_file(big_file, hashlib.sha256),
        0.05,
    )
    record(ratio, "sha256.file_64MiB", ops, "hashlib", TARGETS["sha256_file"])


@pytest.mark.parametrize("size", list(DATA))
def test_crc32c(benchmark, ratio, size: str) -> None:
    data = DATA[size]
    benchmark.group = f"image crc32c {size}"
    assert Crc32c(data).value == crc32c.crc32c(data)
    ops = compare(
        benchmark, lambda: Crc32c(data).value, lambda: crc32c.crc32c(data), len(data) / 8e9
    )
    record(ratio, f"crc32c.{size}", ops, "crc32c (PyPI)", TARGETS["crc32c"])


def test_write_and_hash(benchmark, ratio, tmp_path: Path) -> None:
    data = DATA["64MiB"][: 16 * MIB]
    ours_path, anchor_path = tmp_path / "ours.bin", tmp_path / "anchor.bin"
    benchmark.group = "image write+sha256 16MiB"
    assert write_hashed(ours_path, data).sha256 == python_write_and_hash(anchor_path, data)
    ops = compare(
        benchmark,
        lambda: write_hashed(ours_path, data),
        lambda: python_write_and_hash(anchor_path, data),
        0.02,
    )
    record(ratio, "write_hashed.16MiB", ops, "file writes + hashlib", None)


def test_thumbnail_raw(benchmark, ratio) -> None:
    benchmark.group = "image thumbnail 1920x1080 raw -> 320x180 JPEG q80"
    thumb = make_thumbnail(FRAME, "medium", quality=QUALITY)
    assert (thumb.width, thumb.height) == (THUMB_WIDTH, THUMB_HEIGHT)
    theirs = cv2_thumbnail(FRAME)
    ops = compare(
        benchmark,
        lambda: make_thumbnail(FRAME, "medium", quality=QUALITY),
        lambda: cv2_thumbnail(FRAME),
        0.002,
    )
    record(
        ratio,
        "thumbnail.raw_1080p_medium",
        ops,
        "cv2.resize(INTER_AREA)+imencode",
        TARGETS["thumbnail_raw"],
        ours_bytes=len(thumb.data),
        anchor_bytes=len(theirs),
    )
    assert abs(len(thumb.data) - len(theirs)) <= 0.1 * len(theirs), (len(thumb.data), len(theirs))


def test_thumbnail_from_jpeg(benchmark, ratio) -> None:
    benchmark.group = "image thumbnail from 1920x1080 JPEG -> 320x180 JPEG q80"
    assert thumbnail_from_jpeg(FRAME_JPEG, "medium").width == THUMB_WIDTH
    ops = compare(
        benchmark,
        lambda: thumbnail_from_jpeg(FRAME_JPEG, "medium", quality=QUALITY),
        lambda: cv2_thumbnail_from_jpeg(FRAME_JPEG),
        0.004,
    )
    record(
        ratio,
        "thumbnail.jpeg_1080p_medium",
        ops,
        "cv2.imdecode(REDUCED_COLOR_4)+resize+imencode",
        TARGETS["thumbnail_jpeg"],
    )
