"""The demo's processes: `Supervisor` starts the broker (embedded unless one is given), the
devices (the OPC UA server, the CIP target simulator) and the components as child processes
of this one, waits until each serves or is ready, feeds the live view, stops them in order
(the producers first, then the egress once it delivered what they made) and prints the
summary; with the per-component record, the port probes and the constants it runs by."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.demo.plan import ROOT, THING, Peer
from unskit.demo.view import SOURCE_WIDTH, Capture, Tally, _signal_name, describe, uns_class
from unskit.envelope import Message
from unskit.errors import UnskitError
from unskit.localhost import free_port
from unskit.messaging import MessagingClient
from unskit.runtime.embedded_broker import EmbeddedBroker

__all__ = ["EXIT_MISMATCH", "Component", "Supervisor"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
#: How long the egress gets, once the cameras stopped, to deliver what they captured.
DELIVERY_TIMEOUT_S = 30.0
#: The producers stop first (the recorder closes its open files then); the egress last,
#: once it has shipped what they made.
PRODUCERS = ("camera-adapter", "ethernet-ip-adapter", "opcua-adapter", "signal-recorder")
EXIT_MISMATCH = 1
#: How often the supervisor checks that every component is still running.
MONITOR_INTERVAL_S = 0.5
#: Each asks for a clean stop: Ctrl-C, a service manager, a terminal that went away.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Component:
    """One component process: its installed name, configuration and what became of it."""

    name: str
    document: dict[str, Any]
    health_port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    exit_code: int | None = None


def _ready(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _listening(port: int) -> bool:
    # A connect that sends nothing: a binary protocol server would log a stray byte.
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Supervisor:
    """Starts the broker and the components, shows the traffic, stops everything."""

    def __init__(
        self,
        documents: Sequence[tuple[str, dict[str, Any]]],
        output: Path,
        *,
        broker: str | None = None,
        port: int = 0,
        out: TextIO = sys.stdout,
        peers: Sequence[Peer] = (),
    ) -> None:
        self.components = [Component(name, document) for name, document in documents]
        self.peers = list(peers)
        self._peer_processes: dict[str, subprocess.Popen[bytes]] = {}
        self._peer_exits: dict[str, int] = {}
        self.output = output
        self.out = out
        self.tally = Tally()
        self._broker_address = broker
        self._port = port
        self._embedded: EmbeddedBroker | None = None
        self._stop = threading.Event()
        self._print_lock = threading.Lock()
        # Traffic seen before the "where things are" block is held back, then shown.
        self._held: list[str] | None = []
        # Set once `out` failed: nothing more is written, and the demo stops.
        self._output_lost = False

    # -- lifecycle --------------------------------------------------------------------------

    def run(self, duration: float | None) -> int:
        """Runs the demo for `duration` seconds (None: until Ctrl-C); returns the exit code.

        The components are stopped on every way out: the duration, a stop signal, a component
        that exits, output nobody reads any more (a closed pipe) and any exception. They are
        started from this (the main) thread, whose death is what their parent-death signal
        follows, as the backstop should this process be killed outright.
        """
        with contextlib.ExitStack() as stack:
            for sig in STOP_SIGNALS:
                previous = signal.signal(sig, self._on_signal)
                # None: a handler not installed from Python, which cannot be put back as such.
                stack.callback(signal.signal, sig, signal.SIG_DFL if previous is None else previous)
            stack.callback(self._stop_broker)
            host, port = self._start_broker()
            watcher = self._watch(host, port)
            stack.callback(watcher.close, 2)
            stack.callback(self._stop_peers)
            self._start_peers()
            # Registered last, so it runs first: the components stop while the broker, the
            # devices and the live view still run, and the callbacks above run even if this
            # one raises.
            stack.callback(self._stop_components)
            self._start_components(host, port)
            self._where(host, port)
            self._run_until(duration)
        return self._summary()

    def _run_until(self, duration: float | None) -> None:
        """Until the duration is up, Ctrl-C or SIGTERM, or a component exits on its own."""
        deadline = None if duration is None else time.monotonic() + duration
        while True:
            timeout = MONITOR_INTERVAL_S
            if deadline is not None:
                timeout = min(timeout, max(deadline - time.monotonic(), 0.0))
            if self._stop.wait(timeout):
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            processes = [(c.name, c.process) for c in self.components]
            for name, process in [*processes, *self._peer_processes.items()]:
                assert process is not None
                code = process.poll()
                if code is not None:
                    log = self.output / "logs" / f"{name}.log"
                    self._print(f"\n{name} exited on its own ({code}); see {log}")
                    return

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self._stop.set()

    def _stop_broker(self) -> None:
        if self._embedded is not None:
            self._embedded.stop()

    def _start_broker(self) -> tuple[str, int]:
        if self._broker_address is not None:
            host, _, port = self._broker_address.rpartition(":")
            return host, int(port)
        try:
            self._embedded = EmbeddedBroker(self._port or free_port()).start()
        except UnskitError as error:
            raise RuntimeError(str(error)) from error
        return self._embedded.host, self._embedded.port

    def _child(self, argv: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        """`unskit ARGV` behind unskit.demo.child, which makes it die with this process
        (SIGTERM) should this one be killed before it can stop it."""
        (self.output / "logs").mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "unskit.demo.child", str(os.getpid())]
        command += ["--demo", str(self.output), *argv]
        with (self.output / "logs" / f"{log_name}.log").open("wb") as log:
            # A session of its own: Ctrl-C reaches the supervisor only, which then stops
            # each child in order with SIGTERM.
            return subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _start_peers(self) -> None:
        for peer in self.peers:
            self._peer_processes[peer.name] = self._child(peer.argv, peer.name)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for peer in self.peers:
            process = self._peer_processes[peer.name]
            while not _listening(peer.port):
                if self._stop.is_set():
                    raise RuntimeError("interrupted while the devices were starting")
                if process.poll() is not None or time.monotonic() > deadline:
                    log = self.output / "logs" / f"{peer.name}.log"
                    raise RuntimeError(f"{peer.name} did not start serving; see {log}")
                self._stop.wait(0.1)

    def _stop_peers(self) -> None:
        for process in self._peer_processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in self._peer_processes.items():
            try:
                self._peer_exits[name] = process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                self._peer_exits[name] = process.wait()

    def _start_components(self, host: str, port: int) -> None:
        (self.output / "config").mkdir(parents=True, exist_ok=True)
        for component in self.components:
            component.health_port = free_port()
            component.document["health"] = {"enabled": True, "port": component.health_port}
            # The files name the running broker, so `unskit call -c FILE` needs no --broker.
            component.document["messaging"] = {"local": {"host": host, "port": port}}
            config = self.output / "config" / f"{component.name}.json"
            config.write_text(json.dumps(component.document, indent=2) + "\n")
            component.process = self._child(
                [
                    "run",
                    component.name,
                    "-c",
                    str(config),
                    "-t",
                    THING,
                    "--broker",
                    f"{host}:{port}",
                ],
                component.name,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        for component in self.components:
            assert component.process is not None
            while not _ready(component.health_port):
                if self._stop.is_set():
                    raise RuntimeError("interrupted while the components were starting")
                if component.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{component.name} did not become ready; see "
                        f"{self.output / 'logs' / (component.name + '.log')}"
                    )
                self._stop.wait(0.1)

    def _stop_components(self) -> None:
        if any(c.process is not None for c in self.components):
            self._print("\nstopping: each component turns readiness off, drains, exits")
        try:
            self._terminate([c for c in self.components if c.name in PRODUCERS])
            # Nothing to wait for when the demo never got as far as starting every component.
            if all(c.process is not None for c in self.components):
                self._await_deliveries()
        finally:
            self._terminate([c for c in self.components if c.name not in PRODUCERS])

    def _terminate(self, components: Sequence[Component]) -> None:
        for component in components:
            if component.process is not None and component.process.poll() is None:
                component.process.send_signal(signal.SIGTERM)
        for component in components:
            if component.process is None:
                continue
            try:
                component.exit_code = component.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                component.process.kill()
                component.exit_code = component.process.wait()
            self._print(f"  {component.name:<20} exited {component.exit_code}")

    def _await_deliveries(self) -> None:
        """Waits (bounded) until the egress has delivered every announced image and sidecar."""
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        pending = self._undelivered()
        if pending:
            self._print(f"  waiting for the egress to deliver {len(pending)} more image(s)")
        egress = [c.process for c in self.components if c.name not in PRODUCERS and c.process]
        while pending and time.monotonic() < deadline and all(p.poll() is None for p in egress):
            time.sleep(0.2)  # polling the destination folder; nothing to wait on instead
            pending = self._undelivered()

    def _undelivered(self) -> list[Capture]:
        with self.tally.lock:
            captures = list(self.tally.captures)
        destination = self.output / "delivered"
        return [
            c
            for c in captures
            if not (destination / c.relative_path).is_file()
            or (c.sidecar_path is not None and not (destination / c.sidecar_path).is_file())
        ]

    # -- the live view ----------------------------------------------------------------------

    def _watch(self, host: str, port: int) -> MessagingClient:
        config = MessagingConfig(
            local=BrokerConfig(host=host, port=port, client_id=f"unskit-demo-{free_port()}")
        )
        watcher = MessagingClient(config, persistent_session=False).start()
        if not watcher.wait_connected(10):
            watcher.close(1)
            raise RuntimeError(f"cannot connect to the broker at {host}:{port}")
        watcher.subscribe(f"{ROOT}/{THING}/#", self._show, max_concurrency=1)
        return watcher

    def _show(self, topic: str, message: Message) -> None:
        cls = uns_class(topic)
        body = message.body if isinstance(message.body, dict) else {}
        name = message.header.name
        with self.tally.lock:
            self.tally.by_class[cls] += 1
            if name == "SouthboundSignalUpdate":
                self.tally.signals[_signal_name(body)] += 1
            elif name == "ImageCaptured":
                image = body.get("image") or {}
                self.tally.captures.append(
                    Capture(
                        str(body.get("cameraId")),
                        str(body.get("captureId")),
                        str(image.get("relativePath")),
                        str(image.get("sha256")),
                        image.get("metadataSidecarRelativePath"),
                    )
                )
            elif name.startswith("ImageCapture"):
                self.tally.failed_captures[str(body.get("cameraId"))] += 1
        line = describe(topic, message)
        if line is not None:
            self._print(line, live=True)

    def _print(self, line: str, *, live: bool = False) -> None:
        with self._print_lock:
            if live and self._held is not None:
                self._held.append(line)
                return
            self._write(line + "\n")

    def _release_held(self) -> None:
        with self._print_lock:
            held, self._held = self._held or [], None
            self._write("".join(line + "\n" for line in held))

    def _write(self, text: str) -> None:
        """Writes to `out` (under the print lock); output that fails stops the demo instead
        of raising, so no caller is cut short before the components are stopped."""
        if self._output_lost or not text:
            return
        try:
            self.out.write(text)
            self.out.flush()
        # Output is best effort, whatever keeps it from being written: a reader gone (EPIPE),
        # a hung-up terminal (EIO), a closed stream.
        except Exception:
            self._output_lost = True
            _discard(self.out)
            self._stop.set()

    def _where(self, host: str, port: int) -> None:
        kind = "embedded" if self._embedded is not None else "external"
        self._print(f"broker      {host}:{port} ({kind})")
        for component in self.components:
            assert component.process is not None
            self._print(
                f"  {component.name:<20} pid {component.process.pid:<8} "
                f"ready: http://127.0.0.1:{component.health_port}/readyz"
            )
        for peer in self.peers:
            process = self._peer_processes[peer.name]
            self._print(f"  {peer.name:<20} pid {process.pid:<8} serving on 127.0.0.1:{peer.port}")
        for folder, what in (
            ("config", "generated configurations"),
            ("logs", "component logs"),
            ("images", "camera output, watched by the egress"),
            ("signals", "recorded PLC signals (Parquet), shipped too"),
            ("delivered", "egress destination"),
            ("archive", "sources the egress delivered"),
        ):
            self._print(f"  {folder + '/':<11} {what:<38} {self.output / folder}")
        self._print(f"in another terminal: unskit watch '{ROOT}/#' --broker {host}:{port}")
        self._print(f"\n{'time':<8}  {'kind':<7}  {'source':<{SOURCE_WIDTH}}  what")
        self._release_held()

    # -- the summary ------------------------------------------------------------------------

    def verify(self) -> tuple[int, int, int]:
        """(images announced, delivered with the announced SHA-256, sidecars delivered)."""
        destination = self.output / "delivered"
        verified = 0
        for capture in self.tally.captures:
            path = destination / capture.relative_path
            if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == capture.sha256:
                verified += 1
        sidecars = len(list(destination.rglob("*.json"))) if destination.is_dir() else 0
        return len(self.tally.captures), verified, sidecars

    def _summary(self) -> int:
        announced, verified, sidecars = self.verify()
        self._print("\nsummary")
        classes = ", ".join(f"{c} {n}" for c, n in sorted(self.tally.by_class.items()))
        self._print(f"  messages    {sum(self.tally.by_class.values())} ({classes or 'none'})")
        signals = ", ".join(f"{s} {n}" for s, n in sorted(self.tally.signals.items()))
        updates = sum(self.tally.signals.values())
        self._print(f"  signals     {updates} updates ({signals or 'none'})")
        per_camera = Counter(c.camera for c in self.tally.captures)
        for camera in sorted(set(per_camera) | set(self.tally.failed_captures)):
            failed = self.tally.failed_captures[camera]
            self._print(f"  captures    {camera}: {per_camera[camera]} succeeded, {failed} failed")
        if not per_camera:
            self._print("  captures    none")
        self._print(
            f"  delivered   {verified} of {announced} images verified by SHA-256, "
            f"{sidecars} sidecars"
        )
        exits = {c.name: c.exit_code for c in self.components} | dict(self._peer_exits)
        for name, code in exits.items():
            self._print(f"  exit        {name}: {code}")
        clean = all(code == 0 for code in exits.values()) and verified == announced
        return 0 if clean else EXIT_MISMATCH


def _discard(stream: TextIO) -> None:
    """Points the stream's descriptor at /dev/null: what is still buffered in it is flushed
    again at exit, which would fail again (and print `Exception ignored ... BrokenPipeError`)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # not backed by a descriptor (StringIO), or closed
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
