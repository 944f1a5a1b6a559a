"""paho-mqtt's internals, in one place: buffered reads, writes from the publishing thread, the
count of unacknowledged publishes, and the address the next reconnect dials.

The transport (`messaging/mqtt.py` and its layers `mqtt_connection.py`, `mqtt_publish.py`
and `mqtt_subscriptions.py`) uses paho's public API plus this module's surface
(`BufferedClient`, `unacknowledged`, `awaits_acknowledgement`, `retarget`). Every private
paho name unskit touches is in `PAHO_PRIVATE_NAMES` and used only here. They were checked
against paho-mqtt 2.1.0 and 2.2.0, hence the pin `paho-mqtt>=2.1,<2.3`;
tests/messaging/test_paho_adapter.py has a test per name, so a release that moves one fails
there rather than misbehaving in the field.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

__all__ = [
    "PAHO_PRIVATE_NAMES",
    "READ_BURST_PACKETS",
    "READ_CHUNK_BYTES",
    "BufferedClient",
    "awaits_acknowledgement",
    "retarget",
    "unacknowledged",
]

#: The private attributes and methods of `paho.Client` this module relies on.
PAHO_PRIVATE_NAMES = (
    "_sock",
    "_sock_recv",
    "_packet_read",
    "_packet_write",
    "_packet_queue",
    "_out_packet",
    "_sockpairW",
    "_loop_rc_handle",
    "_out_messages",
    "_host",
    "_port",
)

# One recv() fills a buffer that paho's packet reader then takes from; paho alone makes two
# or three recv() calls per packet and goes back to select() after each packet.
READ_CHUNK_BYTES = 64 * 1024
# Packets read between servicing writes (acknowledgements) and keepalive in a long burst.
READ_BURST_PACKETS = 1_000


class BufferedClient(paho.Client):
    """paho's client with buffered reads: one recv() per 64 KiB instead of per packet field,
    and every buffered packet handled before the loop returns to select().

    It overrides paho's private `_sock_recv` and replaces `loop_read`'s body, which calls
    `_packet_read` and `_loop_rc_handle` (docs/decisions.md, "Buffered reads under paho")."""

    _read_sock: object = None
    _read_buffer: bytes = b""
    _read_pos = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # paho's packet writer is not safe in two threads at once (a packet cut short by a
        # full socket goes back to the head of the queue): every write holds this lock.
        self._write_lock = threading.RLock()

    def loop_write(self) -> MQTTErrorCode:
        with self._write_lock:
            return super().loop_write()

    def _packet_queue(
        self,
        command: int,
        packet: bytes | bytearray,
        mid: int,
        qos: int,
        info: paho.MQTTMessageInfo | None = None,
    ) -> MQTTErrorCode:
        # A packet is written by the thread that queues it, rather than by the network
        # thread once paho's wake-up byte gets it out of select(): on a loaded machine that
        # hand-off was one of the request/reply tail's (docs/decisions.md, "Writes from the
        # publishing thread"). Only on a plain TCP socket (an SSL object must not read and
        # write in two threads at once), without an on_publish callback (it stays on the
        # network thread), and never waiting for the lock (its holder writes the queue).
        sock = self._sock
        if (
            type(sock) is not socket.socket
            or self.on_publish is not None
            or not self._write_lock.acquire(blocking=False)
        ):
            return super()._packet_queue(command, packet, mid, qos, info)
        try:
            self._out_packet.append(
                {
                    "command": command,
                    "mid": mid,
                    "qos": qos,
                    "pos": 0,
                    "to_process": len(packet),
                    "packet": packet,
                    "info": info,
                }
            )
            # Errors (a lost link) and what a full socket leaves stay for the network thread.
            self._packet_write()
            left = bool(self._out_packet)
        finally:
            self._write_lock.release()
        wake = self._sockpairW
        if left and wake is not None:
            with contextlib.suppress(BlockingIOError):
                wake.send(b"0")
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _sock_recv(self, bufsize: int) -> bytes:
        sock = self._sock
        if sock is not self._read_sock:  # a new connection starts with an empty buffer
            self._read_sock, self._read_buffer, self._read_pos = sock, b"", 0
        buffer, pos = self._read_buffer, self._read_pos
        if pos >= len(buffer):
            buffer = super()._sock_recv(READ_CHUNK_BYTES)  # BlockingIOError when drained
            if not buffer:
                return buffer  # end of stream
            pos = 0
        end = pos + bufsize
        self._read_buffer, self._read_pos = buffer, end
        return buffer[pos:end]

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        # Reads until both the buffer and the socket are drained: select() cannot see what
        # waits in our buffer, so returning earlier could strand packets until keepalive.
        while True:
            for _ in range(READ_BURST_PACKETS):
                if self._sock is None:
                    return MQTTErrorCode.MQTT_ERR_NO_CONN
                rc = self._packet_read()
                if rc > 0:
                    return self._loop_rc_handle(rc)
                if rc == MQTTErrorCode.MQTT_ERR_AGAIN:
                    return MQTTErrorCode.MQTT_ERR_SUCCESS
            # A flood must not starve our acknowledgements or the keepalive.
            rc = self.loop_write() or self.loop_misc()
            if rc:
                return rc


def unacknowledged(client: paho.Client) -> int:
    """QoS 1/2 publishes the broker has not acknowledged yet, queued ones included."""
    # paho keeps them in _out_messages until their acknowledgement (or while the link is
    # down); it offers no public count of them.
    return len(client._out_messages)


def awaits_acknowledgement(client: paho.Client, info: paho.MQTTMessageInfo) -> bool:
    """Whether the QoS 1/2 publish `publish()` returned `info` for is still unacknowledged."""
    # paho keeps the message in _out_messages, by packet id, until its acknowledgement; a
    # packet id reused since belongs to another message. (`info.is_published()` raises for a
    # publish made while the link was down, though paho sends it on reconnect.)
    message = client._out_messages.get(info.mid)
    return message is not None and message.info is info


def retarget(client: paho.Client, host: str, port: int) -> None:
    """Points the next reconnect of paho's loop at another broker. paho's `host`/`port`
    setters refuse while its state is "connection lost", though the socket is already gone
    (in on_disconnect and on_connect_fail); `reconnect()` dials these two attributes."""
    client._host, client._port = host, port
