"""An in-process MQTT broker (amqtt) for a first run without a broker: `"host": "embedded"`.

It runs on its own event-loop thread, binds 127.0.0.1 only, and is stopped last, after the
component's own messaging has drained.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any

from unskit.config.model import DEFAULT_EMBEDDED_PORT
from unskit.errors import MessagingError

__all__ = ["DEFAULT_EMBEDDED_PORT", "EmbeddedBroker"]

_log = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


class EmbeddedBroker:
    """An MQTT 3.1.1 broker on 127.0.0.1:`port`, owned by one component."""

    def __init__(self, port: int = DEFAULT_EMBEDDED_PORT, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broker: Any = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """True between a successful `start()` and `stop()`."""
        return self._broker is not None

    def start(self) -> EmbeddedBroker:
        """Starts the broker and returns once it listens; MessagingError if it cannot."""
        if self._thread is not None:
            return self
        ready: concurrent.futures.Future[Any] = concurrent.futures.Future()
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(loop, ready), name="unskit-embedded-broker", daemon=True
        )
        self._thread.start()
        try:
            self._broker = ready.result(_START_TIMEOUT_S)
        except BaseException as error:
            self._stop_loop()
            raise MessagingError(
                f"the embedded MQTT broker cannot listen on {self.host}:{self.port}: {error}"
            ) from error
        _log.info("embedded MQTT broker listening on %s:%d", self.host, self.port)
        return self

    def _run(self, loop: asyncio.AbstractEventLoop, ready: concurrent.futures.Future[Any]) -> None:
        asyncio.set_event_loop(loop)

        async def start() -> Any:
            # amqtt is imported here: only components that embed a broker pay for it.
            from amqtt.broker import Broker

            # Broker() looks up the running loop, so it is built inside it.
            broker = Broker(
                {
                    "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
                    "plugins": {
                        "amqtt.plugins.authentication.AnonymousAuthPlugin": {
                            "allow_anonymous": True
                        }
                    },
                }
            )
            await broker.start()
            return broker

        try:
            ready.set_result(loop.run_until_complete(start()))
        except BaseException as error:
            ready.set_exception(error)
            loop.close()
            return
        loop.run_forever()
        loop.close()

    def stop(self) -> None:
        """Stops the broker (idempotent)."""
        broker, loop = self._broker, self._loop
        self._broker = None
        if broker is not None and loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(broker.shutdown(), loop).result(_STOP_TIMEOUT_S)
            except Exception:
                _log.exception("embedded MQTT broker did not shut down cleanly")
            _log.info("embedded MQTT broker stopped")
        self._stop_loop()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(_STOP_TIMEOUT_S)
        self._loop = self._thread = None
