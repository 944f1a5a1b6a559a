"""The demo stack for the chaos suite, every part a real process on loopback: Mosquitto,
cpppo (the PLC the CIP adapter polls), the demo's CIP class-1 target and OPC UA server, the
four components (`unskit run`), and OpenSSH's sshd as the egress destination (files on disk,
so a restart keeps what was delivered). The camera's output root is a small tmpfs, the
components' wall clock runs through tests/chaos/clockshift.c, and a thread polls every
component's readiness probe and records each change."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cpppo import LogixSimulator
from tests.support.mosquitto import Mosquitto
from tests.support.pki import make_pki
from tests.support.servers import free_port, port_open, require_binary, wait_until
from tests.support.sshd import Sshd
from unskit.demo.plan import PLC, THING, demo_documents, demo_peers

#: The components, in start order (the egress first, so it sees the first capture).
COMPONENTS = (
    "file-egress",
    "signal-recorder",
    "ethernet-ip-adapter",
    "opcua-adapter",
    "camera-adapter",
)
PRODUCERS = ("camera-adapter", "ethernet-ip-adapter", "opcua-adapter")
#: MQTT keepalive of every component: a stopped broker is noticed within about twice it.
KEEPALIVE_S = 2
#: How often the readiness of each component is sampled.
PROBE_PERIOD_S = 0.2
#: The camera's output root: room for a few dozen images while the destination is down.
TMPFS_SIZE = "8m"
START_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 30.0
#: Tags of the cpppo PLC the CIP adapter's polled instance reads.
PLC_TAGS = ("SpindleSpeed=REAL", "PartCount=DINT")
HERE = Path(__file__).resolve().parent


def build_clockshift(folder: Path) -> Path:
    """Compiles the wall-clock shim into `folder` (a C compiler is there: the Rust build
    links with it)."""
    library = folder / "clockshift.so"
    subprocess.run(
        [require_binary("cc"), "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(library),
         str(HERE / "clockshift.c"), "-ldl"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return library


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (by parent links in /proc), children first."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def established_to(port: int) -> bool:
    """Whether a TCP connection to 127.0.0.1:`port` is established (the server's side of it,
    from /proc/net/tcp: state 01)."""
    local = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[3] == "01":
            return True
    return False


class SftpServer(Sshd):
    """The sftp destination, logging each file operation (internal-sftp -l INFO) so every
    rename into place can be counted on the server's side."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # internal-sftp's log does not reach sshd -e's stderr; sftp-server's -e does, and the
        # subsystem runs through the shell, which appends it to a file of ours.
        self.operations = self.folder / "sftp-operations.log"
        server = f"/usr/lib/openssh/sftp-server -l INFO -e 2>>{self.operations}"
        text = self.config.read_text()
        self.config.write_text(
            text.replace("Subsystem sftp internal-sftp", f"Subsystem sftp {server}")
        )

    def kill(self) -> None:
        """SIGKILL to the listener and every session process under it: the egress's
        connections drop mid-stream."""
        assert self.process is not None
        # Sessions call setsid(), so they are found by parentage, not by process group.
        below = descendants(self.process.pid)
        self.process.kill()
        self.process.wait(10)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process = None
        wait_until(lambda: not port_open(self.port), 10, "sshd's port closed")

    def renames(self) -> list[str]:
        """The targets of every posix-rename the server carried out, in order."""
        targets = []
        if not self.operations.exists():
            return []
        for line in self.operations.read_text(errors="replace").splitlines():
            # sftp-server: `posix-rename old "A" new "B"`
            if "posix-rename old" in line and ' new "' in line:
                targets.append(line.rsplit(' new "', 1)[1].rstrip('"'))
        return targets


