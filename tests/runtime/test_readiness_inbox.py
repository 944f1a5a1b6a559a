"""Readiness means the command inbox answers: `/readyz` turns 200 only once start-up has ended
and the broker acknowledged (SUBACK) the inbox's subscriptions, after a reconnect too.
Real `unskit run camera-adapter` processes on a real Mosquitto, probed over HTTP."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.camera.conftest import sim
from tests.support.adapter import connected_client, framework_sections
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, free_port, readyz, wait_until

from unskit.commands import CommandClient

# MQTT control packet type of SUBACK (the high nibble of the fixed header's first byte).
SUBACK = 9


def camera_config(folder: Path, broker_port: int, health_port: int) -> tuple[Path, str]:
    """A one-camera configuration with probes on `health_port` and a session of its own."""
    document: dict[str, Any] = {
        "component": {
            "cameras": [sim("cam-1")],
            "storage": {
                "outputRoot": str(folder / "images"),
                "outputMinFreeBytes": 0,
                "stateMinFreeBytes": 0,
            },
        },
        **framework_sections(broker_port, folder),
    }
    document["messaging"]["local"]["clientId"] = f"camera-{uuid.uuid4().hex[:8]}"
    document["health"] = {"enabled": True, "port": health_port}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "camera.json"
    path.write_text(json.dumps(document))
    return path, document["topic"]["root"]


@pytest.mark.slow
def test_a_request_sent_the_moment_readiness_turns_200_is_answered(
    broker: Mosquitto, tmp_path: Path
) -> None:
    messaging = connected_client(broker.plain_port)
    try:
        # Each run is a first start (a new session): the broker knows no subscription of
        # it until the inbox's SUBSCRIBE, so a request that comes earlier reaches nobody.
        for run in range(5):
            health_port = free_port()
            config, root = camera_config(tmp_path / f"run-{run}", broker.plain_port, health_port)
            client = CommandClient(messaging, "camera-adapter", "gw", root=root)
            log = tmp_path / f"run-{run}.log"
            with component_process("camera-adapter", log, "-c", str(config), "-t", "gw") as proc:
                wait_until(
                    lambda port=health_port: readyz(port) == 200, 30, "ready", interval=0.001
                )
                described = client.call("describe", timeout=5)
                assert described["component"] == "camera-adapter", described
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(30) == 0, log.read_text()[-3000:]
    finally:
        messaging.close(1)


class SubackGate:
    """A TCP relay between a component and the broker that can hold the broker's SUBACKs
    (and everything after them on that connection) until released."""

    def __init__(self, broker_port: int) -> None:
        self._broker_port = broker_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        #: Set when a SUBACK arrived while the gate was closed, and waits.
        self.holding = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name="suback-gate", daemon=True)
        self._acceptor.start()

    def close_gate(self) -> None:
        self.holding.clear()
        self._open.clear()

    def open_gate(self) -> None:
        self._open.set()

    def drop_connections(self) -> None:
        """Cuts every relayed connection, as a network failure would."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def stop(self) -> None:
        # close() alone does not wake a thread blocked in accept() on Linux; shutdown() does.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.open_gate()
        self.drop_connections()
        self._acceptor.join(10)
        assert not self._acceptor.is_alive(), "the gate's acceptor outlived stop()"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._broker_port))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._copy, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._relay, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _copy(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                target.sendall(chunk)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)

    def _relay(self, source: socket.socket, target: socket.socket) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                buffer += chunk
                while (size := _packet_size(buffer)) is not None and len(buffer) >= size:
                    packet, buffer = buffer[:size], buffer[size:]
                    if packet[0] >> 4 == SUBACK and not self._open.is_set():
                        self.holding.set()
                        self._open.wait()
                    target.sendall(packet)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)


def _packet_size(buffer: bytes) -> int | None:
    """The length of the MQTT packet at the start of `buffer`, None until it is known."""
    remaining, multiplier = 0, 1
    for index in range(1, min(len(buffer), 5)):
        byte = buffer[index]
        remaining += (byte & 0x7F) * multiplier
        if not byte & 0x80:
            return 1 + index + remaining
        multiplier *= 128
    return None


@pytest.fixture
def gate(broker: Mosquitto) -> Iterator[SubackGate]:
    relay = SubackGate(broker.plain_port)
    yield relay
    relay.stop()


def test_readiness_waits_for_the_suback_at_start_and_after_a_reconnect(
    broker: Mosquitto, gate: SubackGate, tmp_path: Path
) -> None:
    health_port = free_port()
    config, root = camera_config(tmp_path / "gated", gate.port, health_port)
    log = tmp_path / "gated.log"
    messaging = connected_client(broker.plain_port)
    try:
        client = CommandClient(messaging, "camera-adapter", "gw", root=root)
        gate.close_gate()
        with component_process("camera-adapter", log, "-c", str(config), "-t", "gw") as process:
            # Connected and started, its SUBACK held back: alive, not ready.
            wait_until(gate.holding.is_set, 30, "the inbox's SUBACK at the gate")
            wait_until(lambda: "camera-adapter running" in log.read_text(), 30, "start-up")
            assert readyz(health_port) == 503
            gate.open_gate()
            wait_until(lambda: readyz(health_port) == 200, 10, "readiness", interval=0.001)
            assert client.call("describe", timeout=5)["component"] == "camera-adapter"

            # The link drops and comes back: ready again only once re-subscribed.
            gate.close_gate()
            gate.drop_connections()
            wait_until(gate.holding.is_set, 30, "the re-SUBACK at the gate")
            wait_until(
                lambda: log.read_text().count("messaging local: link up") == 2, 10, "reconnect"
            )
            assert readyz(health_port) == 503
            gate.open_gate()
            wait_until(lambda: readyz(health_port) == 200, 10, "readiness", interval=0.001)
            assert client.call("describe", timeout=5)["component"] == "camera-adapter"
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()[-3000:]
    finally:
        messaging.close(1)
