"""The explicit side of a class-1 connection: an EtherNet/IP session over TCP 44818 that
registers, sends (Large) Forward Open and Forward Close to the Connection Manager, and
reads the target's socket-address items.

The Message Router bytes come from the Rust codec (`unskit._core.cip`); this module only
wraps them in the encapsulation header and the Common Packet Format of SendRRData.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import time
from dataclasses import dataclass

from unskit._core import cip as _cip
from unskit.southbound.driver import DeviceError

__all__ = ["ImplicitSession", "OpenRequest", "OpenedConnection"]

_REGISTER_SESSION = 0x65
_UNREGISTER_SESSION = 0x66
_SEND_RR_DATA = 0x6F
_HEADER = struct.Struct("<HHII8sI")
_NULL_ADDRESS = 0x0000
_UNCONNECTED_DATA = 0x00B2
_SOCKADDR_O2T = 0x8000
_SOCKADDR_T2O = 0x8001
_SOCKADDR = struct.Struct(">HHI8s")
#: The default UDP port of class-1 I/O (spec: implicit I/O over UDP 2222).
IMPLICIT_PORT = 2222
_ENCAPSULATION_STATUS = {
    0x0001: "invalid or unsupported command",
    0x0002: "insufficient memory",
    0x0003: "incorrect data",
    0x0064: "invalid session handle",
    0x0065: "invalid length",
    0x0069: "unsupported protocol revision",
}


@dataclass(frozen=True)
class OpenRequest:
    """What a Forward Open asks for, in the configuration's terms."""

    config: int
    output: int
    input: int
    o2t_rpi_us: int
    t2o_rpi_us: int
    o2t_size: int
    t2o_size: int
    timeout_multiplier: int
    priority: str
    multicast: bool
    #: The local UDP port T-to-O datagrams should reach; announced only when not 2222.
    udp_port: int


@dataclass(frozen=True)
class OpenedConnection:
    """The reply's terms, which govern the run."""

    o2t_connection_id: int
    t2o_connection_id: int
    o2t_api_us: int
    t2o_api_us: int
    connection_serial: int
    large: bool
    #: Where O-to-T datagrams go (the reply's O-to-T socket address, else the target:2222).
    o2t_host: str
    o2t_port: int
    #: The multicast group T-to-O arrives on (from the reply's T-to-O socket address).
    multicast_group: str | None


