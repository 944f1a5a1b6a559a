"""A bare component for bench_edge_runtime's startup rows: the SDK's V2 client reports
RUNNING with UpdateState and the process stays up until the nucleus ends it.
Usage (a startup step of the nucleus): python -m benches.bare_component"""

from __future__ import annotations

import signal
import threading

from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2


def main() -> None:
    # Connects with the socket and token the nucleus handed this process.
    client = GreengrassCoreIPCClientV2()
    client.update_state(state="RUNNING")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    client.close()


if __name__ == "__main__":
    main()
