"""Pages are cut by size: at most `limit` items, and no more than the byte budget (the
first item always goes); the cursor goes on from the cut."""

from __future__ import annotations

from typing import Any

from unskit.commands.fields import REPLY_BUDGET_BYTES, json_size
from unskit.commands.paging import CursorBook


def items_of(sizes: list[int]) -> list[str]:
    # A JSON string of n characters encodes to n + 2 bytes.
    return ["x" * (size - 2) for size in sizes]


def pages(book: CursorBook, items: list[Any], limit: int) -> list[list[Any]]:
    page = book.first("owner", items, limit, {})
    got = [page.items]
    while page.next_cursor is not None:
        page = book.next("owner", page.next_cursor, limit)
        got.append(page.items)
    return got


def test_a_page_stops_at_the_byte_budget() -> None:
    items = items_of([40, 40, 40, 30, 100, 10, 10])
    got = pages(CursorBook(max_page_bytes=100), items, limit=10)
    # 40+40 fits, +40 would pass 100; 40+30 fits; 100 alone; 10+10 at the end.
    assert [len(page) for page in got] == [2, 2, 1, 2]
    assert [item for page in got for item in page] == items


def test_an_item_larger_than_the_budget_goes_alone() -> None:
    items = items_of([10, 500, 10])
    assert [len(page) for page in pages(CursorBook(max_page_bytes=100), items, 10)] == [1, 1, 1]


def test_the_limit_still_applies_under_the_budget() -> None:
    items = items_of([10] * 7)
    assert [len(page) for page in pages(CursorBook(max_page_bytes=1000), items, 3)] == [3, 3, 1]


def test_the_default_budget_cuts_a_page_of_large_items() -> None:
    item = {"metadata": {"blob": "x" * 60_000}}
    got = pages(CursorBook(), [item] * 40, limit=1000)
    assert len(got) > 1
    for page in got:
        assert json_size(page) <= REPLY_BUDGET_BYTES + json_size(item)
    assert sum(len(page) for page in got) == 40
