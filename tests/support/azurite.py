"""Azurite's Blob service (tests/egress/azurite_server, npm `azurite` pinned) on a free loopback
port: the Azure Blob peer of the file-egress blobstore tests. Always without telemetry (it
would call an external host) and without the API version check (the SDK is newer)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.pki import Pki
from tests.support.servers import free_port, port_open, terminate, wait_until

#: The npm project; scripts/install-node-peers fills its node_modules from the lock file.
AZURITE_DIR = Path(__file__).resolve().parents[1] / "egress" / "azurite_server"
#: Azurite's well-known development account (public, documented by Microsoft).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def require_azurite() -> str:
    """The azurite-blob launcher at its locked version; else RuntimeError (never a skip)."""
    hint = "run `make test` (scripts/install-node-peers)"
    if shutil.which("node") is None:
        raise RuntimeError(f"node is not installed (Node.js >= 18 is needed): {hint}")
    modules = AZURITE_DIR / "node_modules"
    lock = (AZURITE_DIR / "package-lock.json").read_bytes()
    stamp = modules / ".unskit-lock.sha256"
    launcher = modules / ".bin" / "azurite-blob"
    if (
        not launcher.exists()
        or not stamp.is_file()
        or stamp.read_text().strip() != hashlib.sha256(lock).hexdigest()
    ):
        raise RuntimeError(f"azurite is not installed at its locked version: {hint}")
    return str(launcher)


@dataclass
class Azurite:
    """One azurite-blob process; its data lives in `folder`, so a restart on the same port
    keeps what was stored (a destination that was down, not one that was wiped)."""

    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    #: With a PKI: HTTPS with its server certificate (for 127.0.0.1).
    tls: Pki | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.url};"
        )

    def start(self) -> Azurite:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / "azurite.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    require_azurite(),
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    str(self.port),
                    "--location",
                    str(self.folder / "data"),
                    "--skipApiVersionCheck",
                    "--disableTelemetry",
                    "--silent",
                    *(
                        ["--cert", str(self.tls.server_cert), "--key", str(self.tls.server_key)]
                        if self.tls
                        else []
                    ),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_until(self._listening, 60, f"azurite on port {self.port}", interval=0.05)
        return self

    def _listening(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = (self.folder / "azurite.log").read_text(errors="replace")
            raise RuntimeError(f"azurite exited with {self.process.returncode}: {log[-2000:]}")
        return port_open(self.port)

    def stop(self) -> None:
        terminate(self.process)
        self.process = None

    def service(self) -> Any:
        """A BlobServiceClient of the SDK itself (the tests' independent view of the store)."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient(
            self.url,
            credential={"account_name": ACCOUNT, "account_key": ACCOUNT_KEY},
            retry_total=0,
            connection_verify=str(self.tls.ca) if self.tls else True,
        )

    def container(self) -> str:
        """A new, empty container."""
        name = f"c-{uuid.uuid4().hex[:12]}"
        with self.service() as service:
            service.create_container(name)
        return name

    def destination(self, container: str, **settings: Any) -> dict[str, Any]:
        """A blobstore egress entry for this server (the public development key)."""
        return {
            "type": "blobstore",
            "account": ACCOUNT,
            "container": container,
            "endpointUrl": self.url,
            "accountKey": ACCOUNT_KEY,
            **({"caPath": str(self.tls.ca)} if self.tls else {}),
            **settings,
        }
