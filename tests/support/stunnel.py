"""stunnel in mutual-TLS mode in front of a plaintext TCP target (cpppo's simulator), and an
`openssl s_server` that offers chosen suites only: the CIP Security tests' TLS peers."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.servers import free_port, port_open, require_binary, terminate, wait_until


@dataclass
class Stunnel:
    """A TLS server on 127.0.0.1:`port` forwarding to 127.0.0.1:`target_port`. It presents
    `cert_chain`/`key` and requires a client certificate chaining to `client_ca`."""

    folder: Path
    target_port: int
    cert_chain: Path
    key: Path
    client_ca: Path
    port: int = field(default_factory=free_port)
    #: OpenSSL cipher strings; None leaves stunnel's defaults.
    ciphers: str | None = None
    ciphersuites: str | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Stunnel:
        binary = require_binary("stunnel4")
        self.folder.mkdir(parents=True, exist_ok=True)
        lines = [
            "foreground = yes",
            "pid =",
            "debug = 5",
            f"output = {self.folder / 'stunnel.log'}",
            "[cip]",
            f"accept = 127.0.0.1:{self.port}",
            f"connect = 127.0.0.1:{self.target_port}",
            f"cert = {self.cert_chain}",
            f"key = {self.key}",
            f"CAfile = {self.client_ca}",
            "verifyChain = yes",
            "requireCert = yes",
            "sslVersionMin = TLSv1.2",
            # Small request/reply records: without these, Nagle and delayed ACKs add
            # tens of milliseconds per CIP request on each side of the tunnel.
            "socket = l:TCP_NODELAY=1",
            "socket = r:TCP_NODELAY=1",
        ]
        if self.ciphers is not None:
            lines.append(f"ciphers = {self.ciphers}")
        if self.ciphersuites is not None:
            lines.append(f"ciphersuites = {self.ciphersuites}")
        config = self.folder / "stunnel.conf"
        config.write_text("\n".join(lines) + "\n")
        log = (self.folder / "stunnel.out").open("ab")
        self.process = subprocess.Popen([binary, str(config)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(self._up, 20, f"stunnel on {self.endpoint}", interval=0.02)
        return self

    def _up(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(
                f"stunnel exited with {self.process.returncode}: {self.log()[-2000:]}"
            )
        return port_open(self.port)

    def log(self) -> str:
        text = ""
        for name in ("stunnel.out", "stunnel.log"):
            path = self.folder / name
            if path.exists():
                text += path.read_text(errors="replace")
        return text

    def stop(self) -> None:
        terminate(self.process)
        self.process = None


@dataclass
class OpenSslServer:
    """`openssl s_server` on 127.0.0.1 offering only the TLS 1.2 `cipher` or the TLS 1.3
    `ciphersuites` given (a device with no suite in the client's allow-list)."""

    folder: Path
    cert_chain: Path
    key: Path
    port: int = field(default_factory=free_port)
    cipher: str | None = None
    ciphersuites: str | None = None
    tls12_only: bool = False
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> OpenSslServer:
        binary = require_binary("openssl")
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [binary, "s_server", "-accept", f"127.0.0.1:{self.port}", "-naccept", "100"]
        args += ["-cert", str(self.cert_chain), "-key", str(self.key), "-quiet"]
        if self.tls12_only:
            args.append("-tls1_2")
        if self.cipher is not None:
            args += ["-cipher", self.cipher]
        if self.ciphersuites is not None:
            args += ["-ciphersuites", self.ciphersuites]
        log = (self.folder / "s_server.log").open("ab")
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_until(self._up, 20, f"openssl s_server on {self.endpoint}", interval=0.02)
        return self

    def _up(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            text = (self.folder / "s_server.log").read_text(errors="replace")
            raise RuntimeError(f"s_server exited with {self.process.returncode}: {text[-2000:]}")
        return port_open(self.port)

    def stop(self) -> None:
        terminate(self.process)
        self.process = None
