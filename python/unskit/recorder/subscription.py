"""The recorder's subscriptions: the one place that knows how its filters reach the broker
(plain, or `$share/<group>/<filter>` so a group of recorders splits the load)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from unskit.messaging import MessagingClient
from unskit.messaging.subscriptions import Handler

__all__ = ["SignalSubscription", "broker_filters"]

_log = logging.getLogger(__name__)


def broker_filters(include: Sequence[str], share_group: str | None) -> tuple[str, ...]:
    """The filters sent to the broker for these include filters."""
    if share_group is None:
        return tuple(include)
    return tuple(f"$share/{share_group}/{topic_filter}" for topic_filter in include)


class SignalSubscription:
    """Subscribes the include filters with one bounded queue each and a single worker (the
    writer is single-threaded); overflow goes to `on_overflow` on the network thread."""

    def __init__(
        self,
        messaging: MessagingClient,
        handler: Handler,
        on_overflow: Handler,
    ) -> None:
        self._messaging = messaging
        self._handler = handler
        self._on_overflow = on_overflow
        self.filters: tuple[str, ...] = ()
        self.max_messages = 0

    def open(self, include: Sequence[str], share_group: str | None, max_messages: int) -> None:
        """Subscribes every filter (after closing the ones subscribed before)."""
        self.close()
        filters = broker_filters(include, share_group)
        subscribed: list[str] = []
        try:
            for topic_filter in filters:
                self._messaging.subscribe(
                    topic_filter,
                    self._handler,
                    max_concurrency=1,
                    max_messages=max_messages,
                    on_overflow=self._on_overflow,
                )
                subscribed.append(topic_filter)
        except BaseException:
            for topic_filter in subscribed:
                self._messaging.unsubscribe(topic_filter)
            raise
        self.filters, self.max_messages = filters, max_messages
        _log.info("recording %s", ", ".join(filters))

    def queued(self) -> int:
        """Messages waiting in the subscriptions' queues."""
        return sum(self._messaging.queued(topic_filter) for topic_filter in self.filters)

    def close(self) -> None:
        """Unsubscribes; messages already queued are still handed to the handler."""
        for topic_filter in self.filters:
            self._messaging.unsubscribe(topic_filter)
        self.filters = ()
