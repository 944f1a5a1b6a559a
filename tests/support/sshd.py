"""Debian's OpenSSH sshd on a free loopback port with its own configuration, host key and
client key under a temporary folder (`sshd -D -e -f config`), serving SFTP with
internal-sftp. Key authentication, and password authentication for one real account made by
scripts/install-system-deps (`password_account`), which may use sftp only."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.servers import free_port, port_open, require_binary, wait_until

#: The passphrase of the client key: a secret the tests look for in logs.
PASSPHRASE = "sshd-test-passphrase-value"
#: A real account with a password (made by scripts/install-system-deps): its home takes
#: uploads, its password is random and readable by root only.
PASSWORD_USER = "unskit-sftp"
PASSWORD_FILE = Path("/var/lib/unskit-test/sftp-password")


@dataclass(frozen=True)
class PasswordAccount:
    user: str
    password: str
    home: Path
    uid: int


def password_account() -> PasswordAccount:
    """The sftp password-login account; in CI its absence fails the test run."""
    import pwd

    try:
        entry = pwd.getpwnam(PASSWORD_USER)
        password = PASSWORD_FILE.read_text().strip()
    except (KeyError, OSError) as error:
        raise RuntimeError(
            f"the sftp test account {PASSWORD_USER} is missing ({error}): run `make test` "
            "(scripts/install-system-deps)"
        ) from error
    return PasswordAccount(PASSWORD_USER, password, Path(entry.pw_dir), entry.pw_uid)


def _keygen(path: Path, passphrase: str = "") -> None:
    subprocess.run(
        [require_binary("ssh-keygen"), "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)],
        check=True,
    )


@dataclass
class Sshd:
    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.host_key = self.folder / "host_ed25519"
        self.client_key = self.folder / "client_ed25519"
        self.other_key = self.folder / "other_ed25519"  # a host key nobody pinned
        if not self.host_key.exists():
            _keygen(self.host_key)
            _keygen(self.other_key)
            _keygen(self.client_key, PASSPHRASE)
            (self.folder / "authorized_keys").write_bytes(
                self.client_key.with_suffix(".pub").read_bytes()
            )
        self.log = self.folder / "sshd.log"
        self.config = self.folder / "sshd_config"
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.folder / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.folder / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "UsePAM no",
                    # The files live in a temporary folder, not in a home directory.
                    "StrictModes no",
                    "Subsystem sftp internal-sftp",
                    "LogLevel VERBOSE",
                    # The password-login account (scripts/install-system-deps), sftp only.
                    f"Match User {PASSWORD_USER}",
                    "    PasswordAuthentication yes",
                    "    ForceCommand internal-sftp",
                    "",
                ]
            )
        )

    @property
    def user(self) -> str:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name

    def host_key_line(self, path: Path | None = None) -> str:
        """The public key line of the host key (or of `path`'s key), as a pin."""
        return (path or self.host_key).with_suffix(".pub").read_text().strip()

    def start(self) -> Sshd:
        sshd = require_binary("sshd")
        if os.geteuid() == 0:
            # Privilege separation (root only) needs this directory; a system sshd would
            # have made it.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        subprocess.run([sshd, "-t", "-f", str(self.config)], check=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(lambda: port_open(self.port), 30, f"sshd on port {self.port}", interval=0.02)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # The -D parent; the children of open connections end with their sockets.
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def destination(self, base_dir: Path, **settings: Any) -> dict[str, Any]:
        """An sftp egress entry for this server: the client key with its plaintext
        passphrase, the host key pinned."""
        return {
            "type": "sftp",
            "host": "127.0.0.1",
            "port": self.port,
            "baseDir": str(base_dir),
            "username": self.user,
            "privateKey": str(self.client_key),
            "passphrase": PASSPHRASE,
            "hostKey": self.host_key_line(),
            **settings,
        }
