"""node-opcua's server (tests/opcua/node_server), an OPC UA stack independent of asyncua for the
adapter's tests: the simulated plant of namespace ``urn:unskit:sim`` on 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.servers import free_port, terminate, wait_until

#: The npm project of the server script; scripts/install-node-peers fills its node_modules.
NODE_SERVER_DIR = Path(__file__).resolve().parents[1] / "opcua" / "node_server"
NAMESPACE_URI = "urn:unskit:sim"
USERNAME = "operator"
PASSWORD = "secret"
#: The first start loads the standard nodeset and generates an RSA key pair: seconds on a
#: busy machine (about 7 s measured on two shared cores), so the deadline is generous.
START_TIMEOUT = 60.0


def require_node_opcua() -> str:
    """The node binary, once the server's locked npm packages are installed; else RuntimeError."""
    node = shutil.which("node")
    hint = "run `make test` (scripts/install-node-peers)"
    if node is None:
        raise RuntimeError(f"node is not installed (Node.js >= 18 is needed): {hint}")
    modules = NODE_SERVER_DIR / "node_modules"
    lock = (NODE_SERVER_DIR / "package-lock.json").read_bytes()
    stamp = modules / ".unskit-lock.sha256"
    if not stamp.is_file() or stamp.read_text().strip() != hashlib.sha256(lock).hexdigest():
        raise RuntimeError(f"node-opcua is not installed at its locked version: {hint}")
    return node


def locked_version(package: str) -> str:
    """The version package-lock.json pins for an npm package."""
    lock = json.loads((NODE_SERVER_DIR / "package-lock.json").read_text())
    return str(lock["packages"][f"node_modules/{package}"]["version"])


@dataclass
class NodeOpcuaServer:
    """``node server.js`` on 127.0.0.1:port with endpoint ``/unskit/``; its certificates live in
    ``folder/pki``, so a restart keeps its identity."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}/unskit/"

    @property
    def log_path(self) -> Path:
        return self.folder / "node-opcua.log"

    @property
    def stdout_path(self) -> Path:
        return self.folder / "stdout.txt"

    @property
    def certificate_path(self) -> Path:
        """The server's own certificate (PEM), generated on its first start."""
        return self.folder / "pki" / "server" / "own" / "certs" / "certificate.pem"

    def start(self, timeout: float = START_TIMEOUT) -> NodeOpcuaServer:
        """Starts the server and returns once it printed READY (it listens by then)."""
        node = require_node_opcua()
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "pki").mkdir(exist_ok=True)
        with self.stdout_path.open("wb") as out, self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    node,
                    str(NODE_SERVER_DIR / "server.js"),
                    "--port",
                    str(self.port),
                    "--pki",
                    str(self.folder / "pki"),
                ],
                cwd=NODE_SERVER_DIR,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=log,
            )
        try:
            wait_until(self._ready, timeout, f"node-opcua READY on {self.endpoint}", interval=0.05)
        except BaseException:
            self.kill()
            raise
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = self.log_path.read_text(errors="replace")
            raise RuntimeError(f"node-opcua exited with {self.process.returncode}:\n{log[-2000:]}")
        # node-opcua writes its own notices to stdout too: READY is a line of its own.
        lines = self.stdout_path.read_bytes().splitlines()
        return any(line.startswith(b"READY ") for line in lines)

    def stop(self) -> None:
        """SIGTERM (the server closes its sessions), SIGKILL after 10 s."""
        terminate(self.process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the server vanishes without closing anything, as on a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self, timeout: float = START_TIMEOUT) -> NodeOpcuaServer:
        """Stops the server and starts it again on the same port with the same certificate."""
        self.stop()
        return self.start(timeout)
