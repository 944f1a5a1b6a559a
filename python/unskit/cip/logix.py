"""pycomm3 behind one adapter: the only module that imports it.

`LogixSession` is pycomm3's LogixDriver with every use of pycomm3's internals kept here.
pyproject.toml pins pycomm3 to the release they were checked against, and
tests/cip/test_pycomm3_internals.py names each one, so an upgrade that moves one fails
there instead of misbehaving. The session's tag services raise DeviceError, never a
pycomm3 exception. What it adds to LogixDriver, and the internals each part leans on:

- Tags defined from the configuration, not uploaded (`define`): many targets (cpppo's
  simulator, some gateways) do not implement the Symbol object's
  Get-Instance-Attribute-List, and an upload of a large PLC is slow. `_tags`, `_create_tag`.
- The request size chosen per call (`read_tags`, `write_tag`): reads may drop to a small
  size while writes keep the negotiated one. `_cfg["connection_size"]`.
- The request timeout applied to the open socket (`open_session`): pycomm3 applies
  `socket_timeout` only when it creates the socket. `_sock` (pycomm3's Socket) and its
  `sock`. CIPDriver.open() uses a `_sock` set before it is called, which is where the CIP
  Security transport will hand in its TLS socket.
- CIP Security (`TlsTransport`): a pycomm3 `Socket` whose `sock` is the Rust core's rustls
  connection (`unskit.pki.tls.TlsSocket`, socket-like: send, recv, settimeout, close),
  set as `_sock` before `open()`, so pycomm3's framing runs unchanged inside TLS.
- The target's security posture (`security_attribute`): Get Attribute Single on the CIP
  Security (0x5D) and EtherNet/IP Security (0x5E) objects through `generic_message`.
- No CIP connection held in unconnected mode (`release_connection`): pycomm3's session
  set-up may leave one open. `_target_is_connected`, `_forward_close`.
- The probe (`identity`): List Identity on the open session needs no tag and every
  EtherNet/IP target answers it. `_list_identity`.
- pycomm3 1.2.16 sends a single-tag write's payload twice: it builds the message, marks it
  not set up and builds it again, and the set-up appends to what the first build left.
  `send` empties such a message first. `RequestPacket._msg`, `_msg_setup`.
- The type code of each read reply, recorded in `send` (`reply_type`): a BOOL array
  answered as DWORD is packed. The replies' `data` and `tag_info`, and
  MultiServiceResponsePacket's `responses`.
- Read Tag and Write Tag as unconnected messages (`read_unconnected`, `write_unconnected`):
  pycomm3 has no unconnected tag services, so `_UnconnectedTagRequest` frames them around
  GenericUnconnectedRequestPacket (`_setup_message`, `_msg`), routed with `_cfg["cip_path"]`
  when a slot is configured, and replies are decoded by packets.util's `parse_read_reply`.
- A request refused in the encapsulation header (`REFUSED`): cpppo answers a Read Tag of a
  tag it does not know with a bare header carrying a non-zero status, then ends the
  session; the reply's `raw` bytes hold that status.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pycomm3 import CommError, LogixDriver, PycommError
from pycomm3.cip import PADDED_EPATH, UINT, DataTypes
from pycomm3.const import BASE_TAG_BIT
from pycomm3.packets.base import RequestPacket
from pycomm3.packets.cip import GenericUnconnectedRequestPacket
from pycomm3.packets.logix import (
    MultiServiceResponsePacket,
    ReadTagResponsePacket,
    WriteTagRequestPacket,
)
from pycomm3.packets.util import parse_read_reply, tag_request_path, wrap_unconnected_send
from pycomm3.socket_ import Socket
from pycomm3.tag import Tag

from unskit.elementary_types import TYPES
from unskit.errors import CredentialError, DeviceError, TlsError
from unskit.pki.tls import ClientConfig, TlsSocket

__all__ = [
    "REFUSED",
    "LogixSession",
    "TagResult",
    "TlsTransport",
    "base_tag",
    "element_index",
    "quiet_probe",
]

_log = logging.getLogger(__name__)

#: Set on a thread while it asks for a CIP Security attribute: a target without the object
#: makes pycomm3 log ERRORs for an outcome the caller expects and reports itself.
_probing = threading.local()


class _QuietWhileProbing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_probing, "active", False)


@contextlib.contextmanager
def quiet_probe() -> Iterator[None]:
    """Drops pycomm3's log records of this thread inside: a posture read and the close of
    the session it may have broken fail by design on a target without the objects."""
    _probing.active = True
    try:
        yield
    finally:
        _probing.active = False


# pycomm3's loggers are named `module.qualname`; a filter acts on the logger it is added to.
for _name in (
    "pycomm3.cip_driver.CIPDriver",
    "pycomm3.logix_driver.LogixDriver",
    "pycomm3.packets.ethernetip.SendRRDataResponsePacket",
    "pycomm3.packets.base.ResponsePacket",
):
    logging.getLogger(_name).addFilter(_QuietWhileProbing())

#: One tag service's outcome: `tag`, `value`, `type` and `error` (None when it succeeded).
TagResult = Tag

_T = TypeVar("_T")

#: Symbol type bit 13: a one-dimensional array.
_ONE_DIMENSION = 1 << 13
_TYPE_CODE_BYTES = 2
#: CIP services and the general status of a partial (fragmented) reply.
_READ_TAG = b"\x4c"
_WRITE_TAG = b"\x4d"
_PARTIAL_TRANSFER = 0x06
#: The EtherNet/IP encapsulation header: 24 bytes, its status a UDINT at offset 8.
_HEADER_BYTES = 24
_STATUS_AT = slice(8, 12)
#: How a tag's error starts when the device refused its request in the encapsulation header.
REFUSED = "refused by the device"


def base_tag(tag_path: str) -> str:
    """The tag a path's definition belongs to: ``Tag[3]`` -> ``Tag``, ``Prog:Main.X`` stays."""
    return tag_path.split("[", 1)[0]


