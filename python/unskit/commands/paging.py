"""Opaque, signed cursors serving every continuation from the snapshot the first page took."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from unskit.commands.fields import REPLY_BUDGET_BYTES, bad_args, json_size

__all__ = ["CursorBook", "PageSlice"]

_ID_BYTES = 12
_MAC_BYTES = 16
_PACK = struct.Struct(f">{_ID_BYTES}sI")


@dataclass(frozen=True)
class PageSlice:
    items: list[Any]
    next_cursor: str | None
    extra: Mapping[str, Any]


@dataclass
class _Snapshot:
    owner: str
    items: tuple[Any, ...]
    extra: Mapping[str, Any]
    expires: float


class CursorBook:
    """Holds the snapshots behind live cursors: at most `max_snapshots`, each for
    `ttl_seconds` after its last use. A cursor is signed with a key of this process, so a
    forged, altered or foreign one (another component, an earlier run) is refused.

    A page holds at most `limit` items and is cut before the item that would carry its items
    past `max_page_bytes` of compact JSON (the first item always goes); the cursor goes on
    from there."""

    def __init__(
        self,
        ttl_seconds: float = 300.0,
        max_snapshots: int = 256,
        max_page_bytes: int = REPLY_BUDGET_BYTES,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_snapshots = max_snapshots
        self.max_page_bytes = max_page_bytes
        self._key = os.urandom(32)
        self._lock = threading.Lock()
        self._snapshots: OrderedDict[bytes, _Snapshot] = OrderedDict()

    def first(
        self, owner: str, items: Sequence[Any], limit: int, extra: Mapping[str, Any]
    ) -> PageSlice:
        """The first page; the rest of `items` is kept for the cursor it returns."""
        items = tuple(items)
        end = self._fit(items, 0, limit)
        if end == len(items):
            return PageSlice(list(items), None, extra)
        snapshot_id = os.urandom(_ID_BYTES)
        now = time.monotonic()
        with self._lock:
            self._evict(now)
            self._snapshots[snapshot_id] = _Snapshot(owner, items, extra, now + self.ttl_seconds)
            while len(self._snapshots) > self.max_snapshots:
                self._snapshots.popitem(last=False)
        return PageSlice(list(items[:end]), self._sign(snapshot_id, end), extra)

    def next(self, owner: str, cursor: str, limit: int) -> PageSlice:
        """The page a cursor points at; BAD_ARGS for a foreign, altered or expired one."""
        snapshot_id, offset = self._open(cursor)
        now = time.monotonic()
        with self._lock:
            self._evict(now)
            snapshot = self._snapshots.get(snapshot_id)
            if snapshot is None:
                raise bad_args("cursor has expired; start again without a cursor")
            if snapshot.owner != owner:
                raise bad_args("cursor belongs to another verb or other arguments")
        # Measured outside the lock: a snapshot's items never change.
        end = self._fit(snapshot.items, offset, limit)
        items = list(snapshot.items[offset:end])
        with self._lock:
            if end >= len(snapshot.items):
                self._snapshots.pop(snapshot_id, None)
                return PageSlice(items, None, snapshot.extra)
            snapshot.expires = now + self.ttl_seconds
            if snapshot_id in self._snapshots:
                self._snapshots.move_to_end(snapshot_id)
        return PageSlice(items, self._sign(snapshot_id, end), snapshot.extra)

    def _fit(self, items: Sequence[Any], start: int, limit: int) -> int:
        """Where the page starting at `start` ends: `limit` items or the byte budget."""
        end = min(start + limit, len(items))
        total = 0
        for index in range(start, end):
            total += json_size(items[index])
            if total > self.max_page_bytes and index > start:
                return index
        return end

    def __len__(self) -> int:
        with self._lock:
            return len(self._snapshots)

    def _evict(self, now: float) -> None:
        expired = [key for key, snap in self._snapshots.items() if snap.expires <= now]
        for key in expired:
            del self._snapshots[key]

    def _sign(self, snapshot_id: bytes, offset: int) -> str:
        payload = _PACK.pack(snapshot_id, offset)
        mac = hmac.new(self._key, payload, hashlib.sha256).digest()[:_MAC_BYTES]
        return base64.urlsafe_b64encode(payload + mac).decode("ascii").rstrip("=")

    def _open(self, cursor: str) -> tuple[bytes, int]:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (ValueError, TypeError):
            raw = b""
        if len(raw) != _PACK.size + _MAC_BYTES:
            raise bad_args("cursor is not one this component issued")
        payload, mac = raw[: _PACK.size], raw[_PACK.size :]
        expected = hmac.new(self._key, payload, hashlib.sha256).digest()[:_MAC_BYTES]
        if not hmac.compare_digest(mac, expected):
            raise bad_args("cursor is not one this component issued")
        snapshot_id, offset = _PACK.unpack(payload)
        return snapshot_id, offset
