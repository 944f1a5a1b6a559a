"""`echo`: the smallest component. It answers requests on ``.../cmd/sb/echo`` with their body,
for trying a broker, the probes and the shutdown path with nothing else involved. A body
``{"delayMs": n}`` holds the reply n milliseconds (at most 60 s), to try timeouts and drains."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from unskit.envelope import Message, MessageBuilder
from unskit.errors import UnskitError
from unskit.runtime.component import Runtime

__all__ = ["EchoComponent"]

_log = logging.getLogger(__name__)

MAX_DELAY_MS = 60_000


class EchoComponent:
    """Replies to every request on ``{root}/{device}/echo/cmd/sb/echo`` with its body."""

    token: ClassVar[str] = "echo"
    schema: ClassVar[Mapping[str, Any] | None] = {
        "type": "object",
        "properties": {"token": {"type": "string"}},
        "additionalProperties": False,
    }

    def __init__(self) -> None:
        self._runtime: Runtime | None = None
        # Never set: a delayed reply waits on it with a timeout rather than sleeping.
        self._hold = threading.Event()
        self.answered = 0

    def start(self, runtime: Runtime) -> None:
        """Subscribes to the echo verb; ready once messaging is connected."""
        self._runtime = runtime
        topic = runtime.topics.topic("cmd", "sb", "echo")
        runtime.get_messaging().subscribe(topic, self._echo)
        _log.info("echo: answering requests on %s", topic)

    def _echo(self, _topic: str, request: Message) -> None:
        assert self._runtime is not None
        messaging = self._runtime.get_messaging()
        body = request.body
        delay = body.get("delayMs") if isinstance(body, dict) else None
        # A request that will not be answered is not held either: it would only tie a worker.
        if isinstance(delay, int) and messaging.reply_refusal(request) is None:
            delay_ms = min(max(delay, 0), MAX_DELAY_MS)
            _log.info("echo: holding the reply to %s for %d ms", request.header.uuid, delay_ms)
            # Held on this subscription's worker; shutdown waits for it to finish.
            self._hold.wait(delay_ms / 1000)
        try:
            reply = MessageBuilder("EchoReply", "1.0", self._runtime.config).body(body).build()
            # False when the reply_to is missing or no reply topic: messaging counts and logs.
            if messaging.reply(request, reply):
                self.answered += 1
        except UnskitError as error:
            _log.warning("echo: the reply to %s was not sent: %s", request.header.uuid, error)

    def drain(self) -> None:
        """Logs the count; the subscription stays in the broker session, so requests sent
        while echo is down are answered by its next run (messaging's drain answers the
        ones already queued)."""
        _log.info("echo: answered %d requests", self.answered)
