"""HTTP peers of the file-egress `http` tests.

`Httpd`: Debian's Apache httpd with mod_dav/mod_dav_fs on a free loopback port, its own
configuration, pid file and DAV lock database under a private folder (`apache2 -f conf
-DFOREGROUND`). mod_dav_fs honours `Content-Range` on PUT (it writes at the offset), which is
the ranged-upload convention the backend resumes with. `/dav/` is open; `/secure/` asks for
HTTP Basic credentials (USER / PASSWORD, an htpasswd file).

`UploadServer`: a small in-process HTTP/1.1 server for what Apache does not do: POST
uploads, a server that cannot resume, one that lies about its offset, a 5xx storm, bearer
tokens and a digest header. Files are kept in memory by path.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.servers import free_port, port_open, require_binary, wait_until

USER = "uploader"
#: Secrets the tests look for in logs and reprs.
PASSWORD = "httpd-test-password-value"
TOKEN = "httpd-test-bearer-token-value"

_MODULES = (
    "mpm_event",
    "authz_core",
    "authn_core",
    "authn_file",
    "authz_user",
    "auth_basic",
    "dav",
    "dav_fs",
)


@dataclass
class Httpd:
    """Apache httpd serving `www` (DAV) at /dav/ and /secure/ on 127.0.0.1:`port`."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    #: Where the server's folder is made (None: the system's temporary directory).
    parent: Path | None = None

    def __post_init__(self) -> None:
        # Not under pytest's tmp_path: the workers run as www-data when started by root,
        # and pytest's folders are private to their owner.
        self.folder = Path(tempfile.mkdtemp(prefix="unskit-httpd-", dir=self.parent))
        self.folder.chmod(0o755)
        self.www = self.folder / "www"
        self.lock = self.folder / "lock"
        self.run = self.folder / "run"
        for directory in (self.www, self.www / "dav", self.www / "secure", self.lock, self.run):
            directory.mkdir(mode=0o755, exist_ok=True)
        self.log = self.folder / "error.log"
        passwords = self.folder / "htpasswd"
        subprocess.run(
            [require_binary("htpasswd"), "-b", "-c", "-B", str(passwords), USER, PASSWORD],
            check=True,
            capture_output=True,
        )
        passwords.chmod(0o644)
        if os.geteuid() == 0:
            # Workers run as www-data: they write the files and the lock database.
            for directory in (self.www, self.www / "dav", self.www / "secure", self.lock):
                shutil.chown(directory, "www-data", "www-data")
        modules = "\n".join(
            f"LoadModule {m}_module /usr/lib/apache2/modules/mod_{m}.so" for m in _MODULES
        )
        self.config = self.folder / "httpd.conf"
        self.config.write_text(
            f"""ServerRoot "/etc/apache2"
ServerName 127.0.0.1
Listen 127.0.0.1:{self.port}
PidFile {self.run}/httpd.pid
DefaultRuntimeDir {self.run}
Mutex file:{self.run}
User www-data
Group www-data
ErrorLog {self.log}
LogLevel warn
{modules}
DAVLockDB {self.lock}/davlock
DocumentRoot {self.www}
<Directory {self.www}>
  Require all denied
</Directory>
<Directory {self.www}/dav>
  Dav On
  Require all granted
</Directory>
<Directory {self.www}/secure>
  Dav On
  AuthType Basic
  AuthName "egress"
  AuthBasicProvider file
  AuthUserFile {passwords}
  Require valid-user
</Directory>
"""
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Httpd:
        apache = require_binary("apache2")
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [apache, "-f", str(self.config), "-DFOREGROUND"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(
            lambda: port_open(self.port) or self.process is None or self.process.poll() is not None,
            30,
            f"apache2 on port {self.port}",
            interval=0.02,
        )
        if self.process.poll() is not None:
            raise RuntimeError(f"apache2 exited: {self.log.read_text()}")
        return self

    def stop(self) -> None:
        """Stops this server (its own process only); its files stay until `remove`."""
        if self.process is not None and self.process.poll() is None:
            # SIGTERM to the -DFOREGROUND parent stops its workers too.
            self.process.terminate()
            self.process.wait(15)
        self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def leftovers(self) -> list[Path]:
        """Temporary files mod_dav_fs left in the served tree (none after a clean upload)."""
        return [p for p in self.www.rglob("*") if p.is_file() and ".davfs" in p.name]

    def destination(self, area: str = "dav", **settings: Any) -> dict[str, Any]:
        """An http egress entry for this server under /<area>/."""
        return {"type": "http", "url": f"{self.url}/{area}/", **settings}


@dataclass
class Behaviour:
    """How `UploadServer` misbehaves; tests change it while it runs."""

    #: Answers a ranged PUT (Content-Range) with this status instead of honouring it.
    refuse_ranges: int | None = None
    #: Adds this many bytes to the Content-Length a HEAD reports.
    lie_offset: int = 0
    #: Answers the next N requests with `storm_status`.
    storm: int = 0
    storm_status: int = 503
    #: Required `Authorization` header value (None: no authentication).
    authorization: str | None = None
    #: Sends `Repr-Digest` (sha-256 and crc32c) on HEAD, PUT and POST answers.
    digest: bool = False
    #: Flips a byte of every stored upload (a server that corrupts what it stores).
    corrupt: bool = False
    #: Answers a ranged GET with the whole object (200), as a server without ranges does.
    whole_gets: bool = False


class UploadServer:
    """A threaded HTTP/1.1 server holding uploads in memory, with fault injection."""

    def __init__(self) -> None:
        self.files: dict[str, bytearray] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.behaviour = Behaviour()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                chunks = []
                while length > 0:
                    chunk = self.rfile.read(min(length, 1 << 20))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    length -= len(chunk)
                return b"".join(chunks)

            def _reply(self, status: int, body: bytes = b"", **headers: str) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _digest(self, data: bytes | bytearray) -> dict[str, str]:
                if not server.behaviour.digest:
                    return {}
                from unskit.digests import Crc32c

                crc = Crc32c()
                crc.update(bytes(data))
                sha = base64.b64encode(hashlib.sha256(data).digest()).decode()
                crc32c = base64.b64encode(crc.digest()).decode()
                return {"Repr_Digest": f"sha-256=:{sha}:, crc32c=:{crc32c}:"}

            def _gate(self, body: bool) -> bool:
                """Records the request; False when it was answered already (fault)."""
                with server.lock:
                    server.requests.append((self.command, self.path, dict(self.headers)))
                    behaviour = server.behaviour
                    storm = behaviour.storm > 0
                    if storm:
                        behaviour.storm -= 1
                if body:
                    self._body_cache = self._body()
                if storm:
                    self._reply(behaviour.storm_status, b"storm")
                    return False
                wanted = behaviour.authorization
                if wanted is not None and self.headers.get("Authorization") != wanted:
                    self._reply(401, b"no", WWW_Authenticate='Basic realm="egress"')
                    return False
                return True

            def do_HEAD(self) -> None:
                if not self._gate(False):
                    return
                data = server.files.get(self.path)
                if data is None:
                    self._reply(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data) + server.behaviour.lie_offset))
                for name, value in self._digest(data).items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()

            def do_GET(self) -> None:
                if not self._gate(False):
                    return
                data = server.files.get(self.path)
                if data is None:
                    self._reply(404)
                    return
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if match is None or server.behaviour.whole_gets:
                    self._reply(200, bytes(data))
                    return
                start = int(match[1])
                end = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
                self._reply(
                    206,
                    bytes(data[start : end + 1]),
                    Content_Range=f"bytes {start}-{end}/{len(data)}",
                )

            def do_PUT(self) -> None:
                if not self._gate(True):
                    return
                body = self._body_cache
                ranged = self.headers.get("Content-Range")
                behaviour = server.behaviour
                if ranged is not None and behaviour.refuse_ranges is not None:
                    self._reply(behaviour.refuse_ranges, b"no ranges here")
                    return
                with server.lock:
                    if ranged is None:
                        stored = server.files[self.path] = bytearray(body)
                    else:
                        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", ranged)
                        if match is None:
                            self._reply(400, b"bad Content-Range")
                            return
                        start = int(match[1])
                        stored = server.files.setdefault(self.path, bytearray())
                        if len(stored) < start:
                            stored.extend(bytes(start - len(stored)))
                        stored[start : start + len(body)] = body
                    if behaviour.corrupt and stored:
                        stored[0] ^= 0xFF
                self._reply(204 if ranged else 201, **self._digest(stored))

            def do_POST(self) -> None:
                if not self._gate(True):
                    return
                with server.lock:
                    stored = server.files[self.path] = bytearray(self._body_cache)
                    if server.behaviour.corrupt and stored:
                        stored[0] ^= 0xFF
                self._reply(201, **self._digest(stored))

            def do_DELETE(self) -> None:
                if not self._gate(False):
                    return
                with server.lock:
                    gone = server.files.pop(self.path, None)
                self._reply(204 if gone is not None else 404)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UploadServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)

    def count(self, method: str) -> int:
        with self.lock:
            return sum(1 for m, _, _ in self.requests if m == method)

    def destination(self, **settings: Any) -> dict[str, Any]:
        return {"type": "http", "url": f"{self.url}/up/", **settings}
