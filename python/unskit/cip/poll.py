"""Poll mode over pycomm3: the only module that imports it.

pycomm3's LogixDriver is used with three workarounds, each exercised against cpppo's
simulator by the tests:

1. No tag upload: many targets (cpppo's simulator, some gateways) do not implement the
   Symbol object's Get-Instance-Attribute-List, and an upload of a large PLC is slow. The
   tag definitions come from the configuration instead (`_define`).
2. pycomm3 1.2.16 sends a single-tag write's payload twice (`build_message` appends again
   on every call); `_patch_single_write` resets the message first.
3. Targets with a small reply buffer (cpppo's simulator answers about 500 bytes) refuse a
   large read with "Insufficient Packet Space" even after accepting a 4000-byte Forward
   Open: the driver then sizes reads to `_SMALL_READ_BYTES` (pycomm3 switches to Read Tag
   Fragmented) and retries once, while writes keep the negotiated size (cpppo drops the
   session on Write Tag Fragmented).
4. `connected: false` sends each tag service as an unconnected explicit message (UCMM,
   wrapped in Unconnected Send when the path routes to a slot): pycomm3 has no unconnected
   tag services, so `_UnconnectedTagRequest` frames Read Tag and Write Tag around
   pycomm3's generic unconnected packet; an array too large for one reply is read as
   element ranges.
5. A read reply typed DWORD for a BOOL array is a packed bit string (a Logix BOOL[n] is
   stored as DWORD[n/32]): the first read of a BOOL array observes the reply's type code and
   from then on reads ceil(n/32) DWORDs and unpacks them to n booleans (pycomm3 does both
   for a connected read of n booleans); writes to such a tag are refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pycomm3 import CommError, LogixDriver, PycommError
from pycomm3.cip import PADDED_EPATH, UINT, DataTypes
from pycomm3.const import BASE_TAG_BIT
from pycomm3.packets import logix as logix_packets
from pycomm3.packets import util as packet_util
from pycomm3.packets.cip import GenericUnconnectedRequestPacket
from pycomm3.packets.util import tag_request_path, wrap_unconnected_send
from pycomm3.tag import Tag

from unskit.cip.config import cip_connection, security_mode
from unskit.elementary_types import BOOLS_PER_DWORD, DWORD_CODE, TYPES
from unskit.southbound.driver import (
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    Quality,
    Reading,
    SignalSpec,
)

__all__ = ["PollDriver"]

_log = logging.getLogger(__name__)

#: Symbol type bit 13: a one-dimensional array.
_ONE_DIMENSION = 1 << 13
_TYPE_CODE_BYTES = 2
_SMALL_READ_BYTES = 500
#: CIP services and the general status of a partial (fragmented) reply.
_READ_TAG = b"\x4c"
_WRITE_TAG = b"\x4d"
_PARTIAL_TRANSFER = 0x06
_NO_PACKET_SPACE = "Insufficient Packet Space"

_patch_lock = threading.Lock()
_patched = False
#: The type code of the last read reply, per thread (set by the reply-parse hook).
_reply_types = threading.local()


def _patch_pycomm3() -> None:
    """Applies the single-write fix and the reply type hook once per process."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        write_packet = logix_packets.WriteTagRequestPacket
        build_message = write_packet.build_message

        def single_write_build_message(self: Any) -> Any:
            if not self._msg_setup:
                self._msg = []
            return build_message(self)

        write_packet.build_message = single_write_build_message  # type: ignore[method-assign]
        parse = packet_util.parse_read_reply

        def observed_parse(data: bytes, data_type: Any, elements: int) -> Any:
            codes: dict[str, int] = getattr(_reply_types, "codes", {})
            codes[data_type.get("tag_name", "")] = int.from_bytes(data[:_TYPE_CODE_BYTES], "little")
            _reply_types.codes = codes
            return parse(data, data_type, elements)

        logix_packets.parse_read_reply = observed_parse  # type: ignore[attr-defined]
        _patched = True


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


