"""A plain MQTT client for tests: what the broker routes, whatever the topic or payload."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import paho.mqtt.client as mqtt


class RawRecorder:
    """A plain paho client subscribed to `#`: every message the broker routes, as bytes,
    whatever its topic (an envelope client would take lib/reply- topics for its replies)."""

    def __init__(self, port: int) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"raw-{uuid.uuid4().hex[:8]}"
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_connect = lambda client, *_: client.subscribe("#", qos=1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not self._subscribed.wait(10):
            raise RuntimeError("the raw client's subscription to '#' was not acknowledged")

    def _on_message(self, _client: Any, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((message.topic, message.payload))

    def __len__(self) -> int:
        with self._lock:
            return len(self.messages)

    def since(self, start: int) -> list[tuple[str, bytes]]:
        """The messages received after the first `start`."""
        with self._lock:
            return self.messages[start:]

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
