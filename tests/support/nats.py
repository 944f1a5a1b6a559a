"""A real 3-node NATS server cluster speaking MQTT 3.1.1, on free loopback ports: JetStream
(which holds MQTT sessions, retained messages and QoS 1 queues) replicated across the nodes,
each node with its own MQTT listener and monitoring port. Built by scripts/install-go-peers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.servers import free_port, port_open, terminate, wait_until

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "tests" / "support" / "nats_server"
START_TIMEOUT_S = 60.0


def nats_server_binary() -> str:
    """The server scripts/install-go-peers built for the pinned module (same cache key)."""
    cache = Path(
        os.environ.get("UNSKIT_TEST_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "unskit-test"
    )
    text = (MODULE / "go.mod").read_bytes() + (MODULE / "go.sum").read_bytes()
    binary = cache / f"nats-server-{hashlib.sha256(text).hexdigest()[:16]}"
    if not binary.is_file():
        raise RuntimeError(f"{binary} is missing: run scripts/install-go-peers (make system-deps)")
    return str(binary)


@dataclass
class NatsNode:
    name: str
    folder: Path
    # Below the ephemeral range: a node killed and restarted gets its ports back even when
    # other tests open thousands of connections meanwhile.
    client_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    mqtt_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.folder / "nats.log"

    def healthy(self) -> bool:
        """JetStream is up on this node and its cluster has a meta leader (MQTT sessions are
        streams replicated on three nodes: one made before that would live on one node)."""
        url = f"http://127.0.0.1:{self.http_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def holds_client(self, client_id: str) -> bool:
        """The node the MQTT client `client_id` is connected to answers true."""
        url = f"http://127.0.0.1:{self.http_port}/connz?mqtt_client={client_id}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(json.loads(answer.read()).get("num_connections"))


@dataclass
class NatsCluster:
    folder: Path
    nodes: list[NatsNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = [NatsNode(f"n{i}", self.folder / f"n{i}") for i in range(1, 4)]

    def _config(self, node: NatsNode) -> Path:
        routes = ", ".join(
            f'"nats-route://127.0.0.1:{peer.cluster_port}"' for peer in self.nodes if peer != node
        )
        node.folder.mkdir(parents=True, exist_ok=True)
        config = node.folder / "nats.conf"
        config.write_text(
            f"""server_name: {node.name}
listen: 127.0.0.1:{node.client_port}
http: 127.0.0.1:{node.http_port}
jetstream {{ store_dir: "{node.folder / "js"}" }}
cluster {{ name: unskit-test, listen: 127.0.0.1:{node.cluster_port}, routes: [{routes}] }}
mqtt {{ listen: 127.0.0.1:{node.mqtt_port}, stream_replicas: 3 }}
"""
        )
        return config

    def start_node(self, node: NatsNode) -> None:
        config = self._config(node)
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(
                [nats_server_binary(), "-c", str(config)], stdout=log, stderr=log
            )

    def start(self) -> NatsCluster:
        for node in self.nodes:
            self.start_node(node)
        try:
            self.wait_healthy(self.nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, nodes: list[NatsNode]) -> None:
        def ready() -> bool:
            for node in nodes:
                if node.process is not None and node.process.poll() is not None:
                    log = node.log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"NATS node {node.name} exited:\n{log}")
            return all(node.healthy() and port_open(node.mqtt_port) for node in nodes)

        wait_until(ready, START_TIMEOUT_S, "the NATS cluster's JetStream and MQTT listeners")

    def kill(self, node: NatsNode) -> None:
        """kill -9, as a node failure."""
        if node.process is not None:
            node.process.kill()
            node.process.wait(10)
            node.process = None

    def restart(self, node: NatsNode) -> None:
        self.start_node(node)
        self.wait_healthy([node])

    def stop(self) -> None:
        for node in self.nodes:
            terminate(node.process)
            node.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
