"""Poll mode: a Logix-style PLC's tags read per poll group through `unskit.cip.logix`
(pycomm3's adapter; this module does not import pycomm3).

The driver works around four target behaviours, each exercised against cpppo's simulator
by the tests:

1. No tag upload: the tag definitions come from the configuration (`_define`).
2. Targets with a small reply buffer (cpppo's simulator answers about 500 bytes) refuse a
   large read with "Insufficient Packet Space" even after accepting a 4000-byte Forward
   Open: the driver then sizes reads to `_SMALL_READ_BYTES` (pycomm3 switches to Read Tag
   Fragmented) and retries once, while writes keep the negotiated size (cpppo drops the
   session on Write Tag Fragmented).
3. `connected: false` sends each tag service as an unconnected explicit message (UCMM,
   wrapped in Unconnected Send when the path routes to a slot); an array too large for one
   reply is read as element ranges.
4. A read reply typed DWORD for a BOOL array is a packed bit string (a Logix BOOL[n] is
   stored as DWORD[n/32]): the first read of a BOOL array observes the reply's type code and
   from then on reads ceil(n/32) DWORDs and unpacks them to n booleans (pycomm3 does both
   for a connected read of n booleans); writes to such a tag are refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from unskit.cip.config import cip_connection, security_mode
from unskit.cip.logix import REFUSED, LogixSession, TagResult, base_tag, element_index
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

_SMALL_READ_BYTES = 500
_NO_PACKET_SPACE = "Insufficient Packet Space"


class EnrollmentView(Protocol):
    """What sb/status reads of the EST manager (`unskit.cip.enrollment`)."""

    def status(self) -> dict[str, Any]:
        """enabled, last attempt, outcome, next renewal."""
        ...


def _dwords(bools: int) -> int:
    """DWORDs a packed BOOL array of `bools` elements takes."""
    return -(-bools // BOOLS_PER_DWORD)


class PollDriver:
    """A `DeviceDriver` polling a Logix-style PLC with multi-tag requests."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.connection = cip_connection(spec)
        self._plc: LogixSession | None = None
        #: BOOL arrays observed as packed DWORDs, by signal id.
        self._packed: set[str] = set()
        self._observed: set[str] = set()
        self._info: dict[str, Any] = {}
        #: The configured CIP type of each base tag (the element size of a sliced read).
        self._types = {base_tag(signal.id): signal.type for signal in spec.signals()}
        #: The negotiated request size, and the smaller one reads fall back to (workaround 2).
        self._write_bytes = 0
        self._read_bytes = 0
        #: Requests the device refused in the encapsulation header, with the reason: it may
        #: end the session on them (cpppo on an unknown tag), so they are not sent again.
        self._refused: dict[str, str] = {}
        #: Set by the component when connection.security.est is enabled (sb/status view).
        self.enrollment: EnrollmentView | None = None

    # -- session ---------------------------------------------------------------------------

    def _path(self) -> str:
        path = self.connection.endpoint
        if self.connection.slot is not None:
            path += f"/bp/{self.connection.slot}"
        return path

    def connect(self, deadline_s: float) -> None:
        plc = LogixSession(self._path(), routed=self.connection.slot is not None)
        # The runtime passes connectMs as seconds: it bounds the TCP connect and each
        # reply of the session set-up; later requests get the per-request deadline.
        try:
            plc.open_session(deadline_s, self.spec.timing.request_timeout_ms / 1000)
        except DeviceError as error:
            raise DeviceError(f"{self.spec.endpoint}: {error}") from error
        if not self.connection.connected:
            plc.release_connection()  # nothing holds a CIP connection open
        self._plc = plc
        self._write_bytes = self._read_bytes = int(plc.connection_size)
        self._info = {"productName": plc.info.get("product_name", "")}
        for signal in self.spec.signals():
            self._define(signal)

    def close(self) -> None:
        plc, self._plc = self._plc, None
        if plc is not None:
            plc.close_quietly()

    def probe(self) -> None:
        plc = self._require()
        try:
            identity = plc.identity()
        except DeviceError as error:
            raise DeviceError(f"probe failed: {error}", connection_lost=True) from error
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
                "est": self.enrollment.status()
                if self.enrollment is not None
                else {"enabled": bool(est.get("enabled", False))},
                "target": None,
            },
        }

    # -- tags ------------------------------------------------------------------------------

    def _define(self, signal: SignalSpec, *, packed: bool = False) -> None:
        """Registers a tag definition from the configuration (no upload; workaround 1)."""
        assert self._plc is not None
        if packed:
            code = DWORD_CODE
            elements = element_index(signal.id) + _dwords(signal.array_count or 1)
        else:
            code = TYPES[signal.type.upper()].code
            elements = element_index(signal.id) + (signal.array_count or 1)
        array = signal.array_count is not None or "[" in signal.id
        self._plc.define(base_tag(signal.id), code, elements, array=array)

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

    def _read_tags(self, requests: Sequence[str]) -> list[TagResult]:
        plc = self._require()
        if not self.connection.connected:
            return [self._read_unconnected(plc, request) for request in requests]
        return plc.read_tags(requests, self._read_bytes)

    def _read_unconnected(self, plc: LogixSession, request: str) -> TagResult:
        refused = self._refused.get(request)
        if refused is not None:
            return TagResult(request, None, None, refused)
        result = plc.read_unconnected(request, self._element_size(request))
        if result.error is not None and result.error.startswith(REFUSED):
            self._refused[request] = (
                f"{result.error}; not requested again until the instance restarts: "
                "does the tag exist?"
            )
            _log.warning("%s: %s: %s", self.spec.id, request, self._refused[request])
            return TagResult(request, None, None, self._refused[request])
        return result

    def _element_size(self, request: str) -> int:
        """Bytes per element of the tag a request reads (its configured type)."""
        return TYPES[self._types[base_tag(request.partition("{")[0])].upper()].size

    def _observe_bool_arrays(self, signals: Sequence[SignalSpec]) -> None:
        """Reads each BOOL array once as one element to see whether the PLC packs it."""
        for signal in signals:
            if signal.type != "BOOL" or signal.array_count is None or signal.id in self._observed:
                continue
            result = self._read_tags([f"{signal.id}{{1}}"])[0]
            if result.error is None:
                self._observed.add(signal.id)
                if self._require().reply_type(base_tag(signal.id)) == DWORD_CODE:
                    _log.info("%s: %s is a packed BOOL array", self.spec.id, signal.id)
                    self._packed.add(signal.id)
                    self._define(signal, packed=True)

    def _reading(self, signal: SignalSpec, result: TagResult, now_ms: int) -> Reading:
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
            result = plc.write_unconnected(request, signal.type, value)
        else:
            result = plc.write_tag(request, value, self._write_bytes)
        if result.error is not None:
            raise DeviceError(f"write of {signal.id} failed: {result.error}", code=result.error)

    # -- plumbing --------------------------------------------------------------------------

    def _require(self) -> LogixSession:
        if self._plc is None:
            raise DeviceError("not connected", connection_lost=True)
        return self._plc
