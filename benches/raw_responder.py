"""A bare request/reply responder in its own process: the anchor of bench_commands.
Usage: python -m benches.raw_responder PORT TOPIC"""

from __future__ import annotations

import signal
import sys
import threading

from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.envelope import Message, MessageBuilder
from unskit.messaging import MessagingClient


def main(port: int, topic: str) -> None:
    config = MessagingConfig(local=BrokerConfig(host="127.0.0.1", port=port, client_id="raw-r"))
    client = MessagingClient(config, persistent_session=False).start()
    pong = MessageBuilder("CommandReply", "1.0").body({"pong": True}).build()

    def respond(_topic: str, request: Message) -> None:
        client.reply(request, pong)

    client.subscribe(topic, respond, max_concurrency=8)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    client.close(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
