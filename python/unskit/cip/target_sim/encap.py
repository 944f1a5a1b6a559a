"""Encapsulation over TCP: sessions, ListIdentity, SendRRData and the Message Router requests
it carries (see `unskit.cip.target_sim`)."""

from __future__ import annotations

import contextlib
import struct

from unskit.cip.target_sim.connection_manager import _ConnectionManager
from unskit.cip.target_sim.state import _log, _Session
from unskit.cip.target_sim.wire import (
    DEVICE_TYPE,
    ENCAP_HEADER,
    ENCAP_INCORRECT_DATA,
    ENCAP_INVALID_COMMAND,
    ENCAP_INVALID_LENGTH,
    ENCAP_INVALID_SESSION,
    ENCAP_UNSUPPORTED_VERSION,
    FORWARD_CLOSE,
    FORWARD_OPEN,
    GS_CONNECTION_FAILURE,
    GS_NOT_ENOUGH_DATA,
    GS_PATH_DESTINATION_UNKNOWN,
    GS_SERVICE_NOT_SUPPORTED,
    ITEM_IDENTITY,
    ITEM_NULL,
    ITEM_SOCKADDR_T2O,
    ITEM_UNCONNECTED_DATA,
    LARGE_FORWARD_OPEN,
    LIST_IDENTITY,
    PRODUCT_CODE,
    PRODUCT_NAME,
    REGISTER_SESSION,
    REVISION,
    SEND_RR_DATA,
    SERIAL_NUMBER,
    UNCONNECTED_SEND,
    UNREGISTER_SESSION,
    VENDOR_ID,
    MalformedError,
    RefusalError,
    cip_reply,
    cpf_items,
    sockaddr_item,
)


class _Encapsulation(_ConnectionManager):
    """Answers encapsulation messages on the sim's TCP sessions."""

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
