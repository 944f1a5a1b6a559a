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


_measured: dict[str, dict[str, float]] = {}
_outputs: dict[str, dict[str, int]] = {}


def record(
    ratio: Callable[..., dict[str, Any]],
    benchmark: Any,
    key: str,
    impl: str,
    anchor: str,
    target: float | None,
    **extra: Any,
) -> None:
    results = _measured.setdefault(key, {})
    results[impl] = benchmark.stats.stats.ops
    if len(results) == 2:
        row = ratio(
            f"image.{key}", results["ours"], anchor, results["anchor"], target=target, **extra
        )
        print(f"\n{row['name']}: ours/anchor = {row['ratio']}x (target {target})")


def run(benchmark: Any, fn: Callable[[], Any], seconds_each: float) -> Any:
    rounds = max(5, int(1.0 / seconds_each))
    return benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("impl", ["ours", "anchor"])
@pytest.mark.parametrize("size", list(DATA))
def test_sha256(benchmark, ratio, size: str, impl: str) -> None:
    data = DATA[size]
    benchmark.group = f"image sha256 {size}"
    fn = (
        (lambda: Sha256(data).digest()) if impl == "ours" else lambda: hashlib.sha256(data).digest()
    )
    assert run(benchmark, fn, len(data) / 1.5e9) == hashlib.sha256(data).digest()
    record(ratio, benchmark, f"sha256.{size}", impl, "hashlib", TARGETS["sha256"])


@pytest.mark.parametrize("impl", ["ours", "anchor"])
def test_sha256_file(benchmark, ratio, big_file: Path, impl: str) -> None:
    benchmark.group = "image sha256 64MiB file in 1MiB reads"
    make: Callable[[], Any] = Sha256 if impl == "ours" else hashlib.sha256
    digest = run(benchmark, lambda: hash_file(big_file, make), 0.05)
    assert digest == hashlib.sha256(DATA["64MiB"]).digest()
    record(ratio, benchmark, "sha256.file_64MiB", impl, "hashlib", TARGETS["sha256_file"])


@pytest.mark.parametrize("impl", ["ours", "anchor"])
@pytest.mark.parametrize("size", list(DATA))
def test_crc32c(benchmark, ratio, size: str, impl: str) -> None:
    data = DATA[size]
    benchmark.group = f"image crc32c {size}"
    fn = (lambda: Crc32c(data).value) if impl == "ours" else lambda: crc32c.crc32c(data)
    assert run(benchmark, fn, len(data) / 8e9) == crc32c.crc32c(data)
    record(ratio, benchmark, f"crc32c.{size}", impl, "crc32c (PyPI)", TARGETS["crc32c"])


@pytest.mark.parametrize("impl", ["ours", "anchor"])
def test_write_and_hash(benchmark, ratio, tmp_path: Path, impl: str) -> None:
    data = DATA["64MiB"][: 16 * MIB]
    path = tmp_path / "out.bin"
    benchmark.group = "image write+sha256 16MiB"
    if impl == "ours":
        fn: Callable[[], Any] = lambda: write_hashed(path, data).sha256  # noqa: E731
    else:
        fn = lambda: python_write_and_hash(path, data)  # noqa: E731
    assert run(benchmark, fn, 0.02) == hashlib.sha256(data).digest()
    record(ratio, benchmark, "write_hashed.16MiB", impl, "file writes + hashlib", None)


@pytest.mark.parametrize("impl", ["ours", "anchor"])
def test_thumbnail_raw(benchmark, ratio, impl: str) -> None:
    benchmark.group = "image thumbnail 1920x1080 raw -> 320x180 JPEG q80"
    if impl == "ours":
        thumb = make_thumbnail(FRAME, "medium", quality=QUALITY)
        assert (thumb.width, thumb.height) == (THUMB_WIDTH, THUMB_HEIGHT)
        fn: Callable[[], Any] = lambda: make_thumbnail(FRAME, "medium", quality=QUALITY)  # noqa: E731
        size = len(thumb.data)
    else:
        fn = lambda: cv2_thumbnail(FRAME)  # noqa: E731
        size = len(cv2_thumbnail(FRAME))
    run(benchmark, fn, 0.002)
    _outputs.setdefault("raw", {})[impl] = size
    sizes = _outputs["raw"]
    record(
        ratio,
        benchmark,
        "thumbnail.raw_1080p_medium",
        impl,
        "cv2.resize(INTER_AREA)+imencode",
        TARGETS["thumbnail_raw"],
        ours_bytes=sizes.get("ours"),
        anchor_bytes=sizes.get("anchor"),
    )
    if len(sizes) == 2:
        assert abs(sizes["ours"] - sizes["anchor"]) <= 0.1 * sizes["anchor"], sizes


@pytest.mark.parametrize("impl", ["ours", "anchor"])
def test_thumbnail_from_jpeg(benchmark, ratio, impl: str) -> None:
    benchmark.group = "image thumbnail from 1920x1080 JPEG -> 320x180 JPEG q80"
    if impl == "ours":
        fn: Callable[[], Any] = lambda: thumbnail_from_jpeg(FRAME_JPEG, "medium", quality=QUALITY)  # noqa: E731
        assert fn().width == THUMB_WIDTH
    else:
        fn = lambda: cv2_thumbnail_from_jpeg(FRAME_JPEG)  # noqa: E731
    run(benchmark, fn, 0.004)
    record(
        ratio,
        benchmark,
        "thumbnail.jpeg_1080p_medium",
        impl,
        "cv2.imdecode(REDUCED_COLOR_4)+resize+imencode",
        TARGETS["thumbnail_jpeg"],
    )
