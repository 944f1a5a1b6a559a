from os import PathLike
from typing import final

from typing_extensions import Buffer

__all__ = [
    "DEFAULT_QUALITY",
    "THUMBNAIL_LONG_EDGES",
    "Crc32c",
    "Sha256",
    "area_resize",
    "thumbnail",
    "thumbnail_from_jpeg",
    "write_hashed",
]

DEFAULT_QUALITY: int
THUMBNAIL_LONG_EDGES: dict[str, int]

@final
class Sha256:
    name: str
    digest_size: int
    def __new__(cls, data: Buffer | None = None) -> Sha256: ...
    def update(self, data: Buffer) -> None: ...
    def digest(self) -> bytes: ...
    def hexdigest(self) -> str: ...
    def copy(self) -> Sha256: ...

@final
class Crc32c:
    name: str
    digest_size: int
    def __new__(cls, data: Buffer | None = None) -> Crc32c: ...
    def update(self, data: Buffer) -> None: ...
    @property
    def value(self) -> int: ...
    def digest(self) -> bytes: ...
    def hexdigest(self) -> str: ...
    def base64(self) -> str: ...
    def copy(self) -> Crc32c: ...

def write_hashed(
    path: str | PathLike[str],
    data: Buffer,
    *,
    fsync: bool = False,
    sha256: bool = True,
    crc32c: bool = False,
) -> tuple[int, bytes | None, int | None]: ...
def area_resize(
    pixels: Buffer, width: int, height: int, channels: int, out_width: int, out_height: int
) -> bytes: ...
def thumbnail(
    pixels: Buffer,
    width: int,
    height: int,
    order: str,
    size: str,
    quality: int = 80,
) -> tuple[bytes, int, int]: ...
def thumbnail_from_jpeg(data: Buffer, size: str, quality: int = 80) -> tuple[bytes, int, int]: ...
