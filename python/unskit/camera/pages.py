"""Paged camera replies: the first page is cut from a snapshot of the answer, every
continuation from the snapshot its cursor names (never from a new query)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from unskit.commands import CommandContext
from unskit.commands.fields import DEFAULT_LIMIT
from unskit.commands.paging import CursorBook

__all__ = ["Pages", "snapshot_owner"]


def snapshot_owner(*parts: Any) -> str:
    """The snapshot owner of a query: a cursor serves only the query that made it."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class Pages:
    """Cuts pages from the request's limit and cursor."""

    def __init__(self) -> None:
        self._cursors = CursorBook()

    def page(
        self, context: CommandContext, owner: str, items: Sequence[Any], extra: Mapping[str, Any]
    ) -> tuple[list[Any], str | None, Mapping[str, Any]]:
        """(items of this page, nextCursor, extra kept with the snapshot)."""
        limit = int(context.body.get("limit", DEFAULT_LIMIT))
        cursor = context.body.get("cursor")
        if cursor is not None:
            sliced = self._cursors.next(owner, str(cursor), limit)
        else:
            sliced = self._cursors.first(owner, items, limit, extra)
        return sliced.items, sliced.next_cursor, sliced.extra
