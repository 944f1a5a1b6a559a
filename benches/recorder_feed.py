"""Publishes pre-encoded messages at QoS 1 from its own process (the recorder bench's feed,
so the publisher does not share the recorder's interpreter).
Usage: python -m benches.recorder_feed PORT FILE  (FILE: repeated u16 topic length, topic,
u32 payload length, payload); prints "ready" once connected, publishes when a line arrives on
stdin and prints "done" once every message is acknowledged."""

from __future__ import annotations

import struct
import sys
import threading
import uuid
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion


def read(path: Path) -> list[tuple[str, bytes]]:
    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from(">H", data, at)
        topic = data[at + 2 : at + 2 + n].decode()
        at += 2 + n
        (m,) = struct.unpack_from(">I", data, at)
        out.append((topic, data[at + 4 : at + 4 + m]))
        at += 4 + m
    return out


def write(path: Path, messages: list[tuple[str, bytes]]) -> None:
    with path.open("wb") as handle:
        for topic, payload in messages:
            encoded = topic.encode()
            handle.write(struct.pack(">H", len(encoded)) + encoded)
            handle.write(struct.pack(">I", len(payload)) + payload)


def main(port: int, path: Path) -> None:
    messages = read(path)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"feed-{uuid.uuid4().hex[:8]}")
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    connected, acked = threading.Event(), threading.Event()
    count = [0]

    def on_publish(*_: object) -> None:
        count[0] += 1
        if count[0] == len(messages):
            acked.set()

    client.on_connect = lambda *_: connected.set()
    client.on_publish = on_publish
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert connected.wait(10)
    print("ready", flush=True)
    sys.stdin.readline()  # the bench says go
    for topic, payload in messages:
        client.publish(topic, payload, qos=1)
    assert acked.wait(300)
    print("done", flush=True)
    client.loop_stop()
    client.disconnect()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