def element_index(tag_path: str) -> int:
    """The first element a path addresses: ``Tag[3]`` -> 3, ``Tag`` -> 0."""
    if "[" not in tag_path:
        return 0
    return int(tag_path.split("[", 1)[1].rstrip("]"))


class _UnconnectedTagRequest(GenericUnconnectedRequestPacket):
    """A tag service addressed by a symbolic path, sent as an unconnected message."""

    def __init__(self, service: bytes, path: bytes, data: bytes, route: bytes | None) -> None:
        super().__init__(
            service=service,
            class_code=0,
            instance=0,
            request_data=data,
            route_path=route or b"",
            unconnected_send=route is not None,
        )
        self.symbolic_path = path

    def _setup_message(self) -> None:
        # The grandparent's set-up (the SendRRData header), then our own message body.
        super(GenericUnconnectedRequestPacket, self)._setup_message()
        body = b"".join((self.service, self.symbolic_path, self.request_data))
        self._msg += [
            wrap_unconnected_send(body, self.route_path) if self.unconnected_send else body
        ]


class TlsTransport(Socket):
    """pycomm3's socket layer over a rustls connection (mutual TLS, CIP Security)."""

    def __init__(self, config: ClientConfig, server_name: str, timeout: float) -> None:
        # Not Socket.__init__: it would open a plain TCP socket nobody uses.
        self._config = config
        self._server_name = server_name
        self._timeout = timeout
        self.tls: TlsSocket | None = None

    def connect(self, host: str, port: int) -> None:
        try:
            self.tls = TlsSocket.connect(self._config, host, port, self._server_name, self._timeout)
        except (TlsError, CredentialError, OSError) as error:
            raise CommError(f"TLS to {host}:{port}") from error
        # pycomm3's Socket does all its I/O through `sock`: the TLS socket stands in for it.
        self.sock = self.tls  # type: ignore[assignment]

    def close(self) -> None:
        if self.tls is not None:
            self.tls.close()

    def negotiated(self) -> tuple[str, str, str] | None:
        """(protocol version, IANA suite, rustls suite) once connected."""
        return None if self.tls is None else self.tls.negotiated()

    def peer_certificates(self) -> list[bytes]:
        """The device's certificate chain as DER, leaf first."""
        return [] if self.tls is None else list(self.tls.peer_certificates())


