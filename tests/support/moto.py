"""moto's S3 in server mode (`moto_server`) on a free loopback port; in-memory, so a
restart on the same port comes back empty (a destination that was down)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.servers import free_port, wait_until

REGION = "us-east-1"
ACCESS_KEY = "testing-access"
SECRET_KEY = "testing-secret-value"


def _moto_binary() -> str:
    found = Path(sys.executable).with_name("moto_server")
    path = str(found) if found.exists() else shutil.which("moto_server")
    if path is None:
        raise RuntimeError("moto_server is not installed: run `make build` (the test extra)")
    return path


@dataclass
class MotoServer:
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=0.5):
                return True
        except urllib.error.HTTPError:
            return True  # an HTTP answer of any status: the server is up
        except OSError:
            return False

    def start(self) -> MotoServer:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [_moto_binary(), "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self.answers, 30, f"moto_server on port {self.port}", interval=0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def destination(self, bucket: str, **settings: Any) -> dict[str, Any]:
        """An objectstore egress entry for this server (plaintext test credentials)."""
        return {
            "type": "objectstore",
            "bucket": bucket,
            "endpointUrl": self.url,
            "region": REGION,
            "credentials": {"accessKeyId": ACCESS_KEY, "secretAccessKey": SECRET_KEY},
            **settings,
        }
