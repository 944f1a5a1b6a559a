"""Reference SHA-256 (hashlib) and a table-driven CRC32C in pure Python."""

from __future__ import annotations

import hashlib

__all__ = ["crc32c", "sha256"]

# Castagnoli polynomial, reflected (RFC 3720, appendix B.4).
_POLY = 0x82F63B78


def _table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C of `data`, continuing from `crc` (the value of the bytes before it)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def sha256(data: bytes) -> bytes:
    """SHA-256 of `data` by hashlib (OpenSSL)."""
    return hashlib.sha256(data).digest()
