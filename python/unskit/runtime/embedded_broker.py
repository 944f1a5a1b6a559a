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
from unskit.errors import MessagingError, extra_installed, missing_extra

__all__ = ["DEFAULT_EMBEDDED_PORT", "EmbeddedBroker"]

_log = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


def _close(loop: asyncio.AbstractEventLoop) -> None:
    # As asyncio.run() ends: whatever is still pending is cancelled and awaited inside the
    # loop, never left to be collected after it closed.
    try:
        loop.run_until_complete(_cancel_pending(loop))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks(loop) if task is not current]
    for task in pending:
        task.cancel()
    await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), _STOP_TIMEOUT_S)


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
        if not extra_installed("amqtt"):
            raise MessagingError(missing_extra("the embedded MQTT broker", "amqtt", "embedded"))
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

            class ClosingBroker(Broker):  # type: ignore[misc]
                # amqtt's shutdown ends sessions, not connections still in their CONNECT
                # handshake: their handlers stayed pending and their writers open past the
                # loop's close (a ResourceWarning for a StreamWriter at collection). Here
                # each connection's writer is closed when its handler ends, and shutdown
                # closes the ones left and waits for their handlers.
                def __init__(self, config: dict[str, Any]) -> None:
                    super().__init__(config)
                    self.handlers: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

                async def stream_connected(
                    self,
                    reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter,
                    listener_name: str,
                ) -> None:
                    task = asyncio.current_task()
                    assert task is not None
                    self.handlers[task] = writer
                    try:
                        await super().stream_connected(reader, writer, listener_name)
                    finally:
                        # Not awaited: amqtt's own shutdown cancels this task, and the loop
                        # runs the close (connection_lost) before it is closed in any case.
                        writer.close()
                        del self.handlers[task]

                async def shutdown(self) -> None:
                    await super().shutdown()
                    for writer in self.handlers.values():
                        writer.transport.abort()
                    if self.handlers:
                        await asyncio.wait(list(self.handlers), timeout=_STOP_TIMEOUT_S)

            # Broker() looks up the running loop, so it is built inside it.
            broker = ClosingBroker(
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
            broker = loop.run_until_complete(start())
        except BaseException as error:
            _close(loop)
            ready.set_exception(error)
            return
        ready.set_result(broker)
        loop.run_forever()
        _close(loop)

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
