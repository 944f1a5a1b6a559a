"""The class-1 target: encapsulation sessions over TCP, class-1 connections over UDP, one
service thread, and the controls the tests drive (see `unskit.cip.target_sim`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from unskit.cip.target_sim.wire import (
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_UDP_PORT,
    DEVICE_TYPE,
    ENCAP_HEADER,
    ENCAP_INCORRECT_DATA,
    ENCAP_INVALID_COMMAND,
    ENCAP_INVALID_LENGTH,
    ENCAP_INVALID_SESSION,
    ENCAP_UNSUPPORTED_VERSION,
    EXT_CONNECTION_IN_USE,
    EXT_CONNECTION_NOT_FOUND,
    EXT_INVALID_CONFIG_PATH,
    EXT_INVALID_CONNECTION_SIZE,
    EXT_INVALID_CONSUMING_PATH,
    EXT_INVALID_PRODUCING_PATH,
    EXT_INVALID_SEGMENT,
    EXT_INVALID_T2O_CONNECTION_TYPE,
    EXT_KEY_MISMATCH,
    EXT_OWNERSHIP_CONFLICT,
    EXT_RPI_NOT_SUPPORTED,
    FORMATS,
    FORWARD_CLOSE,
    FORWARD_OPEN,
    GS_CONNECTION_FAILURE,
    GS_NOT_ENOUGH_DATA,
    GS_PATH_DESTINATION_UNKNOWN,
    GS_SERVICE_NOT_SUPPORTED,
    GS_SUCCESS,
    ITEM_IDENTITY,
    ITEM_NULL,
    ITEM_SOCKADDR_O2T,
    ITEM_SOCKADDR_T2O,
    ITEM_UNCONNECTED_DATA,
    LARGE_FORWARD_OPEN,
    LIST_IDENTITY,
    MULTICAST,
    P2P,
    PRODUCT_CODE,
    PRODUCT_NAME,
    REGISTER_SESSION,
    REVISION,
    SEND_RR_DATA,
    SERIAL_NUMBER,
    UNCONNECTED_SEND,
    UNREGISTER_SESSION,
    VENDOR_ID,
    Format,
    MalformedError,
    RefusalError,
    cip_reply,
    class1_datagram,
    connection_size,
    cpf_items,
    logical_segment,
    parse_class1,
    sockaddr_item,
)
from unskit.errors import CipError

__all__ = ["AssemblySpec", "CipTargetSim", "ConnectionInfo", "demo_pattern"]

_log = logging.getLogger(__name__)


#: Distinct O->T images an assembly remembers for `outputs_seen`.
_SEEN = 10_000


@dataclass(frozen=True)
class AssemblySpec:
    """One assembly instance: its data size in bytes and, optionally, its real-time format."""

    size: int
    #: None: header32 when the assembly is an O->T connection point, modeless when T->O.
    format: Format | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.size <= 65_000:
            raise CipError(f"assembly size {self.size} is not within 0..65000")
        if self.format is not None and self.format not in FORMATS:
            raise CipError(f"assembly format {self.format!r} is not one of {', '.join(FORMATS)}")


@dataclass(frozen=True)
class ConnectionInfo:
    """A snapshot of one class-1 connection the sim opened."""

    o2t_id: int
    t2o_id: int
    #: (connection serial number, originator vendor id, originator serial number)
    triad: tuple[int, int, int]
    output_instance: int
    input_instance: int
    config_instance: int | None
    o2t_rpi_us: int
    t2o_rpi_us: int
    o2t_api_us: int
    t2o_api_us: int
    #: Connection sizes as the network parameters give them (headers included).
    o2t_size: int
    t2o_size: int
    o2t_format: str
    t2o_format: str
    timeout_multiplier: int
    multicast: bool
    #: Where T->O datagrams go.
    t2o_destination: tuple[str, int]
    large: bool
    #: "open", "closed" (Forward Close) or "timed_out" (O->T silent beyond its timeout).
    state: str
    produced: int
    consumed: int
    #: Last O->T encapsulation sequence number and CIP sequence count, None before any.
    o2t_sequence: int | None
    o2t_sequence_count: int | None
    #: O->T datagrams not applied, by reason (wrong_size, stale).
    dropped: dict[str, int]


@dataclass
class _Assembly:
    spec: AssemblySpec
    data: bytearray
    sequence_count: int = 0
    run: bool | None = None
    written: bool = False
    #: Every distinct O->T image consumed, in order (bounded), for atomicity checks.
    seen: list[bytes] = field(default_factory=list)


@dataclass
class _Connection:
    o2t_id: int
    t2o_id: int
    triad: tuple[int, int, int]
    output_instance: int
    input_instance: int
    config_instance: int | None
    o2t_rpi_us: int
    t2o_rpi_us: int
    o2t_api_us: int
    t2o_api_us: int
    o2t_size: int
    t2o_size: int
    o2t_format: str
    t2o_format: str
    timeout_multiplier: int
    multicast: bool
    t2o_destination: tuple[str, int]
    large: bool
    next_due: float
    last_heard: float
    state: str = "open"
    produced: int = 0
    consumed: int = 0
    t2o_sequence: int = 0
    o2t_sequence: int | None = None
    o2t_sequence_count: int | None = None
    dropped: dict[str, int] = field(default_factory=dict)

    def timeout_s(self) -> float:
        return self.timeout_multiplier * self.o2t_api_us / 1e6

    def info(self) -> ConnectionInfo:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ConnectionInfo)}
        fields["dropped"] = dict(self.dropped)
        return ConnectionInfo(**fields)


@dataclass
class _Session:
    sock: socket.socket
    peer: str
    buffer: bytearray = field(default_factory=bytearray)
    handle: int = 0


class CipTargetSim:
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

    # -- TCP: encapsulation ------------------------------------------------------------------

    def _receive_tcp(self, session: _Session) -> None:
        try:
            chunk = session.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._close_session(session)
            return
        session.buffer += chunk
        while len(session.buffer) >= ENCAP_HEADER.size:
            command, length, handle, _status, context, options = ENCAP_HEADER.unpack_from(
                session.buffer
            )
            if length > 65_511:
                self._send_encap(session, command, handle, ENCAP_INVALID_LENGTH, context, b"")
                self._close_session(session)
                return
            if len(session.buffer) < ENCAP_HEADER.size + length:
                return
            body = bytes(session.buffer[ENCAP_HEADER.size : ENCAP_HEADER.size + length])
            del session.buffer[: ENCAP_HEADER.size + length]
            if not self._command(session, command, handle, context, options, body):
                self._close_session(session)
                return

    def _close_session(self, session: _Session) -> None:
        assert self._selector is not None
        self._sessions.pop(session.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(session.sock)
        session.sock.close()

    def _send_encap(
        self,
        session: _Session,
        command: int,
        handle: int,
        status: int,
        context: bytes,
        body: bytes,
    ) -> None:
        header = ENCAP_HEADER.pack(command, len(body), handle, status, context, 0)
        try:
            session.sock.sendall(header + body)
        except OSError:
            _log.info("cip-target-sim: a session went away before its reply")

    def _command(
        self,
        session: _Session,
        command: int,
        handle: int,
        context: bytes,
        options: int,
        body: bytes,
    ) -> bool:
        """Answers one encapsulation message; False closes the TCP connection."""
        if command == REGISTER_SESSION:
            if len(body) != 4:
                self._send_encap(session, command, 0, ENCAP_INVALID_LENGTH, context, body)
                return True
            version, _flags = struct.unpack("<HH", body)
            if version != 1 or session.handle:
                self._send_encap(session, command, 0, ENCAP_UNSUPPORTED_VERSION, context, body)
                return True
            self._next_session += 1
            session.handle = self._next_session
            self._send_encap(session, command, session.handle, 0, context, body)
            return True
        if command == UNREGISTER_SESSION:
            return False  # no reply: the target closes the TCP connection (Vol. 2, 2-4.5)
        if command == LIST_IDENTITY:
            self._send_encap(session, command, handle, 0, context, self._identity_item())
            return True
        if command == SEND_RR_DATA:
            if not session.handle or handle != session.handle:
                self._send_encap(session, command, handle, ENCAP_INVALID_SESSION, context, b"")
                return True
            try:
                reply = self._send_rr_data(session, body)
            except (MalformedError, struct.error, IndexError) as exc:
                _log.info("cip-target-sim: malformed SendRRData: %s", exc)
                self._send_encap(session, command, handle, ENCAP_INCORRECT_DATA, context, b"")
                return True
            self._send_encap(session, command, handle, 0, context, reply)
            return True
        self._send_encap(session, command, handle, ENCAP_INVALID_COMMAND, context, b"")
        return True

    def _identity_item(self) -> bytes:
        sockaddr = sockaddr_item(self.host, self.tcp_port)
        name = PRODUCT_NAME
        identity = (
            struct.pack("<H", 1)
            + sockaddr
            + struct.pack(
                "<HHHBBHI", VENDOR_ID, DEVICE_TYPE, PRODUCT_CODE, *REVISION, 0x0030, SERIAL_NUMBER
            )
            + bytes([len(name)])
            + name
            + b"\x03"  # state: operational
        )
        return struct.pack("<HHH", 1, ITEM_IDENTITY, len(identity)) + identity

    def _send_rr_data(self, session: _Session, body: bytes) -> bytes:
        if len(body) < 8:
            raise MalformedError("SendRRData shorter than its interface handle, timeout and count")
        items = cpf_items(body[6:])
        message = next((data for kind, data in items if kind == ITEM_UNCONNECTED_DATA), None)
        if message is None:
            raise MalformedError("no unconnected data item")
        t2o_sockaddr = next((data for kind, data in items if kind == ITEM_SOCKADDR_T2O), None)
        reply, extra_items = self._request(session, message, t2o_sockaddr)
        out = [(ITEM_NULL, b""), (ITEM_UNCONNECTED_DATA, reply), *extra_items]
        encoded = b"".join(struct.pack("<HH", kind, len(data)) + data for kind, data in out)
        return struct.pack("<IHH", 0, 0, len(out)) + encoded

    def _request(
        self,
        session: _Session,
        message: bytes,
        t2o_sockaddr: bytes | None,
        routed: bool = False,
    ) -> tuple[bytes, list[tuple[int, bytes]]]:
        """A Message Router request to (reply, extra CPF items)."""
        if len(message) < 2 or len(message) < 2 + 2 * message[1]:
            return cip_reply(message[0] if message else 0, GS_NOT_ENOUGH_DATA), []
        service, words = message[0], message[1]
        path, data = message[2 : 2 + 2 * words], message[2 + 2 * words :]
        if path != b"\x20\x06\x24\x01":
            return cip_reply(service, GS_PATH_DESTINATION_UNKNOWN), []
        if service == UNCONNECTED_SEND and not routed and len(data) >= 4:
            # Routed to this very device (the route path is not checked): the reply is the
            # embedded request's own (Vol. 1, 3-5.6.4).
            size = struct.unpack_from("<H", data, 2)[0]
            if len(data) >= 4 + size:
                return self._request(session, data[4 : 4 + size], t2o_sockaddr, routed=True)
            return cip_reply(service, GS_NOT_ENOUGH_DATA), []
        if service not in (FORWARD_OPEN, LARGE_FORWARD_OPEN, FORWARD_CLOSE):
            return cip_reply(service, GS_SERVICE_NOT_SUPPORTED), []
        if service == FORWARD_CLOSE:
            return self._forward_close(data), []
        large = service == LARGE_FORWARD_OPEN
        fixed = 36 + (4 if large else 0)
        if len(data) < fixed:
            return cip_reply(service, GS_NOT_ENOUGH_DATA), []
        triad = struct.unpack_from("<HHI", data, 10)
        tail = struct.pack("<HHI", *triad) + b"\x00\x00"
        try:
            return self._forward_open(session, data, large, t2o_sockaddr)
        except RefusalError as refusal:
            _log.info("cip-target-sim: Forward Open refused with 0x01/%s", refusal)
            return cip_reply(service, GS_CONNECTION_FAILURE, refusal.words, tail), []

    def _forward_open(
        self, session: _Session, data: bytes, large: bool, t2o_sockaddr: bytes | None
    ) -> tuple[bytes, list[tuple[int, bytes]]]:
        service = LARGE_FORWARD_OPEN if large else FORWARD_OPEN
        _tick, _ticks, _o2t_id, t2o_id, serial, vendor, orig_serial, multiplier = (
            struct.unpack_from("<BBIIHHIB", data)
        )
        params = "<IIIIB" if large else "<IHIHB"
        o2t_rpi, o2t_params, t2o_rpi, t2o_params, _transport = struct.unpack_from(params, data, 22)
        at = 22 + struct.calcsize(params)
        path = data[at + 1 : at + 1 + 2 * data[at]]
        if len(path) != 2 * data[at]:
            raise RefusalError(EXT_INVALID_SEGMENT)
        triad = (serial, vendor, orig_serial)
        if self.refuse is not None:
            raise RefusalError(self.refuse)
        config, output, input_ = self._connection_path(path)
        size_mask, type_shift = (0xFFFF, 29) if large else (0x1FF, 13)
        o2t_size, t2o_size = o2t_params & size_mask, t2o_params & size_mask
        t2o_type = (t2o_params >> type_shift) & 3
        with self._changed:
            if any(c.triad == triad for c in self._by_o2t.values()):
                raise RefusalError(EXT_CONNECTION_IN_USE)
            if min(o2t_rpi, t2o_rpi) < self.min_rpi_ms * 1000:
                raise RefusalError(EXT_RPI_NOT_SUPPORTED)
            if t2o_type not in (P2P, MULTICAST):
                raise RefusalError(EXT_INVALID_T2O_CONNECTION_TYPE)
            if config is not None and config not in self._assemblies:
                raise RefusalError(EXT_INVALID_CONFIG_PATH)
            if output not in self._assemblies:
                raise RefusalError(EXT_INVALID_CONSUMING_PATH)
            if input_ not in self._assemblies:
                raise RefusalError(EXT_INVALID_PRODUCING_PATH)
            out_spec, in_spec = self._assemblies[output].spec, self._assemblies[input_].spec
            o2t_format = out_spec.format or ("heartbeat" if out_spec.size == 0 else "header32")
            t2o_format = in_spec.format or "modeless"
            want_o2t = connection_size(out_spec.size, o2t_format)
            want_t2o = connection_size(in_spec.size, t2o_format)
            if o2t_size != want_o2t:
                raise RefusalError(EXT_INVALID_CONNECTION_SIZE, want_o2t)
            if t2o_size != want_t2o:
                raise RefusalError(EXT_INVALID_CONNECTION_SIZE, want_t2o)
            if o2t_format != "heartbeat" and any(
                c.output_instance == output for c in self._by_o2t.values()
            ):
                raise RefusalError(EXT_OWNERSHIP_CONFLICT)
            multicast = t2o_type == MULTICAST
            port = DEFAULT_UDP_PORT
            if t2o_sockaddr is not None and len(t2o_sockaddr) == 16:
                port = struct.unpack_from(">H", t2o_sockaddr, 2)[0] or DEFAULT_UDP_PORT
            destination = (self.multicast_group if multicast else session.peer, port)
            o2t_id = self._new_id()
            if multicast:
                t2o_id = self._new_id()
            o2t_api = self.api_override_us or o2t_rpi
            t2o_api = self.api_override_us or t2o_rpi
            now = time.monotonic()
            connection = _Connection(
                o2t_id=o2t_id,
                t2o_id=t2o_id,
                triad=triad,
                output_instance=output,
                input_instance=input_,
                config_instance=config,
                o2t_rpi_us=o2t_rpi,
                t2o_rpi_us=t2o_rpi,
                o2t_api_us=o2t_api,
                t2o_api_us=t2o_api,
                o2t_size=o2t_size,
                t2o_size=t2o_size,
                o2t_format=o2t_format,
                t2o_format=t2o_format,
                timeout_multiplier=4 << min(multiplier, 7),
                multicast=multicast,
                t2o_destination=destination,
                large=large,
                next_due=now,
                last_heard=now,
            )
            self._connections.append(connection)
            self._by_o2t[o2t_id] = connection
            self._changed.notify_all()
        _log.info(
            "cip-target-sim: opened O->T 0x%08X T->O 0x%08X (%s -> %s)",
            o2t_id,
            t2o_id,
            output,
            input_,
        )
        body = struct.pack("<IIHHIIIBB", o2t_id, t2o_id, *triad, o2t_api, t2o_api, 0, 0)
        items = [(ITEM_SOCKADDR_O2T, sockaddr_item(self.host, self.udp_port))]
        if multicast:
            items.append((ITEM_SOCKADDR_T2O, sockaddr_item(*destination)))
        return cip_reply(service, GS_SUCCESS, (), body), items

    def _connection_path(self, path: bytes) -> tuple[int | None, int, int]:
        """(config instance or None, O->T connection point, T->O connection point)."""
        at = 0
        config: int | None = None
        points: list[int] = []
        klass: int | None = None
        while at < len(path):
            segment = path[at]
            if segment == 0x34:  # electronic key, format 4
                if at + 10 > len(path) or path[at + 1] != 0x04:
                    raise RefusalError(EXT_INVALID_SEGMENT)
                vendor, device, product, major, minor = struct.unpack_from("<HHHBB", path, at + 2)
                self._check_key(vendor, device, product, major & 0x7F, minor)
                at += 10
            elif segment in (0x20, 0x24, 0x2C):  # 8-bit class, instance, connection point
                if at + 2 > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
                value, at = path[at + 1], at + 2
                klass, config = logical_segment(segment, value, klass, config, points)
            elif segment in (0x21, 0x25, 0x2D):  # 16-bit, padded: a pad byte first
                if at + 4 > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
                value, at = struct.unpack_from("<H", path, at + 2)[0], at + 4
                klass, config = logical_segment(segment & 0xFC, value, klass, config, points)
            elif segment == 0x80:  # simple data segment: configuration data, ignored
                if at + 2 > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
                at += 2 + 2 * path[at + 1]
                if at > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
            else:
                raise RefusalError(EXT_INVALID_SEGMENT)
        if klass != 0x04 or len(points) != 2:
            raise RefusalError(EXT_INVALID_SEGMENT)
        return config, points[0], points[1]

    def _check_key(self, vendor: int, device: int, product: int, major: int, minor: int) -> None:
        mine = (VENDOR_ID, DEVICE_TYPE, PRODUCT_CODE, *REVISION)
        for asked, have in zip((vendor, device, product, major, minor), mine, strict=True):
            if asked and asked != have:
                raise RefusalError(EXT_KEY_MISMATCH)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _forward_close(self, data: bytes) -> bytes:
        if len(data) < 12:
            return cip_reply(FORWARD_CLOSE, GS_NOT_ENOUGH_DATA)
        triad = struct.unpack_from("<HHI", data, 2)
        tail = struct.pack("<HHI", *triad)
        with self._changed:
            connection = next((c for c in self._by_o2t.values() if c.triad == triad), None)
            if connection is None:
                return cip_reply(
                    FORWARD_CLOSE,
                    GS_CONNECTION_FAILURE,
                    (EXT_CONNECTION_NOT_FOUND,),
                    tail + b"\x00\x00",
                )
            connection.state = "closed"
            del self._by_o2t[connection.o2t_id]
            self._changed.notify_all()
        _log.info("cip-target-sim: closed O->T 0x%08X", connection.o2t_id)
        return cip_reply(FORWARD_CLOSE, GS_SUCCESS, (), tail + b"\x00\x00")

    # -- UDP: class-1 datagrams --------------------------------------------------------------

    def _receive_udp(self) -> None:
        assert self._udp is not None
        for _ in range(64):  # bounded: timers must not starve under a flood
            try:
                datagram, _peer = self._udp.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ICMP port unreachable from an earlier T->O: not ours to fix
                continue
            self._consume(datagram)

    def _consume(self, datagram: bytes) -> None:
        parsed = parse_class1(datagram)
        with self._changed:
            if parsed is None:
                self.malformed += 1
                return
            connection_id, sequence, payload = parsed
            connection = self._by_o2t.get(connection_id)
            if connection is None:
                self.unmatched += 1
                return
            connection.last_heard = time.monotonic()
            if len(payload) != connection.o2t_size:
                connection.dropped["wrong_size"] = connection.dropped.get("wrong_size", 0) + 1
                self._changed.notify_all()
                return
            last = connection.o2t_sequence
            if last is not None and not 0 < (sequence - last) & 0xFFFFFFFF < 0x80000000:
                connection.dropped["stale"] = connection.dropped.get("stale", 0) + 1
                self._changed.notify_all()
                return
            connection.o2t_sequence = sequence
            connection.o2t_sequence_count = struct.unpack_from("<H", payload)[0]
            connection.consumed += 1
            assembly = self._assemblies[connection.output_instance]
            body = payload[2:]
            if connection.o2t_format == "header32":
                assembly.run = bool(struct.unpack_from("<I", body)[0] & 1)
                body = body[4:]
            assembly.data[:] = body
            assembly.written = True
            if (not assembly.seen or assembly.seen[-1] != body) and len(assembly.seen) < _SEEN:
                assembly.seen.append(bytes(body))
            for source, target, offset in self._echo:
                if source == connection.output_instance:
                    image = self._assemblies[target]
                    piece = body[: image.spec.size - offset]
                    if image.data[offset : offset + len(piece)] != piece:
                        image.data[offset : offset + len(piece)] = piece
                        image.sequence_count = (image.sequence_count + 1) & 0xFFFF
            self._changed.notify_all()

    def _produce(self, connection: _Connection) -> None:
        """Sends one T->O datagram (the lock is held)."""
        assert self._udp is not None
        assembly = self._assemblies[connection.input_instance]
        data = bytes(assembly.data)
        if self._wrong_size:
            self._wrong_size -= 1
            data += b"\x00"
        connection.t2o_sequence = (connection.t2o_sequence + 1) & 0xFFFFFFFF
        datagram = class1_datagram(
            connection.t2o_id,
            connection.t2o_sequence,
            assembly.sequence_count,
            connection.t2o_format == "header32",
            data,
        )
        copies = [datagram]
        if self._duplicate:
            self._duplicate -= 1
            copies.append(datagram)
        if self._reorder:
            self._reorder -= 1
            copies.append(
                class1_datagram(
                    connection.t2o_id,
                    (connection.t2o_sequence - 1) & 0xFFFFFFFF,
                    (assembly.sequence_count - 1) & 0xFFFF,
                    connection.t2o_format == "header32",
                    data,
                )
            )
        for copy in copies:
            try:
                self._udp.sendto(copy, connection.t2o_destination)
            except OSError as exc:
                _log.info("cip-target-sim: T->O to %s failed: %s", connection.t2o_destination, exc)
        connection.produced += 1
        self._changed.notify_all()

    def _animate(self, now: float) -> None:
        self._pattern_tick += 1
        self._pattern_due += self._pattern_period
        if self._pattern_due <= now:
            self._pattern_due = now + self._pattern_period
        for instance in self._animated:
            assembly = self._assemblies[instance]
            demo_pattern(assembly.data, self._pattern_tick, now - self._pattern_start)
            assembly.sequence_count = (assembly.sequence_count + 1) & 0xFFFF
        self._changed.notify_all()


def demo_pattern(image: bytearray, tick: int, seconds: float) -> None:
    """Writes the demo pattern into `image` (see docs/configuration.md); what fits only."""
    # UDINT tick count at 0, REAL sine (period 10 s, amplitude 100) at 4, the count's low
    # byte at 8 (bit n toggles every 2**n ticks).
    if len(image) >= 4:
        struct.pack_into("<I", image, 0, tick & 0xFFFFFFFF)
    if len(image) >= 8:
        struct.pack_into("<f", image, 4, 100.0 * math.sin(2 * math.pi * seconds / 10.0))
    if len(image) >= 9:
        image[8] = tick & 0xFF
