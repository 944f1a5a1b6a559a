"""Debian's vsftpd on a free loopback port with its own configuration: an anonymous upload
account forced to TLS on the control and data connections, with vsftpd's default
`require_ssl_reuse=YES` (a data connection must resume the control connection's TLS session;
stock `ftplib.FTP_TLS` fails that). Local users would need PAM and a login shell, so the
account is the anonymous one, chrooted at `anon_root`, uploading under `up/`.

The same interface as `tests.support.ftps.FtpsServer`: `root` is where uploads land,
`destination()` an ftps egress entry for this server."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.pki import Pki
from tests.support.servers import free_port, port_open, require_binary, wait_until

#: The folder under the anonymous root that the account may write (the root itself must
#: not be writable, vsftpd refuses a writable chroot).
UPLOADS = "up"


@dataclass
class Vsftpd:
    folder: Path
    pki: Pki
    port: int = field(default_factory=free_port)
    implicit: bool = False
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.anon_root = self.folder / "anon"
        #: Where uploads land (the account's `up/` folder).
        self.root = self.anon_root / UPLOADS
        self.log = self.folder / "vsftpd.log"
        self.config = self.folder / "vsftpd.conf"

    def start(self) -> Vsftpd:
        binary = require_binary("vsftpd")
        ftp = pwd.getpwnam("ftp")
        empty = self.folder / "empty"
        for path in (self.anon_root, self.root, empty):
            path.mkdir(parents=True, exist_ok=True)
        os.chown(self.root, ftp.pw_uid, grp.getgrnam("ftp").gr_gid)
        self.anon_root.chmod(0o555)
        empty.chmod(0o555)
        self.config.write_text(
            "\n".join(
                [
                    "listen=YES",
                    "listen_ipv6=NO",
                    "listen_address=127.0.0.1",
                    f"listen_port={self.port}",
                    "background=NO",
                    "anonymous_enable=YES",
                    "local_enable=NO",
                    "write_enable=YES",
                    "anon_upload_enable=YES",
                    "anon_mkdir_write_enable=YES",
                    # Overwrite with REST, rename and delete.
                    "anon_other_write_enable=YES",
                    "anon_umask=022",
                    f"anon_root={self.anon_root}",
                    "no_anon_password=YES",
                    "ftp_username=ftp",
                    "ssl_enable=YES",
                    f"implicit_ssl={'YES' if self.implicit else 'NO'}",
                    "allow_anon_ssl=YES",
                    "force_anon_logins_ssl=YES",
                    "force_anon_data_ssl=YES",
                    "require_ssl_reuse=YES",
                    "ssl_ciphers=HIGH",
                    f"rsa_cert_file={self.pki.server_cert}",
                    f"rsa_private_key_file={self.pki.server_key}",
                    "pasv_enable=YES",
                    "pasv_address=127.0.0.1",
                    # No seccomp filter: the container refuses prctl(PR_SET_SECCOMP).
                    "seccomp_sandbox=NO",
                    f"secure_chroot_dir={empty}",
                    "xferlog_enable=YES",
                    "xferlog_std_format=NO",
                    f"vsftpd_log_file={self.log}",
                    "log_ftp_protocol=YES",
                    "",
                ]
            )
        )
        with (self.folder / "vsftpd.out").open("ab") as out:
            self.process = subprocess.Popen(
                [binary, str(self.config)], stdout=out, stderr=subprocess.STDOUT
            )
        wait_until(lambda: port_open(self.port), 30, f"vsftpd on port {self.port}", 0.02)
        if self.process.poll() is not None:
            raise RuntimeError(f"vsftpd exited: {(self.folder / 'vsftpd.out').read_text()}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def destination(self, base_dir: str, **settings: Any) -> dict[str, Any]:
        """An ftps egress entry for this server: anonymous, under `up/`, the test CA."""
        return {
            "type": "ftps",
            "host": "127.0.0.1",
            "port": self.port,
            "baseDir": f"{UPLOADS}/{base_dir}",
            "username": "anonymous",
            "password": "egress@example.invalid",
            "explicitTls": not self.implicit,
            "caPath": str(self.pki.ca),
            **settings,
        }
