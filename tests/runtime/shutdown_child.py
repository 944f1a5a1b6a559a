"""A small component for the signal test: health server, signal handlers, a slow drain.

Run as a script. Prints `PORT <n>` once serving, `DRAINING` when the messaging drain starts
and `DRAINED` when it ends, on stdout; the runtime's log goes to stderr.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from unskit.runtime.health import HealthConfig, HealthServer, ReadinessState
from unskit.runtime.shutdown import ShutdownCoordinator

DRAIN_SECONDS = 1.0


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    readiness = ReadinessState(lambda: True)
    server = HealthServer(HealthConfig(port=0), readiness, bind_host="127.0.0.1")
    server.start()
    coordinator = ShutdownCoordinator(readiness, server)
    in_flight_done = threading.Event()  # nothing sets it: the drain takes its full time

    def drain_messaging() -> None:
        print("DRAINING", flush=True)
        in_flight_done.wait(timeout=DRAIN_SECONDS)
        print("DRAINED", flush=True)

    coordinator.add_drain_step("messaging", drain_messaging)
    coordinator.add_drain_step("commands", lambda: None)
    if not coordinator.install_signal_handlers():
        sys.exit(3)
    print(f"PORT {server.port}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