def _observed_type(tag: str) -> int | None:
    codes: dict[str, int] = getattr(_reply_types, "codes", {})
    return codes.get(tag)


def _base_tag(tag_path: str) -> str:
    """The tag a path's definition belongs to: ``Tag[3]`` -> ``Tag``, ``Prog:Main.X`` stays."""
    return tag_path.split("[", 1)[0]


def _dwords(bools: int) -> int:
    """DWORDs a packed BOOL array of `bools` elements takes."""
    return -(-bools // BOOLS_PER_DWORD)


def _element_index(tag_path: str) -> int:
    if "[" not in tag_path:
        return 0
    return int(tag_path.split("[", 1)[1].rstrip("]"))


class PollDriver:
    """A `DeviceDriver` polling a Logix-style PLC with multi-tag requests."""

    def __init__(self, spec: InstanceSpec) -> None:
        _patch_pycomm3()
        self.spec = spec
        self.connection = cip_connection(spec)
        self._plc: LogixDriver | None = None
        #: BOOL arrays observed as packed DWORDs, by signal id.
        self._packed: set[str] = set()
        self._observed: set[str] = set()
        self._info: dict[str, Any] = {}
        #: The configured CIP type of each base tag (the element size of a sliced read).
        self._types = {_base_tag(signal.id): signal.type for signal in spec.signals()}
        #: The negotiated request size, and the smaller one reads fall back to (workaround 3).
        self._write_bytes = 0
        self._read_bytes = 0

    # -- session ---------------------------------------------------------------------------

    def _path(self) -> str:
        path = self.connection.endpoint
        if self.connection.slot is not None:
            path += f"/bp/{self.connection.slot}"
        return path

    def connect(self, deadline_s: float) -> None:
        timing = self.spec.timing
        plc = LogixDriver(self._path(), init_tags=False, init_program_tags=False)
        # The runtime passes connectMs as seconds: it bounds the TCP connect and each
        # reply of the session set-up.
        plc.socket_timeout = deadline_s
        try:
            if not plc.open():
                raise DeviceError(f"{self.spec.endpoint}: session not registered")
        except PycommError as error:
            _close_quietly(plc)
            raise DeviceError(f"{self.spec.endpoint}: {_cause(error)}") from error
        # Later requests get the per-request deadline, not the connect budget.
        plc.socket_timeout = timing.request_timeout_ms / 1000
        if plc._sock is not None:
            plc._sock.sock.settimeout(timing.request_timeout_ms / 1000)
        if not self.connection.connected and plc._target_is_connected:
            plc._forward_close()  # nothing holds a CIP connection open
        self._plc = plc
        self._write_bytes = self._read_bytes = int(plc.connection_size)
        self._info = {"productName": plc.info.get("product_name", "")}
        for signal in self.spec.signals():
            self._define(signal)

    def close(self) -> None:
        plc, self._plc = self._plc, None
        if plc is not None:
            _close_quietly(plc)

    def probe(self) -> None:
        plc = self._require()
        try:
            # List Identity is a real round trip on the session that needs no tag.
            identity = plc._list_identity()
        except PycommError as error:
            raise DeviceError(f"probe failed: {_cause(error)}", connection_lost=True) from error
        if not identity:
            raise DeviceError("probe got no identity reply", connection_lost=True)

    def describe(self) -> Mapping[str, Any]:
        est = (self.spec.entry["connection"].get("security") or {}).get("est") or {}
        return {
            "adapter": "ethernet-ip",
            "endpoint": self.spec.endpoint,
            "path": self._path(),
            "connected": self.connection.connected,
            **self._info,
            "packedBoolArrays": sorted(self._packed),
            # The configured mode, never a default: a tls instance is failed, not plaintext.
            "security": {
                "mode": security_mode(self.spec.entry),
                "est": {"enabled": bool(est.get("enabled", False))},
                "target": None,
            },
        }

    # -- tags ------------------------------------------------------------------------------

    def _define(self, signal: SignalSpec, *, packed: bool = False) -> None:
        """Registers a tag definition from the configuration (no upload; workaround 1)."""
        assert self._plc is not None
        base = _base_tag(signal.id)
        if packed:
            code = DWORD_CODE
            elements = _element_index(signal.id) + _dwords(signal.array_count or 1)
        else:
            code = TYPES[signal.type.upper()].code
            elements = _element_index(signal.id) + (signal.array_count or 1)
        array = signal.array_count is not None or "[" in signal.id
        raw = {
            "instance_id": 0,
            "symbol_address": 0,
            "symbol_object_address": 0,
            "software_control": BASE_TAG_BIT,
            "external_access": "Read/Write",
            "dimensions": [elements if array else 0, 0, 0],
            "symbol_type": code | (_ONE_DIMENSION if array else 0),
        }
        self._plc._tags[base] = self._plc._create_tag(base, raw)

    def _request(self, signal: SignalSpec) -> str:
        if signal.array_count is None:
            return signal.id
        count = signal.array_count
        if signal.id in self._packed and not self.connection.connected:
            # Our unconnected Read Tag counts DWORDs; pycomm3's connected read of a DWORD
            # tag counts booleans and reads the DWORDs that hold them itself.
            count = _dwords(count)
        return f"{signal.id}{{{count}}}"

    def read(self, group: PollGroupSpec) -> list[Reading]:
        self._observe_bool_arrays(group.signals)
        requests = [self._request(signal) for signal in group.signals]
        results = self._read_tags(requests)
        if self._read_bytes > _SMALL_READ_BYTES and any(
            result.error and _NO_PACKET_SPACE in result.error for result in results
        ):
            _log.info("%s: replies too large for the target, reading in fragments", self.spec.id)
            self._read_bytes = _SMALL_READ_BYTES
            results = self._read_tags(requests)
        now_ms = int(time.time() * 1000)
        return [
            self._reading(signal, result, now_ms)
            for signal, result in zip(group.signals, results, strict=True)
        ]

    def _read_tags(self, requests: Sequence[str]) -> list[Tag]:
        plc = self._require()
        if not self.connection.connected:
            return [self._call(lambda r=request: self._read_unconnected(r)) for request in requests]
        plc._cfg["connection_size"] = self._read_bytes
        results = self._call(lambda: plc.read(*requests))
        return results if isinstance(results, list) else [results]

    def _observe_bool_arrays(self, signals: Sequence[SignalSpec]) -> None:
        """Reads each BOOL array once as one element to see whether the PLC packs it."""
        for signal in signals:
            if signal.type != "BOOL" or signal.array_count is None or signal.id in self._observed:
                continue
            result = self._read_tags([f"{signal.id}{{1}}"])[0]
            if result.error is None:
                self._observed.add(signal.id)
                if _observed_type(_base_tag(signal.id)) == DWORD_CODE:
                    _log.info("%s: %s is a packed BOOL array", self.spec.id, signal.id)
                    self._packed.add(signal.id)
                    self._define(signal, packed=True)

    def _reading(self, signal: SignalSpec, result: Tag, now_ms: int) -> Reading:
        if result.error is not None or result.value is None:
            return Reading(signal.id, None, Quality.BAD, now_ms, result.error or "no value")
        value = result.value
        if signal.array_count is None:
            return Reading(signal.id, value, Quality.GOOD, now_ms)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if signal.id in self._packed:
            values = [bool(bit) for bit in values][: signal.array_count]
        if len(values) != signal.array_count:
            detail = f"count mismatch: {len(values)} of {signal.array_count}"
            return Reading(signal.id, values, Quality.BAD, now_ms, detail)
        return Reading(signal.id, values, Quality.GOOD, now_ms)

    def write(self, signal: SignalSpec, value: Any) -> None:
        if signal.id in self._packed:
            raise ValueError(f"{signal.id} is a packed BOOL array: writes are refused")
        plc = self._require()
        request = self._request(signal)
        if not self.connection.connected:
            result = self._call(lambda: self._write_unconnected(signal, value))
        else:
            plc._cfg["connection_size"] = self._write_bytes
            result = self._call(lambda: plc.write((request, value)))
        if isinstance(result, Tag) and result.error is not None:
            raise DeviceError(f"write of {signal.id} failed: {result.error}", code=result.error)

    # -- unconnected explicit messaging (workaround 4) -------------------------------------

    def _route(self) -> bytes | None:
        plc = self._require()
        if self.connection.slot is None:
            return None
        segments: Any = plc._cfg["cip_path"]
        return bytes(PADDED_EPATH.encode(segments, length=True, pad_length=True))

    def _tag_path(self, request: str) -> tuple[bytes, dict[str, Any], int]:
        """The symbolic path, the tag definition and the element count of a request."""
        plc = self._require()
        tag, _, count = request.partition("{")
        info = plc._tags[_base_tag(tag)]
        path = tag_request_path(tag, info, False)
        if path is None:
            raise DeviceError(f"cannot address {tag!r}")
        return bytes(path), info, int(count.rstrip("}") or 1)

    def _read_unconnected(self, request: str) -> Tag:
        plc = self._require()
        path, info, elements = self._tag_path(request)
        reply = plc.send(
            _UnconnectedTagRequest(_READ_TAG, path, UINT.encode(elements), self._route())
        )
        if reply.service_status == _PARTIAL_TRANSFER and reply.value:
            data = self._read_slices(request, elements, reply.value)
        elif reply.service_status != 0 or reply.value is None:
            return Tag(request, None, None, reply.error or "read failed")
        else:
            data = reply.value
        value, data_type = logix_packets.parse_read_reply(data, info, elements)  # type: ignore[attr-defined]
        return Tag(request, value, data_type, None)

    def _read_slices(self, request: str, elements: int, first: bytes) -> bytes:
        """The rest of an array whose reply did not fit one unconnected message, read as
        element ranges of the size that did fit (cpppo answers no Read Tag Fragmented
        outside a connection)."""
        plc = self._require()
        tag = request.partition("{")[0]
        base, start = _base_tag(tag), _element_index(tag)
        size = TYPES[self._types[base].upper()].size
        head, chunks = first[:_TYPE_CODE_BYTES], [first[_TYPE_CODE_BYTES:]]
        per_reply = max(len(chunks[0]) // size, 1)
        done = per_reply
        while done < elements:
            count = min(per_reply, elements - done)
            path, _, _ = self._tag_path(f"{base}[{start + done}]{{{count}}}")
            data = UINT.encode(count)
            reply = plc.send(_UnconnectedTagRequest(_READ_TAG, path, data, self._route()))
            if reply.service_status != 0 or not reply.value:
                raise DeviceError(f"read of {base}[{start + done}] failed: {reply.error}")
            chunks.append(reply.value[_TYPE_CODE_BYTES:])
            done += count
        return head + b"".join(chunks)

    def _write_unconnected(self, signal: SignalSpec, value: Any) -> Tag:
        plc = self._require()
        path, _, elements = self._tag_path(self._request(signal))
        # pycomm3's encoders keep its wire form of each type (a true BOOL is 0xFF).
        kind: Any = DataTypes[signal.type.lower()]
        items = value if isinstance(value, list) else [value]
        data = UINT.encode(TYPES[signal.type.upper()].code) + UINT.encode(elements)
        data += b"".join(kind.encode(item) for item in items)
        reply = plc.send(_UnconnectedTagRequest(_WRITE_TAG, path, data, self._route()))
        return Tag(
            signal.id, value, signal.type, None if reply.service_status == 0 else reply.error
        )

    # -- plumbing --------------------------------------------------------------------------

    def _require(self) -> LogixDriver:
        if self._plc is None:
            raise DeviceError("not connected", connection_lost=True)
        return self._plc

    def _call(self, work: Any) -> Any:
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


def _close_quietly(plc: LogixDriver) -> None:
    try:
        plc.close()
    except (PycommError, OSError) as error:
        _log.debug("close: %s", error)
