"""JPEG thumbnails of raw frames or JPEG bytes, by size name, over the Rust core.

Sizes bound the long edge: small 160, medium 320, large 640 pixels; the aspect ratio is
kept, the downscale is an exact area average, and a frame already that small is not enlarged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unskit._core import image as _image
from unskit.errors import ImageError

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "DEFAULT_QUALITY",
    "THUMBNAIL_SIZES",
    "Thumbnail",
    "make_thumbnail",
    "thumbnail_from_jpeg",
]

DEFAULT_QUALITY: int = _image.DEFAULT_QUALITY
# Size name -> long edge in pixels.
THUMBNAIL_SIZES: dict[str, int] = dict(_image.THUMBNAIL_LONG_EDGES)
_ORDERS = ("gray", "rgb", "bgr")


@dataclass(frozen=True)
class Thumbnail:
    """An encoded thumbnail and its dimensions."""

    data: bytes
    width: int
    height: int
    encoding: str = "jpeg"

    def to_body(self) -> dict[str, Any]:
        """The announcement's thumbnail object: encoding, width, height, bytes, data."""
        return {
            "encoding": self.encoding,
            "width": self.width,
            "height": self.height,
            "bytes": len(self.data),
            "data": self.data,
        }


def make_thumbnail(
    frame: Buffer,
    size: str = "small",
    *,
    width: int | None = None,
    height: int | None = None,
    order: str | None = None,
    quality: int = DEFAULT_QUALITY,
) -> Thumbnail:
    """A JPEG thumbnail of an 8-bit frame (H x W x 3 or H x W, or flat with width/height)."""
    view = memoryview(frame)
    shape = view.shape or ()
    if view.itemsize != 1:
        raise ImageError(f"frames are 8-bit; this one has {view.itemsize}-byte items")
    if view.ndim == 3:
        rows, cols, channels = shape
    elif view.ndim == 2:
        (rows, cols), channels = shape, 1
    elif view.ndim == 1:
        if width is None or height is None:
            raise ImageError("a flat buffer needs width= and height=")
        rows, cols = height, width
        channels = 1 if order == "gray" else 3 if order else _channels_of(view.nbytes, cols, rows)
    else:
        raise ImageError(f"a frame has 1 to 3 dimensions, not {view.ndim}")
    if (width is not None and width != cols) or (height is not None and height != rows):
        raise ImageError(f"width/height {width}x{height} disagree with the {cols}x{rows} frame")
    if rows <= 0 or cols <= 0:
        raise ImageError(f"a {cols}x{rows} frame has no pixels")
    if order is None:
        order = "gray" if channels == 1 else "bgr"
    if order not in _ORDERS:
        raise ImageError(f"unknown pixel order {order!r} (gray, rgb or bgr)")
    if channels != (1 if order == "gray" else 3):
        raise ImageError(f"{channels} channel(s) do not fit pixel order {order!r}")
    # A strided view (a crop of a larger array) is made contiguous once, in C order.
    pixels: Buffer = view if view.c_contiguous else view.tobytes()
    data, out_width, out_height = _image.thumbnail(pixels, cols, rows, order, size, quality)
    return Thumbnail(data, out_width, out_height)


def thumbnail_from_jpeg(
    data: Buffer, size: str = "small", *, quality: int = DEFAULT_QUALITY
) -> Thumbnail:
    """A JPEG thumbnail of JPEG bytes; ImageError when they do not decode."""
    jpeg, width, height = _image.thumbnail_from_jpeg(data, size, quality)
    return Thumbnail(jpeg, width, height)


def _channels_of(nbytes: int, width: int, height: int) -> int:
    if nbytes == width * height:
        return 1
    if nbytes == width * height * 3:
        return 3
    raise ImageError(f"{nbytes} bytes hold neither a gray nor a 3-channel {width}x{height} frame")