@dataclass
class Readiness:
    """Transitions of each component's readiness, from a polling thread."""

    ports: dict[str, int]
    #: (monotonic time, component, ready) at each observed change (and the first sample).
    changes: list[tuple[float, str, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @staticmethod
    def probe(port: int) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="readiness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        last: dict[str, bool] = {}
        while not self._stop.wait(PROBE_PERIOD_S):
            for name, port in list(self.ports.items()):
                ready = self.probe(port)
                if last.get(name) != ready:
                    last[name] = ready
                    with self.lock:
                        self.changes.append((time.monotonic(), name, ready))

    def ready_at(self, name: str, when: float) -> bool:
        """The readiness of `name` last observed at or before `when`."""
        state = False
        with self.lock:
            for at, who, ready in self.changes:
                if who == name and at <= when:
                    state = ready
        return state

    def between(self, name: str, start: float, end: float) -> list[tuple[float, bool]]:
        with self.lock:
            return [
                (at, ready) for at, who, ready in self.changes if who == name and start <= at <= end
            ]


@dataclass
class Component:
    name: str
    config: Path
    health_port: int
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exit_code: int | None = None


class Stack:
    """Starts, disturbs and stops the whole stack under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.images = root / "images"
        self.delivered = root / "delivered"
        self.archive = root / "archive"
        self.logs = root / "logs"
        self.clock_file = root / "clock-offset-ms"
        self.broker = Mosquitto(root / "mosquitto", make_pki(root / "pki"))
        self.plc = LogixSimulator(PLC_TAGS, root / "cpppo")
        self.sftp = SftpServer(root / "sshd")
        self.opcua_port, self.cip_port = free_port(), free_port()
        self.peers: dict[str, subprocess.Popen[bytes]] = {}
        self.peer_exits: dict[str, int] = {}
        self.components: dict[str, Component] = {}
        self.readiness = Readiness({})
        self.mounted = False
        self.clockshift: Path | None = None
        self._filling = threading.Event()
        self._filler = threading.Thread()

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        if os.geteuid() != 0:
            # Not a skip: like a missing server, it is a failure of the run.
            raise RuntimeError("the chaos suite mounts a tmpfs for the camera: run it as root")
        for folder in (self.images, self.delivered, self.archive, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [require_binary("mount"), "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs",
             str(self.images)],
            check=True,
        )  # fmt: skip
        self.mounted = True
        self.set_clock_offset(0)
        self.clockshift = build_clockshift(self.root)
        self.broker.start()
        self.plc.start()
        self.sftp.start()
        for peer in demo_peers(self.opcua_port, self.cip_port):
            self.peers[peer.name] = self._spawn(peer.argv, peer.name, shifted=False)
        for peer in demo_peers(self.opcua_port, self.cip_port):
            wait_until(lambda p=peer: self._peer_up(p.name, p.port), START_TIMEOUT_S, peer.name)
        for name, document in self.documents():
            config = self.root / "config" / f"{name}.json"
            config.parent.mkdir(exist_ok=True)
            config.write_text(json.dumps(document, indent=2))
            self.components[name] = Component(name, config, document["health"]["port"])
            self.readiness.ports[name] = document["health"]["port"]
            self.start_component(name, wait=False)
        for name in self.components:
            self.wait_ready(name)
        self.readiness.start()

    def _peer_up(self, name: str, port: int) -> bool:
        if self.peers[name].poll() is not None:
            raise AssertionError(f"{name} exited: see {self.logs / (name + '.log')}")
        return port_open(port)

    def documents(self) -> list[tuple[str, dict[str, Any]]]:
        """The demo's documents, with the destination on sshd, the PLC on cpppo, a short
        keepalive, quick camera schedules and a health port each."""
        documents = demo_documents(self.root, self.opcua_port, self.cip_port)
        for name, document in documents:
            document["messaging"] = {
                "local": {
                    "host": "127.0.0.1",
                    "port": self.broker.plain_port,
                    "keepAliveSeconds": KEEPALIVE_S,
                }
            }
            document["health"] = {"enabled": True, "port": free_port()}
            document["heartbeat"] = {"intervalSeconds": 5}
            component = document["component"]
            if name == "file-egress":
                instance = component["instances"][0]
                instance["egress"] = [
                    self.sftp.destination(self.delivered, id="sftp", tempSuffix=".part")
                ]
                component["global"]["retry"] = {"initialBackoffMs": 200, "maxBackoffMs": 1000}
            elif name == "ethernet-ip-adapter":
                polled = component["instances"][0]
                assert polled["id"] == PLC
                del polled["adapter"]
                polled["connection"] = {"endpoint": self.plc.endpoint}
                polled["pollGroups"] = [
                    {
                        "id": "fast",
                        "pollIntervalMs": 250,
                        "signals": [
                            {"name": "spindle-speed", "tagPath": "SpindleSpeed", "type": "REAL"},
                            {"name": "part-count", "tagPath": "PartCount", "type": "DINT"},
                        ],
                    }
                ]
                component["global"]["timing"] = {
                    "connectMs": 1000,
                    "requestTimeoutMs": 1000,
                    "reconnectBackoffMinMs": 100,
                    "reconnectBackoffMaxMs": 500,
                }
            elif name == "camera-adapter":
                for camera, interval in zip(component["cameras"], (700, 900), strict=True):
                    camera["schedules"] = [{"id": "chaos", "intervalMs": interval}]
        return documents

    def _spawn(
        self, argv: tuple[str, ...] | list[str], log: str, *, shifted: bool
    ) -> subprocess.Popen[bytes]:
        """`unskit ARGV` behind unskit.demo.child (it dies with this process); with `shifted`,
        its wall clock runs at the offset in `clock_file`."""
        env = dict(os.environ)
        if shifted:
            assert self.clockshift is not None
            env["LD_PRELOAD"] = str(self.clockshift)
            env["UNSKIT_CHAOS_CLOCK_FILE"] = str(self.clock_file)
        command = [sys.executable, "-m", "unskit.demo.child", str(os.getpid()), *argv]
        with (self.logs / f"{log}.log").open("ab") as sink:
            return subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def start_component(self, name: str, *, wait: bool = True) -> None:
        component = self.components[name]
        argv = ["run", name, "-c", str(component.config), "-t", THING]
        component.process = self._spawn(argv, name, shifted=True)
        component.starts += 1
        if wait:
            self.wait_ready(name)

    def wait_ready(self, name: str, timeout: float = START_TIMEOUT_S) -> None:
        component = self.components[name]

        def ready() -> bool:
            assert component.process is not None
            if component.process.poll() is not None:
                log = (self.logs / f"{name}.log").read_text(errors="replace")
                raise AssertionError(
                    f"{name} exited {component.process.returncode}:\n{log[-3000:]}"
                )
            return Readiness.probe(component.health_port)

        wait_until(ready, timeout, f"{name} ready", interval=0.1)

    # -- faults -----------------------------------------------------------------------------

    def set_clock_offset(self, offset_ms: int) -> None:
        """The components' wall clock runs `offset_ms` ahead (behind if negative) from now."""
        temp = self.clock_file.with_suffix(".tmp")
        temp.write_text(f"{offset_ms}\n")
        temp.replace(self.clock_file)

    def kill_component(self, name: str) -> None:
        process = self.components[name].process
        assert process is not None
        process.kill()
        process.wait(10)

    def fill_storage(self) -> Path:
        """Fills the camera's tmpfs to the last byte with a file the egress does not ship, and
        keeps it full (the egress archiving a file frees room) until `empty_storage`."""
        filler = self.images / ".chaos-filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._top_up(fd)
        self._filling = threading.Event()

        def keep_full() -> None:
            try:
                while not self._filling.wait(0.02):  # the fault itself, not a synchronisation
                    self._top_up(fd)
            finally:
                os.close(fd)

        self._filler = threading.Thread(target=keep_full, name="chaos-filler", daemon=True)
        self._filler.start()
        return filler

    @staticmethod
    def _top_up(fd: int) -> None:
        # Large writes, then smaller ones, until not one byte more fits.
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):  # ENOSPC: full, as intended
                while True:
                    os.write(fd, b"\0" * size)

    def empty_storage(self) -> None:
        self._filling.set()
        self._filler.join(10)
        (self.images / ".chaos-filler").unlink()

    # -- stop -------------------------------------------------------------------------------

    def stop_components(self, names: tuple[str, ...]) -> None:
        """SIGTERM to each, then their exit codes (SIGKILL after the deadline: not 0)."""
        running = [self.components[n] for n in names if n in self.components]
        for component in running:
            if component.process is not None and component.process.poll() is None:
                component.process.send_signal(signal.SIGTERM)
        for component in running:
            if component.process is None:
                continue
            try:
                component.exit_code = component.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                component.process.kill()
                component.process.wait(10)
                component.exit_code = None
            component.process = None

    def stop(self) -> None:
        """Everything still running, in reverse start order; the tmpfs unmounted last."""
        try:
            self.readiness.stop()
            if self._filler.is_alive():  # a run cut short inside the storage fault
                self._filling.set()
                self._filler.join(10)
            self.stop_components(tuple(reversed(list(self.components))))
            for name, process in self.peers.items():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                try:
                    self.peer_exits[name] = process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
                    self.peer_exits[name] = -9
            self.peers.clear()
            with contextlib.suppress(OSError, ProcessLookupError):
                if self.broker.process is not None:
                    os.kill(self.broker.process.pid, signal.SIGCONT)
            self.broker.stop()
            self.plc.stop()
            self.sftp.stop()
        finally:
            if self.mounted:
                subprocess.run([require_binary("umount"), "-l", str(self.images)], check=False)
                self.mounted = False


@contextlib.contextmanager
def running_stack(root: Path) -> Iterator[Stack]:
    stack = Stack(root)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