class LogixSession(LogixDriver):
    """One EtherNet/IP session to a Logix-style target, tags defined from configuration."""

    def __init__(self, path: str, *, routed: bool, transport: TlsTransport | None = None) -> None:
        try:
            super().__init__(path, init_tags=False, init_program_tags=False)
        except PycommError as error:
            # pycomm3 parses the path here (it refuses port 65535): a DeviceError leaves
            # the instance retrying with lastError instead of ending its thread.
            raise DeviceError(f"{path}: {_cause(error)}") from error
        #: Unconnected tag services go in Unconnected Send along the path's route (a slot).
        self.routed = routed
        #: The type code of the last valid read reply, by base tag name.
        self._unskit_reply_types: dict[str, int] = {}
        #: pycomm3's open() uses a socket set beforehand: the TLS one when there is one.
        self.transport = transport
        if transport is not None:
            self._sock = transport

    # -- session ---------------------------------------------------------------------------

    def open_session(self, connect_s: float, request_s: float) -> None:
        """Connects and registers the session within `connect_s`; requests get `request_s`."""
        # connect_s bounds the TCP connect and each reply of the session set-up.
        self.socket_timeout = connect_s
        try:
            registered = self.open()
        except PycommError as error:
            self.close_quietly()
            raise DeviceError(_cause(error)) from error
        if not registered:
            # open() leaves the socket connected when the target refuses RegisterSession.
            self.close_quietly()
            raise DeviceError("session not registered")
        self.socket_timeout = request_s
        if self._sock is not None:
            self._sock.sock.settimeout(request_s)

    def security_attribute(self, class_code: int, attribute: int) -> bytes | None:
        """One attribute of instance 1 of a CIP Security object (None: not answered).
        A target without the object may end the session instead of answering (cpppo does):
        that raises DeviceError with connection_lost."""
        try:
            reply = self.generic_message(
                service=b"\x0e",
                class_code=class_code,
                instance=1,
                attribute=attribute,
                connected=False,
                name="security",
            )
        except CommError as error:
            raise DeviceError(_cause(error), connection_lost=True) from error
        except PycommError as error:
            raise DeviceError(_cause(error)) from error
        if reply.error:
            if "connection broken" in str(reply.error) or "failed to receive" in str(reply.error):
                raise DeviceError(str(reply.error), connection_lost=True)
            return None
        value = reply.value
        return bytes(value) if value is not None else None

    def release_connection(self) -> None:
        """Closes the CIP connection the session set-up may have opened (Forward Close)."""
        if not self._target_is_connected:
            return
        try:
            _translated(self._forward_close)
        except DeviceError:
            # The caller has no session to close yet: a failed release must not leak one.
            self.close_quietly()
            raise

    def identity(self) -> Mapping[str, Any] | None:
        """The target's identity from List Identity on the open session."""
        try:
            identity: Mapping[str, Any] | None = self._list_identity()
        except PycommError as error:
            raise DeviceError(_cause(error), connection_lost=True) from error
        return identity

    def close_quietly(self) -> None:
        """Closes the session, logging (not raising) what goes wrong."""
        try:
            self.close()
        except (PycommError, OSError) as error:
            _log.debug("close: %s", error)

    def send(self, request: RequestPacket) -> Any:
        """Every request passes here: the single-write fix, and reply types recorded."""
        if isinstance(request, WriteTagRequestPacket) and not request._msg_setup:
            request._msg = []
        response = super().send(request)
        replies = (
            response.responses if isinstance(response, MultiServiceResponsePacket) else [response]
        )
        for reply in replies:
            if isinstance(reply, ReadTagResponsePacket) and reply:
                self._note_reply_type(reply.tag_info, reply.data)
        return response

    def _note_reply_type(self, tag_info: Mapping[str, Any], data: Any) -> None:
        code = int.from_bytes(data[:_TYPE_CODE_BYTES], "little")
        self._unskit_reply_types[tag_info.get("tag_name", "")] = code

    def reply_type(self, base: str) -> int | None:
        """The type code of the last read reply for tag `base`, if one was read."""
        return self._unskit_reply_types.get(base)

    # -- tags ------------------------------------------------------------------------------

    def define(self, base: str, code: int, elements: int, *, array: bool) -> None:
        """Registers tag `base` of CIP type `code` (`elements` long when an array)."""
        raw = {
            "instance_id": 0,
            "symbol_address": 0,
            "symbol_object_address": 0,
            "software_control": BASE_TAG_BIT,
            "external_access": "Read/Write",
            "dimensions": [elements if array else 0, 0, 0],
            "symbol_type": code | (_ONE_DIMENSION if array else 0),
        }
        self._tags[base] = self._create_tag(base, raw)

    def read_tags(self, requests: Sequence[str], request_bytes: int) -> list[TagResult]:
        """Reads `requests` over a CIP connection, in requests of up to `request_bytes`."""
        self._cfg["connection_size"] = request_bytes
        results = _translated(lambda: self.read(*requests))
        return results if isinstance(results, list) else [results]

    def write_tag(self, request: str, value: Any, request_bytes: int) -> TagResult:
        """Writes one tag over a CIP connection, in requests of up to `request_bytes`."""
        self._cfg["connection_size"] = request_bytes
        result: TagResult = _translated(lambda: self.write((request, value)))
        return result

    # -- unconnected explicit messaging ----------------------------------------------------

    def read_unconnected(self, request: str, element_size: int) -> TagResult:
        """Reads one tag with unconnected Read Tag; an array too large for one reply is read
        as element ranges of `element_size`-byte elements."""
        return _translated(lambda: self._unconnected_read(request, element_size))

    def write_unconnected(self, request: str, type_name: str, value: Any) -> TagResult:
        """Writes one tag of CIP type `type_name` with unconnected Write Tag."""
        return _translated(lambda: self._unconnected_write(request, type_name, value))

    def _route(self) -> bytes | None:
        if not self.routed:
            return None
        segments: Any = self._cfg["cip_path"]
        return bytes(PADDED_EPATH.encode(segments, length=True, pad_length=True))

    def _tag_path(self, request: str) -> tuple[bytes, dict[str, Any], int]:
        """The symbolic path, the tag definition and the element count of a request."""
        tag, _, count = request.partition("{")
        info = self._tags[base_tag(tag)]
        path = tag_request_path(tag, info, False)
        if path is None:
            raise DeviceError(f"cannot address {tag!r}")
        return bytes(path), info, int(count.rstrip("}") or 1)

    def _unconnected_read(self, request: str, element_size: int) -> TagResult:
        path, info, elements = self._tag_path(request)
        reply = self.send(
            _UnconnectedTagRequest(_READ_TAG, path, UINT.encode(elements), self._route())
        )
        raw = bytes(reply.raw or b"")
        status = int.from_bytes(raw[_STATUS_AT], "little") if len(raw) >= _HEADER_BYTES else 0
        if status:
            return Tag(request, None, None, f"{REFUSED} (EtherNet/IP status 0x{status:04X})")
        if reply.service_status == _PARTIAL_TRANSFER and reply.value:
            data = self._read_slices(request, elements, element_size, reply.value)
        elif reply.service_status != 0 or reply.value is None:
            return Tag(request, None, None, reply.error or "read failed")
        else:
            data = reply.value
        self._note_reply_type(info, data)
        value, data_type = parse_read_reply(data, info, elements)
        return Tag(request, value, data_type, None)

    def _read_slices(self, request: str, elements: int, size: int, first: bytes) -> bytes:
        """The rest of an array whose reply did not fit one unconnected message, read as
        element ranges of the size that did fit (cpppo answers no Read Tag Fragmented
        outside a connection)."""
        tag = request.partition("{")[0]
        base, start = base_tag(tag), element_index(tag)
        head, chunks = first[:_TYPE_CODE_BYTES], [first[_TYPE_CODE_BYTES:]]
        per_reply = max(len(chunks[0]) // size, 1)
        done = per_reply
        while done < elements:
            count = min(per_reply, elements - done)
            path, _, _ = self._tag_path(f"{base}[{start + done}]{{{count}}}")
            data = UINT.encode(count)
            reply = self.send(_UnconnectedTagRequest(_READ_TAG, path, data, self._route()))
            if reply.service_status != 0 or not reply.value:
                raise DeviceError(f"read of {base}[{start + done}] failed: {reply.error}")
            chunks.append(reply.value[_TYPE_CODE_BYTES:])
            done += count
        return head + b"".join(chunks)

    def _unconnected_write(self, request: str, type_name: str, value: Any) -> TagResult:
        path, _, elements = self._tag_path(request)
        # pycomm3's encoders keep its wire form of each type (a true BOOL is 0xFF).
        kind: Any = DataTypes[type_name.lower()]
        items = value if isinstance(value, list) else [value]
        data = UINT.encode(TYPES[type_name.upper()].code) + UINT.encode(elements)
        data += b"".join(kind.encode(item) for item in items)
        reply = self.send(_UnconnectedTagRequest(_WRITE_TAG, path, data, self._route()))
        return Tag(request, value, type_name, None if reply.service_status == 0 else reply.error)


def _translated(work: Callable[[], _T]) -> _T:
    """Runs a tag service, pycomm3's and the socket's errors raised as DeviceError."""
    try:
        return work()
    except CommError as error:
        raise DeviceError(_cause(error), connection_lost=True) from error
    except PycommError as error:
        raise DeviceError(_cause(error)) from error
    except OSError as error:
        raise DeviceError(str(error), connection_lost=True) from error


def _cause(error: BaseException) -> str:
    parts = [str(error)]
    cause = error.__cause__
    while cause is not None:
        parts.append(str(cause))
        cause = cause.__cause__
    return ": ".join(part for part in parts if part)
