"""Capturing loopback traffic with tshark and reading it back as fields, for tests that let
Wireshark's dissectors judge what went over the wire.

    with LoopbackCapture(tmp_path / "x.pcapng", "tcp port 1234 or udp port 5678") as capture:
        ...traffic...
    rows = capture.read(["enip.command"], decode_as=["tcp.port==1234,enip"])

`start()` returns once a marker datagram sent through the capture has come back out of it,
so nothing sent after it is missed; `stop()` does the same before it ends tshark, so every
packet sent before it is in the file. Markers go to a port nobody listens on and `read`
leaves them out. Capturing needs root or the capture capabilities (the test machines run
tests as root).
"""

from __future__ import annotations

import errno
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tests.support.servers import require_binary

T = TypeVar("T")

#: Wireshark 4.0 tells ENIP requests from replies only by TCP port 44818 (a reply is from it),
#: and only a paired Forward Open links class-1 datagrams to their connection: a capture
#: meant for its CIP fields needs the target listening there (UDP ports may be any; the
#: Sockaddr Info items name them).
ENIP_TCP_PORT = 44818


#: 44818 lies in the kernel's ephemeral range: besides another test's target, any outgoing
#: connection of the suite (an MQTT client held for a whole module) may be using it as its
#: local port, so the wait allows for a long hold.
ENIP_PORT_WAIT_S = 180.0


def on_enip_port(start: Callable[[int], T], timeout: float = ENIP_PORT_WAIT_S) -> T:
    """`start(ENIP_TCP_PORT)`, retried while the port is in use (another test, or an outgoing
    connection, holding it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return start(ENIP_TCP_PORT)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # a poll of a resource we cannot wait on, bounded by the deadline


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopbackCapture:
    """A tshark capture on `lo` with a BPF filter, written to `path` (pcapng)."""

    def __init__(self, path: Path, bpf: str, *, interface: str = "lo") -> None:
        self.path = Path(path)
        self.bpf = bpf
        self.interface = interface
        self.marker_port = _free_udp_port()
        self._tshark = require_binary("tshark")
        self._process: subprocess.Popen[str] | None = None
        self._seen: list[str] = []
        self._seen_changed = threading.Condition()
        self._reader: threading.Thread | None = None
        self._stderr = ""
        self._marker = 0

    def start(self, timeout: float = 20.0) -> LoopbackCapture:
        """Starts tshark; returns once a marker datagram shows the capture is live."""
        bpf = f"({self.bpf}) or (udp dst port {self.marker_port})"
        # -P -l: tshark prints each packet as it has been written; a marker printed means
        # the marker, and everything captured before it, is in the file.
        command = [
            self._tshark, "-n", "-i", self.interface, "-f", bpf, "-w", str(self.path),
            "-P", "-l", "-T", "fields", "-e", "udp.dstport", "-e", "data.data",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        try:
            self.sync(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def sync(self, timeout: float = 20.0) -> None:
        """Sends a marker and waits until tshark has written it (and all before it)."""
        self._marker += 1
        tag = f"unskit-capture-marker-{self._marker}"
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            while True:
                # Resent until seen: the first ones may go out before tshark listens.
                sender.sendto(tag.encode(), ("127.0.0.1", self.marker_port))
                with self._seen_changed:
                    self._seen_changed.wait_for(
                        lambda: tag.encode().hex() in self._seen or self._ended(), 0.25
                    )
                    if tag.encode().hex() in self._seen:
                        return
                if self._ended():
                    raise RuntimeError(f"tshark ended early: {self._stderr_text()}")
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"tshark did not capture its marker within {timeout} s: "
                        f"{self._stderr_text()}"
                    )

    def stop(self) -> None:
        """Ends tshark after a last marker (so the file holds everything sent so far)."""
        process = self._process
        if process is None:
            return
        try:
            if process.poll() is None:
                self.sync()
        finally:
            self._process = None
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
            if self._reader is not None:
                self._reader.join(5)
            assert process.stdout is not None
            assert process.stderr is not None
            self._stderr = process.stderr.read()
            process.stdout.close()
            process.stderr.close()

    def __enter__(self) -> LoopbackCapture:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def read(
        self,
        fields: Sequence[str],
        *,
        decode_as: Sequence[str] = (),
        display_filter: str = "",
        options: Sequence[str] = (),
    ) -> list[dict[str, list[str]]]:
        """The packets (markers left out) as {field: [values]}; a field a packet lacks is
        absent. `decode_as` entries are tshark -d arguments (``udp.port==2222,enip``)."""
        if self._process is not None:
            raise RuntimeError("stop the capture before reading it")
        own = f"!(udp.port == {self.marker_port})"
        shown = f"({display_filter}) && {own}" if display_filter else own
        command = [self._tshark, "-n", "-r", str(self.path), "-Y", shown, "-T", "json"]
        for rule in decode_as:
            command += ["-d", rule]
        for option in options:
            command += ["-o", option]
        for name in fields:
            command += ["-e", name]
        out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise AssertionError(f"tshark -r failed ({out.returncode}): {out.stderr}")
        packets: list[Any] = json.loads(out.stdout or "[]")
        return [packet["_source"]["layers"] for packet in packets]

    def problems(self, decode_as: Sequence[str] = ()) -> list[dict[str, list[str]]]:
        """Packets a dissector marks malformed or flags with a warning or worse."""
        return self.read(
            ["frame.number", "_ws.expert.message"],
            decode_as=decode_as,
            display_filter="_ws.malformed || _ws.expert.severity >= warning",
        )

    def _read_stdout(self) -> None:
        process = self._process
        assert process is not None
        assert process.stdout is not None
        for line in process.stdout:
            parts = line.rstrip("\n").split("\t")
            with self._seen_changed:
                if len(parts) > 1 and parts[1]:
                    self._seen.append(parts[1])
                self._seen_changed.notify_all()
        with self._seen_changed:
            self._seen_changed.notify_all()

    def _ended(self) -> bool:
        process = self._process
        return process is None or process.poll() is not None

    def _stderr_text(self) -> str:
        process = self._process
        if process is not None and process.poll() is not None and process.stderr is not None:
            return process.stderr.read()[-2000:]
        return self._stderr[-2000:]
