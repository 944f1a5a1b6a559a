"""cpppo's Logix simulator, a real EtherNet/IP target for the CIP adapter tests. It keeps
tag values only while it runs; a restart on the same port brings back fresh tags."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.servers import free_port, port_open, terminate, wait_until


@dataclass
class LogixSimulator:
    """`python -m cpppo.server.enip` on 127.0.0.1 with tags like ``Temp=REAL`` or
    ``Counts=DINT[10]``."""

    tags: Sequence[str]
    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    #: The module run with ``python -m``: cpppo's server, or a launcher of it with other types.
    module: str = "cpppo.server.enip"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> LogixSimulator:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = (self.folder / "cpppo.log").open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.module,
                "--address",
                self.endpoint,
                *self.tags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_until(self._up, 20, f"cpppo on {self.endpoint}", interval=0.02)
        return self

    def _up(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = (self.folder / "cpppo.log").read_text(errors="replace")
            raise RuntimeError(f"cpppo exited with {self.process.returncode}:\n{log[-2000:]}")
        return port_open(self.port)

    def stop(self) -> None:
        terminate(self.process)
        self.process = None
