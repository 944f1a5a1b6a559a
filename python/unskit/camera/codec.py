"""Image encoding, thumbnails and hashed file writes: the one place the camera adapter turns
frames into bytes and bytes into files with a digest.

Full-size JPEG encode and decode go through OpenCV (libjpeg-turbo); thumbnails (area
average + JPEG) and the SHA-256 taken while a file is written run in the Rust core.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from unskit.digests import Sha256
from unskit.digests import write_hashed as _write_hashed
from unskit.thumbnails import THUMBNAIL_SIZES, Thumbnail, make_thumbnail

__all__ = [
    "THUMBNAIL_EDGES",
    "Frame",
    "Thumbnail",
    "decode_image",
    "encode_jpeg",
    "jpeg_dimensions",
    "thumbnail",
    "write_hashed",
]

Pixels = npt.NDArray[np.uint8]

#: thumbnail.size -> long edge in pixels (the aspect ratio is kept).
THUMBNAIL_EDGES = THUMBNAIL_SIZES
# Writes are hashed in chunks of this size, so a large image is never copied twice.
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Frame:
    """One decoded frame: ``pixels`` is height x width (mono8) or height x width x 3 (bgr8)."""

    pixels: Pixels
    pixel_format: str
    source_encoding: str

    @property
    def width(self) -> int:
        """Pixels per row."""
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        """Rows."""
        return int(self.pixels.shape[0])


def encode_jpeg(frame: Frame, quality: int) -> bytes:
    """The frame as a baseline JPEG of `quality` (1 to 100)."""
    ok, encoded = cv2.imencode(".jpg", frame.pixels, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError(f"the {frame.pixel_format} frame could not be encoded as JPEG")
    return bytes(encoded.tobytes())


def jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a JPEG without decoding its pixels; None when it is not one."""
    if not data.startswith(b"\xff\xd8"):
        return None
    index = 2
    while index + 9 < len(data):
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        length = int.from_bytes(data[index + 2 : index + 4], "big")
        # SOF0..SOF15 carry the frame size, except DHT (C4), JPG (C8) and DAC (CC).
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height = int.from_bytes(data[index + 5 : index + 7], "big")
            width = int.from_bytes(data[index + 7 : index + 9], "big")
            return width, height
        index += 2 + length
    return None


def decode_image(data: bytes) -> Frame:
    """An encoded image (JPEG, PNG, BMP, ...) as a bgr8 frame; ValueError if it won't decode."""
    pixels = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if pixels is None:
        raise ValueError("the data does not decode as an image")
    source = "jpeg" if jpeg_dimensions(data) is not None else "other"
    if data.startswith(b"\x89PNG"):
        source = "png"
    return Frame(np.ascontiguousarray(pixels, dtype=np.uint8), "bgr8", source)


def thumbnail(frame: Frame, size: str, quality: int = 75) -> Thumbnail:
    """A JPEG thumbnail whose long edge is THUMBNAIL_EDGES[size], area-averaged."""
    order = "gray" if frame.pixel_format == "mono8" else "bgr"
    return make_thumbnail(frame.pixels.data, size, order=order, quality=quality)


def write_hashed(path: Path, data: bytes, fsync: bool) -> str:
    """Writes `data` to a new file and returns its SHA-256 hex digest, taken in the same pass."""
    if path.exists():
        raise FileExistsError(path)  # temporary names are unique: never overwrite one
    written = _write_hashed(path, data, fsync=fsync)
    assert written.sha256_hex is not None
    return written.sha256_hex


def sha256_file(path: Path) -> str:
    """The SHA-256 hex digest of a file's content (for verification)."""
    digest = Sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
