"""A process publishing northbound through the store-and-forward outbox, for the SIGKILL test.

    python -m tests.messaging.outbox_publisher LOCAL_PORT NORTHBOUND_PORT OUTBOX FIRST END PACE

publishes {"i": FIRST} ... {"i": END - 1} to `saf/seq` at QoS 1, printing each i once its
publish returned, then "done"; it closes its client and exits when stdin closes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from unskit.config.messaging import StoreAndForwardConfig
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient, QoS

TOPIC = "saf/seq"


def main(argv: list[str]) -> int:
    local_port, northbound_port, outbox, first, end, pace = argv
    config = MessagingConfig(
        local=BrokerConfig(host="127.0.0.1", port=int(local_port), client_id="saf-local"),
        northbound=BrokerConfig(
            host="127.0.0.1",
            port=int(northbound_port),
            client_id="saf-northbound",
            store_and_forward=StoreAndForwardConfig(
                path=Path(outbox), replay_messages_per_second=float(pace)
            ),
        ),
    )
    client = MessagingClient(config).start()
    try:
        for i in range(int(first), int(end)):
            client.publish_northbound_raw(TOPIC, {"i": i}, QoS.AT_LEAST_ONCE)
            sys.stdout.write(f"{i}\n")
            sys.stdout.flush()
        sys.stdout.write("done\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the test closes our stdin
    finally:
        client.close(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
