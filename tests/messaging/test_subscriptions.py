"""A subscription's full queue: the overflow handler sees each refused message on the
offering thread; one that raises is counted and logged, never raised into that thread."""

from __future__ import annotations

import threading

import pytest

from tests.support.logs import recording_logs
from unskit.envelope import Message, MessageBuilder
from unskit.messaging.subscriptions import Subscription


def message(n: int) -> Message:
    return MessageBuilder("Probe", "1.0").body({"n": n}).build()


@pytest.mark.parametrize("overflow_raises", [False, True], ids=["answers", "raises"])
def test_the_full_queue_hands_each_refused_message_to_the_overflow_handler(
    overflow_raises,
) -> None:
    entered, release = threading.Event(), threading.Event()
    overflowed: list[tuple[str, int, str]] = []

    def handle(_topic: str, _message: Message) -> None:
        entered.set()
        release.wait(10)

    def overflow(topic: str, refused: Message) -> None:
        overflowed.append((topic, refused.body["n"], threading.current_thread().name))
        if overflow_raises:
            raise RuntimeError("cannot answer")

    subscription = Subscription(
        "a/#", handle, max_concurrency=1, max_messages=1, on_overflow=overflow
    )
    try:
        with recording_logs() as logs:
            assert subscription.offer("a/1", message(1))
            assert entered.wait(10)
            assert subscription.offer("a/2", message(2))  # queued behind the busy worker
            assert not subscription.offer("a/3", message(3))
            assert not subscription.offer("a/4", message(4))
        here = threading.current_thread().name
        assert overflowed == [("a/3", 3, here), ("a/4", 4, here)]
        assert subscription.dropped == 2
        assert subscription.overflow_failed == (2 if overflow_raises else 0)
        assert logs.tracebacks() == []
        lines = logs.warnings("queue of 1 full")
        assert len(lines) == 1
        assert ("cannot answer" in lines[0]) is overflow_raises
    finally:
        release.set()
        assert subscription.close(10)
    assert subscription.delivered == 2
