"""A real Mosquitto broker for tests: plain, password, TLS and mutual-TLS listeners on free
loopback ports, TCP_NODELAY on, sessions persisted across a restart."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.pki import Pki
from tests.support.servers import free_port, port_open, require_binary, wait_until

USERNAME = "edge"
PASSWORD = "s3cret"


@dataclass
class Mosquitto:
    folder: Path
    pki: Pki
    plain_port: int = field(default_factory=free_port)
    password_port: int = field(default_factory=free_port)
    tls_port: int = field(default_factory=free_port)
    mtls_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.folder / "mosquitto.log"

    def write_config(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        passwd = self.folder / "passwd"
        passwd.unlink(missing_ok=True)
        subprocess.run(
            [require_binary("mosquitto_passwd"), "-c", "-b", str(passwd), USERNAME, PASSWORD],
            check=True,
            capture_output=True,
        )
        passwd.chmod(0o600)
        pki = self.pki
        tls = f"cafile {pki.ca}\ncertfile {pki.server_cert}\nkeyfile {pki.server_key}\n"
        lines = [
            "per_listener_settings true",
            # As root, mosquitto would drop to a user that cannot read our 0600 keys.
            "user root" if os.geteuid() == 0 else "",
            "persistence true",
            f"persistence_location {self.folder}/",
            "log_dest stdout",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "max_queued_messages 100000",
            "set_tcp_nodelay true",
            f"listener {self.plain_port} 127.0.0.1",
            "allow_anonymous true",
            f"listener {self.password_port} 127.0.0.1",
            "allow_anonymous false",
            f"password_file {passwd}",
            f"listener {self.tls_port} 127.0.0.1",
            "allow_anonymous true",
            tls,
            f"listener {self.mtls_port} 127.0.0.1",
            "allow_anonymous false",
            tls,
            "require_certificate true",
            "use_identity_as_username true",
        ]
        config = self.folder / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self) -> Mosquitto:
        config = self.write_config()
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [require_binary("mosquitto"), "-c", str(config)], stdout=log, stderr=log
            )
        ports = (self.plain_port, self.password_port, self.tls_port, self.mtls_port)
        wait_until(
            lambda: self._alive() and all(port_open(p) for p in ports),
            10,
            f"mosquitto listening on {ports} (log: {self.log_path})",
        )
        return self

    def _alive(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {self.log_path.read_text()[-2000:]}")
        return True

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()  # SIGTERM: mosquitto saves its sessions first
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: sessions and queued messages not yet saved are lost."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(5)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()
