"""pyftpdlib's TLS_FTPHandler in a subprocess on a free loopback port, one user with a
password, TLS required on the control and data connections; explicit (AUTH TLS) or
implicit (TLS from the first byte) with a certificate from `tests.support.pki`.

Run as `python -m tests.support.ftps ROOT PORT CERT KEY USER PASSWORD explicit|implicit`."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.pki import Pki
from tests.support.servers import free_port, port_open, wait_until

USER = "edge"
#: The account's password: a secret the tests look for in logs.
PASSWORD = "ftps-test-password-value"
REPO = Path(__file__).parents[2]


@dataclass
class FtpsServer:
    root: Path
    pki: Pki
    implicit: bool = False
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> FtpsServer:
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root.with_name(f"{self.root.name}-ftpd.log")
        command = [
            sys.executable,
            "-m",
            "tests.support.ftps",
            str(self.root),
            str(self.port),
            str(self.pki.server_cert),
            str(self.pki.server_key),
            USER,
            PASSWORD,
            "implicit" if self.implicit else "explicit",
        ]
        with log.open("ab") as out:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        wait_until(lambda: port_open(self.port), 30, f"pyftpdlib on port {self.port}", 0.02)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def destination(self, base_dir: str, **settings: Any) -> dict[str, Any]:
        """An ftps egress entry for this server (plaintext test password, the test CA)."""
        return {
            "type": "ftps",
            "host": "127.0.0.1",
            "port": self.port,
            "baseDir": base_dir,
            "username": USER,
            "password": PASSWORD,
            "explicitTls": not self.implicit,
            "caPath": str(self.pki.ca),
            **settings,
        }


def _serve(argv: list[str]) -> None:
    from pyftpdlib.authorizers import DummyAuthorizer
    from pyftpdlib.handlers import TLS_FTPHandler
    from pyftpdlib.servers import FTPServer

    root, port, cert, key, user, password, mode = argv
    authorizer = DummyAuthorizer()
    authorizer.add_user(user, password, root, perm="elradfmwMT")

    class Handler(TLS_FTPHandler):  # type: ignore[misc]
        certfile = cert
        keyfile = key
        tls_control_required = True
        tls_data_required = True

        def handle(self) -> None:
            if mode == "implicit":
                # Implicit TLS: the handshake comes before the greeting, which pyftpdlib
                # queues until the handshake is done.
                self.secure_connection(self.ssl_context)
            super().handle()

    Handler.authorizer = authorizer
    FTPServer(("127.0.0.1", int(port)), Handler).serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1:])
