"""The edge-runtime IPC transport: the local link over the nucleus's publish/subscribe bus
(spec 1: on the EDGE_RUNTIME platform the transport is IPC, not MQTT), or a northbound link
over the nucleus's cloud MQTT proxy (``messaging.northbound.type: runtime``), chosen by its
`bus` at construction.

`IpcTransport` is joined here from its layers: `ipc_connection` (the link's state),
`ipc_publish` (publishes, the held ones, their counters) and `ipc_subscriptions` (streams,
the nucleus's answers, the retry of refused ones). This module keeps the link's life: a
thread that connects with the link's jittered `reconnect` backoff, restores every filter on
each new connection, then sends what was held, and starts over when the connection is lost.

What the IPC bus does not give that a persistent MQTT session does: the nucleus keeps
nothing for a component that is down, so messages (requests among them) published while it
is away are not delivered to it later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from unskit.config.messaging import IpcConfig
from unskit.edge import IpcConnection, IpcEndpoint
from unskit.edge.connection import CONNECT_TIMEOUT_S
from unskit.edge.pubsub import Bus
from unskit.errors import EdgeRuntimeError
from unskit.messaging.ipc_publish import _IpcPublishing
from unskit.messaging.ipc_subscriptions import _IpcSubscriptions
from unskit.messaging.requests import DeadlineTimer
from unskit.messaging.transport import LinkCallback, MessageCallback

__all__ = ["IpcTransport"]

_log = logging.getLogger(__name__)


class IpcTransport(_IpcPublishing, _IpcSubscriptions):
    """The local link over the edge runtime's IPC bus: QoS 0 and 1, reconnects, filters
    restored, QoS 1 publishes held while down."""

    @classmethod
    def from_environment(
        cls,
        config: IpcConfig,
        environ: Mapping[str, str] | None = None,
        *,
        name: str = "local",
        timer: DeadlineTimer | None = None,
        bus: Bus = Bus.LOCAL,
    ) -> IpcTransport:
        """The transport to the nucleus named by the variables the runtime hands a component
        (`environ`, else this process's); EdgeRuntimeError naming the missing ones. `bus`:
        the local pub/sub, or (a northbound link) the nucleus's cloud MQTT proxy."""
        return cls(IpcEndpoint.from_environment(environ), config, name=name, timer=timer, bus=bus)

    def start(self, on_message: MessageCallback, on_link: LinkCallback) -> None:
        """Connects and reconnects in a thread of its own; callbacks of messages run on the
        SDK's event-loop thread, those of the link on this transport's thread."""
        self._on_message, self._on_link = on_message, on_link
        self._started = True
        _log.info(
            "messaging %s: connecting to the edge runtime at %s (%s, receive own messages: %s)",
            self._name,
            self._endpoint.socket_path,
            self._bus_name,
            self._config.receive_own_messages,
        )
        self._thread = threading.Thread(
            target=self._run, name=f"unskit-{self._name}-ipc", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Waits up to `timeout` s for the nucleus to answer QoS 1 publishes, then closes."""
        if not self._started or self._closed:
            return
        with self._changed:
            self._changed.wait_for(lambda: not self._in_flight or not self._connected, timeout)
            self._closed = True
            self._cancel_retry()
            self._cancel_publish_retry_locked()
            own_timer, self._own_timer = self._own_timer, None
            connection, self._connection = self._connection, None
            self._client, self._connected = None, False
            pending = len(self._in_flight) + len(self._held)
        if own_timer is not None:
            own_timer.stop()
        if pending:
            _log.warning(
                "messaging %s: closing with %d publishes unanswered or held", self._name, pending
            )
        self._wake.set()
        if connection is not None:
            connection.close()
        if self._thread is not None:
            # At most one connect attempt long: the thread returns once it sees the close.
            self._thread.join(CONNECT_TIMEOUT_S)

    # -- the link's thread ----------------------------------------------------------------

    def _run(self) -> None:
        attempt = 0
        while not self._closed:
            self._wake.clear()
            if self._connect_once():
                attempt = 0
                self._wake.wait()  # set by the loss, or by close
                if self._closed:
                    return
                if self._on_link is not None:
                    self._on_link(False)
            attempt += 1
            delay = self._config.reconnect.delay(attempt)
            _log.info("messaging %s: connecting again in %.1f s", self._name, delay)
            if self._closed:
                return
            # Not a synchronisation: the backoff's wait, cut short only by close.
            self._wake.clear()
            self._wake.wait(delay)

    def _connect_once(self) -> bool:
        with self._lock:
            generation = self._generation + 1
        connection = IpcConnection(self._endpoint, on_lost=lambda why: self._lost(generation, why))
        try:
            connection.connect()
            client = connection.client
        except EdgeRuntimeError as error:
            _log.warning("messaging %s: %s", self._name, error)
            return False
        with self._lock:
            if self._closed:
                connection.close()
                return False
            self._generation = generation
            self._connection, self._client = connection, client
        restored = self._restore(client, generation, CONNECT_TIMEOUT_S)
        sent = self._flush_held(client, generation)
        with self._lock:
            if generation != self._generation or not self._connected:
                return False  # lost while restoring; the loss already woke the loop
        _log.info(
            "messaging %s: connected to the edge runtime (%d filters restored, %d held "
            "publishes sent)",
            self._name,
            restored,
            sent,
        )
        if self._on_link is not None:
            self._on_link(True)
        return True

    def _lost(self, generation: int, why: str) -> None:
        """The connection's loss (the SDK's event-loop thread): the link is down at once;
        the link's thread reconnects."""
        with self._changed:
            if generation != self._generation or self._closed:
                return
            self._generation += 1  # what the lost connection's callbacks say is stale now
            self._connected = False
            self._connection, self._client = None, None
            self._acknowledged.clear()
            self._streams.clear()
            self._cancel_retry()
            self._cancel_publish_retry_locked()
            self._changed.notify_all()
        _log.warning(
            "messaging %s: the IPC link to the edge runtime was lost (%s)", self._name, why
        )
        self._wake.set()
