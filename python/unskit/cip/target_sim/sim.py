"""The class-1 target: encapsulation sessions over TCP, class-1 connections over UDP, one
service thread, and the controls the tests drive (see `unskit.cip.target_sim`)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

from unskit.cip.target_sim.class1 import _Class1Io, demo_pattern
from unskit.cip.target_sim.encap import _Encapsulation
from unskit.cip.target_sim.state import (
    AssemblySpec,
    ConnectionInfo,
    _Assembly,
    _Connection,
    _log,
    _Session,
)
from unskit.cip.target_sim.wire import DEFAULT_MULTICAST_GROUP
from unskit.errors import CipError

__all__ = ["AssemblySpec", "CipTargetSim", "ConnectionInfo", "demo_pattern"]


class CipTargetSim(_Encapsulation, _Class1Io):
    """A class-1 EtherNet/IP target on 127.0.0.1; a context manager, `start()`/`stop()`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        udp_port: int = 0,
        assemblies: dict[int, AssemblySpec] | None = None,
        min_rpi_ms: float = 1.0,
        api_override_us: int | None = None,
        refuse: int | None = None,
        multicast_group: str | None = None,
    ) -> None:
        if assemblies is None:
            assemblies = {100: AssemblySpec(16), 150: AssemblySpec(16), 151: AssemblySpec(0)}
        self.host = host
        self._requested_ports = (tcp_port, udp_port)
        self._assemblies = {
            instance: _Assembly(spec, bytearray(spec.size)) for instance, spec in assemblies.items()
        }
        self.min_rpi_ms = min_rpi_ms
        self.api_override_us = api_override_us
        self.refuse = refuse
        self.multicast_group = multicast_group or DEFAULT_MULTICAST_GROUP
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._connections: list[_Connection] = []
        self._by_o2t: dict[int, _Connection] = {}
        self._sessions: dict[int, _Session] = {}
        self._next_session = 0x1000
        self._next_id = 0x5100_0000
        self._echo: list[tuple[int, int, int]] = []
        self._producing = True
        self._wrong_size = 0
        self._duplicate = 0
        self._reorder = 0
        self._animated: dict[int, float] = {}
        self._pattern_period = 0.1
        self._pattern_due = 0.0
        self._pattern_tick = 0
        self._pattern_start = 0.0
        #: O->T datagrams that matched no open connection, or did not parse.
        self.unmatched = 0
        self.malformed = 0
        self._tcp: socket.socket | None = None
        self._udp: socket.socket | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._selector: selectors.DefaultSelector | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.tcp_port = 0
        self.udp_port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> CipTargetSim:
        """Binds the TCP and UDP sockets and starts the service thread; returns self."""
        if self._thread is not None:
            raise RuntimeError("the sim is already started")
        tcp_port, udp_port = self._requested_ports
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((self.host, tcp_port))
            tcp.listen(8)
            udp.bind((self.host, udp_port))
            # Multicast T->O stays on this host: loopback interface, TTL 0.
            udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
            udp.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        except OSError:
            tcp.close()
            udp.close()
            raise
        tcp.setblocking(False)
        udp.setblocking(False)
        self._tcp, self._udp = tcp, udp
        self.tcp_port = tcp.getsockname()[1]
        self.udp_port = udp.getsockname()[1]
        self._wake = socket.socketpair()
        self._wake[0].setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(tcp, selectors.EVENT_READ, "accept")
        self._selector.register(udp, selectors.EVENT_READ, "udp")
        self._selector.register(self._wake[0], selectors.EVENT_READ, "wake")
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="cip-target-sim", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the service thread and closes every socket; idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        assert self._wake is not None
        with contextlib.suppress(OSError):
            self._wake[1].send(b"x")
        thread.join(10)
        self._thread = None
        for session in list(self._sessions.values()):
            session.sock.close()
        self._sessions.clear()
        for sock in (self._tcp, self._udp, *(self._wake or ())):
            if sock is not None:
                sock.close()
        if self._selector is not None:
            self._selector.close()
        self._tcp = self._udp = self._wake = self._selector = None

    def __enter__(self) -> CipTargetSim:
        return self if self._thread is not None else self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- test controls -----------------------------------------------------------------------

    def set_input(self, instance: int, data: bytes) -> None:
        """Sets what T->O of `instance` carries (its size exactly) and bumps its sequence count."""
        with self._changed:
            assembly = self._assembly(instance)
            if len(data) != assembly.spec.size:
                raise CipError(
                    f"assembly {instance} holds {assembly.spec.size} bytes, not {len(data)}"
                )
            assembly.data[:] = data
            assembly.sequence_count = (assembly.sequence_count + 1) & 0xFFFF
            self._changed.notify_all()

    def input(self, instance: int) -> bytes:
        """The current image of an assembly as T->O would carry it."""
        with self._lock:
            return bytes(self._assembly(instance).data)

    def output(self, instance: int) -> bytes | None:
        """The last O->T data consumed for `instance`, None before the first."""
        with self._lock:
            assembly = self._assembly(instance)
            return bytes(assembly.data) if assembly.written else None

    def outputs_seen(self, instance: int) -> list[bytes]:
        """Each distinct O->T image consumed for `instance`, in order (the first 10,000)."""
        with self._lock:
            return list(self._assembly(instance).seen)

    def run_bit(self, instance: int) -> bool | None:
        """The run/idle bit of the last header32 O->T datagram for `instance`, else None."""
        with self._lock:
            return self._assembly(instance).run

    def connections(self) -> list[ConnectionInfo]:
        """Every connection opened so far, in opening order, with its state and counters."""
        with self._lock:
            return [connection.info() for connection in self._connections]

    def echo(self, output_instance: int, input_instance: int, at_offset: int = 0) -> None:
        """Copies each consumed O->T image of `output_instance` into `input_instance`."""
        with self._lock:
            self._assembly(output_instance)
            target = self._assembly(input_instance)
            if not 0 <= at_offset <= target.spec.size:
                raise CipError(f"offset {at_offset} is outside assembly {input_instance}")
            self._echo.append((output_instance, input_instance, at_offset))

    def animate(self, instance: int, period_ms: float = 100.0) -> None:
        """Runs the demo pattern on `instance` every `period_ms` (see `demo_pattern`)."""
        with self._lock:
            self._assembly(instance)
            self._animated[instance] = 0.0
            self._pattern_period = period_ms / 1000.0
            self._pattern_start = self._pattern_due = time.monotonic()
        self._wakeup()

    def stop_producing(self) -> None:
        """Sends no T->O datagrams until `resume_producing` (the originator's watchdog test)."""
        with self._lock:
            self._producing = False

    def resume_producing(self) -> None:
        """Sends T->O datagrams again, on the same schedule."""
        with self._lock:
            self._producing = True

    def send_wrong_size(self, count: int = 1) -> None:
        """The next `count` T->O datagrams carry one data byte too many."""
        with self._lock:
            self._wrong_size += count

    def duplicate_next(self, count: int = 1) -> None:
        """The next `count` T->O datagrams are each sent twice, same sequence number."""
        with self._lock:
            self._duplicate += count

    def reorder_next(self, count: int = 1) -> None:
        """After each of the next `count` T->O datagrams, an older one (sequence - 1) follows."""
        with self._lock:
            self._reorder += count

    def wait_for(self, predicate: Callable[[CipTargetSim], bool], timeout: float = 5.0) -> None:
        """Waits until `predicate(sim)` holds (re-checked on every event); TimeoutError after."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                self._lock.release()
                try:
                    if predicate(self):
                        return
                finally:
                    self._lock.acquire()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"condition not met within {timeout} s")
                self._changed.wait(min(left, 0.5))

    def _assembly(self, instance: int) -> _Assembly:
        try:
            return self._assemblies[instance]
        except KeyError:
            raise CipError(f"the sim has no assembly {instance}") from None

    def _wakeup(self) -> None:
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"x")

    # -- the service loop --------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._selector is not None
        while not self._stopping:
            timeout = self._next_timer() - time.monotonic()
            events = self._selector.select(max(timeout, 0.0))
            for key, _mask in events:
                try:
                    self._dispatch(key)
                except Exception:  # a bug must not silence the sim; log it and go on
                    _log.exception("cip-target-sim: unexpected error")
            try:
                self._run_timers(time.monotonic())
            except Exception:
                _log.exception("cip-target-sim: unexpected error in timers")

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        if key.data == "wake":
            assert self._wake is not None
            with contextlib.suppress(BlockingIOError):
                self._wake[0].recv(64)
        elif key.data == "accept":
            assert self._tcp is not None
            with contextlib.suppress(BlockingIOError):
                sock, peer = self._tcp.accept()
                sock.settimeout(5.0)
                self._sessions[sock.fileno()] = _Session(sock, peer[0])
                assert self._selector is not None
                self._selector.register(sock, selectors.EVENT_READ, "session")
        elif key.data == "udp":
            self._receive_udp()
        else:
            fileobj = key.fileobj
            assert isinstance(fileobj, socket.socket)
            self._receive_tcp(self._sessions[fileobj.fileno()])

    def _next_timer(self) -> float:
        with self._lock:
            times = [time.monotonic() + 1.0]
            for connection in self._by_o2t.values():
                times.append(connection.next_due)
                times.append(connection.last_heard + connection.timeout_s())
            if self._animated:
                times.append(self._pattern_due)
            return min(times)

    def _run_timers(self, now: float) -> None:
        with self._changed:
            if self._animated and now >= self._pattern_due:
                self._animate(now)
            for connection in list(self._by_o2t.values()):
                if now > connection.last_heard + connection.timeout_s():
                    connection.state = "timed_out"
                    del self._by_o2t[connection.o2t_id]
                    _log.info("cip-target-sim: connection 0x%08X timed out", connection.o2t_id)
                    self._changed.notify_all()
                    continue
                if now >= connection.next_due:
                    period = connection.t2o_api_us / 1e6
                    connection.next_due += period
                    if connection.next_due <= now:  # far behind (a stall): skip, do not burst
                        connection.next_due = now + period
                    if self._producing:
                        self._produce(connection)
