"""The recorder's subscriptions: the one place that knows how its filters reach the broker
(plain, or through a consumer group so a group of recorders splits the load)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from unskit.messaging import MessagingClient
from unskit.messaging.groups import ConsumerGroup, ConsumerGroupConfig
from unskit.messaging.subscriptions import Handler

__all__ = ["SignalSubscription"]

_log = logging.getLogger(__name__)


class SignalSubscription:
    """Subscribes the include filters with one bounded queue each and a single worker (the
    writer is single-threaded); overflow goes to `on_overflow` on the network thread.
    `device_level` is the topic level of the publishing device, for a group's partition."""

    def __init__(
        self,
        messaging: MessagingClient,
        handler: Handler,
        on_overflow: Handler,
        *,
        device_level: int,
    ) -> None:
        self._messaging = messaging
        self._handler = handler
        self._on_overflow = on_overflow
        self._device_level = device_level
        self._group: ConsumerGroup | None = None
        self.filters: tuple[str, ...] = ()
        self.max_messages = 0
        #: What the subscriptions were opened with, to tell whether a reload changes them.
        self.opened_with: tuple[Any, ...] = ()

    def open(
        self, include: Sequence[str], group: ConsumerGroupConfig | None, max_messages: int
    ) -> None:
        """Subscribes every filter (after closing the ones subscribed before)."""
        self.close()
        if group is not None:
            self._group = ConsumerGroup(self._messaging, group, device_level=self._device_level)
            self._group.open(
                include, self._handler, max_messages=max_messages, on_overflow=self._on_overflow
            )
            filters = self._group.filters
        else:
            filters = tuple(include)
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
            _log.info("recording %s", ", ".join(filters))
        self.filters, self.max_messages = filters, max_messages
        self.opened_with = (tuple(include), group, max_messages)

    def queued(self) -> int:
        """Messages waiting in the subscriptions' queues."""
        return sum(self._messaging.queued(topic_filter) for topic_filter in self.filters)

    def group_status(self) -> dict[str, Any] | None:
        """The consumer group's part of sb/status (None without a group)."""
        return None if self._group is None else self._group.status()

    def close(self) -> None:
        """Unsubscribes; messages already queued are still handed to the handler."""
        if self._group is not None:
            self._group.close()
            self._group = None
        else:
            for topic_filter in self.filters:
                self._messaging.unsubscribe(topic_filter)
        self.filters = ()
