"""gcp-storage-emulator (PyPI, pure Python) on a free loopback port: the Cloud Storage peer
of the bucketstore tests. In-memory, so a restart on the same port comes back with only its
default bucket and no resumable sessions (a server that lost them). It checks no
credentials: any bearer token, or none, is accepted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.servers import free_port, terminate, wait_until

BUCKET = "edge-bkt"
TOKEN = "ya29.test-bearer-token-value"


def _binary() -> str:
    found = Path(sys.executable).with_name("gcp-storage-emulator")
    path = str(found) if found.exists() else shutil.which("gcp-storage-emulator")
    if path is None:
        raise RuntimeError("gcp-storage-emulator is not installed: run `make build` (test extra)")
    return path


@dataclass
class GcsEmulator:
    log_path: Path
    port: int = field(default_factory=free_port)
    bucket: str = BUCKET
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=0.5):
                return True
        except urllib.error.HTTPError:
            return True  # an HTTP answer of any status: the server is up
        except OSError:
            return False

    def start(self) -> GcsEmulator:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    _binary(),
                    "start",
                    "--host=127.0.0.1",
                    f"--port={self.port}",
                    "--in-memory",
                    f"--default-bucket={self.bucket}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self.answers, 30, f"gcp-storage-emulator on port {self.port}", interval=0.05)
        return self

    def stop(self) -> None:
        terminate(self.process)
        self.process = None

    def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as reply:
            data = reply.read()
        return json.loads(data) if data else None

    def create_bucket(self, name: str) -> None:
        self._call("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode())

    def read(self, name: str, bucket: str | None = None) -> bytes:
        """The object's bytes (HTTPError 404 when there is none)."""
        quoted = urllib.parse.quote(name, safe="")
        url = f"{self.url}/download/storage/v1/b/{bucket or self.bucket}/o/{quoted}?alt=media"
        with urllib.request.urlopen(url, timeout=30) as reply:
            return bytes(reply.read())

    def names(self, bucket: str | None = None) -> list[str]:
        """The names of every object in the bucket."""
        listing = self._call("GET", f"/storage/v1/b/{bucket or self.bucket}/o")
        return sorted(item["name"] for item in (listing or {}).get("items", []))

    def destination(self, **settings: Any) -> dict[str, Any]:
        """A bucketstore egress entry for this server (a plaintext test token)."""
        return {
            "type": "bucketstore",
            "bucket": self.bucket,
            "endpointUrl": self.url,
            "accessToken": TOKEN,
            **settings,
        }