class ImplicitSession:
    """One registered EtherNet/IP session to a target (not thread-safe: one caller)."""

    #: Our vendor id in the connection triad (0xFFFF is reserved for "unassigned" tools).
    VENDOR_ID = 0xFFFE

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._handle = 0
        self._serial = 0
        #: Random per session so a target tells two originators apart.
        self._originator_serial = int.from_bytes(_random4(), "little")

    # -- session ---------------------------------------------------------------------------

    def connect(self, deadline_s: float) -> None:
        """TCP connect and RegisterSession, both within `deadline_s` (monotonic)."""
        self.close()
        budget = max(0.05, deadline_s - time.monotonic())
        try:
            sock = socket.create_connection((self.host, self.port), timeout=budget)
        except OSError as exc:
            raise DeviceError(f"connect to {self.host}:{self.port}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        try:
            _, handle, _ = self._exchange(_REGISTER_SESSION, struct.pack("<HH", 1, 0), budget)
        except DeviceError:
            self.close()
            raise
        self._handle = handle

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def alive(self) -> bool:
        """False once the target has closed the TCP session (checked without traffic)."""
        sock = self._sock
        if sock is None:
            return False
        try:
            sock.setblocking(False)
            try:
                return sock.recv(1, socket.MSG_PEEK) != b""
            finally:
                sock.setblocking(True)
                sock.settimeout(self.timeout_s)
        except BlockingIOError:
            return True
        except OSError:
            return False

    def close(self) -> None:
        """UnregisterSession (best effort) and close the socket."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.sendall(_HEADER.pack(_UNREGISTER_SESSION, 0, self._handle, 0, bytes(8), 0))
        sock.close()

    # -- connection manager -----------------------------------------------------------------

    def forward_open(self, request: OpenRequest, t2o_connection_id: int) -> OpenedConnection:
        """Opens one class-1 connection; a refusal is a DeviceError with its status as `code`."""
        self._serial = (self._serial + 1) & 0xFFFF or 1
        body = _cip.forward_open_request(
            o2t_connection_id=0,
            t2o_connection_id=t2o_connection_id,
            connection_serial=self._serial,
            vendor_id=self.VENDOR_ID,
            originator_serial=self._originator_serial,
            timeout_multiplier=request.timeout_multiplier,
            o2t_rpi_us=request.o2t_rpi_us,
            t2o_rpi_us=request.t2o_rpi_us,
            o2t_size=request.o2t_size,
            t2o_size=request.t2o_size,
            config=request.config,
            output=request.output,
            input=request.input,
            t2o_type="multicast" if request.multicast else "p2p",
            priority=request.priority,
        )
        extra = b""
        if request.multicast or request.udp_port != IMPLICIT_PORT:
            # sin_addr 0: "the address I sent this from"; a multicast open lets the target
            # choose the group and says so in its reply.
            extra = _item(
                _SOCKADDR_T2O, _SOCKADDR.pack(socket.AF_INET, request.udp_port, 0, bytes(8))
            )
        reply, items = self._send_rr(body, extra)
        outcome = _cip.decode_forward_open_reply(reply)
        if not outcome.opened:
            raise DeviceError(f"forward open refused: {outcome.status}", code=outcome.status)
        o2t_host, o2t_port = self.host, IMPLICIT_PORT
        group: str | None = None
        for item_type, data in items:
            if item_type in (_SOCKADDR_O2T, _SOCKADDR_T2O) and len(data) == _SOCKADDR.size:
                _, port, address, _ = _SOCKADDR.unpack(data)
                host = str(ipaddress.IPv4Address(address))
                if item_type == _SOCKADDR_O2T:
                    o2t_port = port or IMPLICIT_PORT
                    if address and not ipaddress.IPv4Address(address).is_unspecified:
                        o2t_host = host
                elif request.multicast and ipaddress.IPv4Address(address).is_multicast:
                    group = host
        if request.multicast and group is None:
            raise DeviceError("a multicast forward open reply carried no T-to-O group address")
        return OpenedConnection(
            o2t_connection_id=outcome.o2t_connection_id,
            t2o_connection_id=outcome.t2o_connection_id,
            o2t_api_us=outcome.o2t_api_us,
            t2o_api_us=outcome.t2o_api_us,
            connection_serial=outcome.connection_serial,
            large=outcome.large,
            o2t_host=o2t_host,
            o2t_port=o2t_port,
            multicast_group=group,
        )

    def forward_close(self, request: OpenRequest, opened: OpenedConnection) -> str | None:
        """Closes a connection; None when closed, else the refusal's status."""
        body = _cip.forward_close_request(
            connection_serial=opened.connection_serial,
            vendor_id=self.VENDOR_ID,
            originator_serial=self._originator_serial,
            config=request.config,
            output=request.output,
            input=request.input,
        )
        reply, _ = self._send_rr(body, b"")
        result: str | None = _cip.decode_forward_close_reply(reply)
        return result

    # -- encapsulation ----------------------------------------------------------------------

    def _send_rr(self, request: bytes, extra_items: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
        """One SendRRData round trip; the unconnected data item's reply and the other items."""
        count = 2 + (1 if extra_items else 0)
        cpf = struct.pack("<IHH", 0, 0, count) + _item(_NULL_ADDRESS, b"")
        cpf += _item(_UNCONNECTED_DATA, request) + extra_items
        _, _, data = self._exchange(_SEND_RR_DATA, cpf, self.timeout_s)
        items = _items(data[6:] if len(data) >= 6 else b"")
        replies = [payload for kind, payload in items if kind == _UNCONNECTED_DATA]
        if not replies:
            raise DeviceError("SendRRData reply without an unconnected data item")
        return replies[0], [(kind, payload) for kind, payload in items if kind != _UNCONNECTED_DATA]

    def _exchange(self, command: int, data: bytes, timeout_s: float) -> tuple[int, int, bytes]:
        sock = self._sock
        if sock is None:
            raise DeviceError("no session: not connected")
        context = _random4() * 2
        try:
            sock.settimeout(timeout_s)
            sock.sendall(_HEADER.pack(command, len(data), self._handle, 0, context, 0) + data)
            while True:
                header = _recv_exact(sock, _HEADER.size)
                reply, length, handle, status, their_context, _ = _HEADER.unpack(header)
                body = _recv_exact(sock, length)
                if reply == command and their_context == context:
                    break
        except (OSError, EOFError) as exc:
            self.close()
            raise DeviceError(f"session to {self.host}:{self.port} lost: {exc}") from exc
        if status:
            name = _ENCAPSULATION_STATUS.get(status, "unknown status")
            raise DeviceError(f"encapsulation status 0x{status:04X} {name}")
        return status, handle, body


def _random4() -> bytes:
    return os.urandom(4)


def _item(kind: int, payload: bytes) -> bytes:
    return struct.pack("<HH", kind, len(payload)) + payload


def _items(cpf: bytes) -> list[tuple[int, bytes]]:
    """The CPF items after the interface handle and timeout; malformed tails are ignored."""
    if len(cpf) < 2:
        return []
    (count,), at, out = struct.unpack_from("<H", cpf), 2, []
    for _ in range(count):
        if at + 4 > len(cpf):
            break
        kind, length = struct.unpack_from("<HH", cpf, at)
        out.append((kind, cpf[at + 4 : at + 4 + length]))
        at += 4 + length
    return out


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise EOFError("the target closed the session")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
