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

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from unskit.cip.config import cip_connection
from unskit.cip.logix import (
    REFUSED,
    LogixSession,
    TagResult,
    TlsTransport,
    base_tag,
    element_index,
    quiet_probe,
)
from unskit.cip.posture import read_posture
from unskit.cip.security import (
    CREDENTIAL_REJECTED,
    PEER_UNVERIFIED,
    Credentials,
    ExpiryWatch,
    SecurityPolicy,
    load_credentials,
    load_trust_anchors,
    parse_credentials,
)
from unskit.config.vault import VaultSecrets
from unskit.elementary_types import BOOLS_PER_DWORD, DWORD_CODE, TYPES
from unskit.errors import CredentialError
from unskit.pki.certificates import CertificateSummary
from unskit.pki.tls import cipher_suite_names
from unskit.southbound.driver import (
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    Quality,
    Reading,
    SignalSpec,
)

__all__ = ["EventSink", "PollDriver"]

#: (severity, event type, context) -> publishes one event of this instance.
EventSink = Callable[[str, str, Mapping[str, Any]], None]


def _no_events(severity: str, event_type: str, context: Mapping[str, Any]) -> None:
    _log.info("event %s/%s: %s", severity, event_type, dict(context))


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

    def __init__(
        self,
        spec: InstanceSpec,
        *,
        secrets: VaultSecrets | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.spec = spec
        self.connection = cip_connection(spec)
        self.policy = SecurityPolicy.from_block(spec.entry["connection"].get("security") or {})
        self._secrets = secrets
        self._emit = events or _no_events
        self._expiry = ExpiryWatch(self._emit, self.policy.renew_before_days)
        #: The credentials of the current (or next) TLS connection.
        self._credentials: Credentials | None = None
        #: The digest of what the configured source held when last read: a reload
        #: reconnects only when the source itself changed.
        self._source_digest: str | None = None
        #: Credentials handed in by `swap_client_credentials`, applied on this thread.
        self._swap_lock = threading.Lock()
        self._pending: Credentials | None = None
        self._next_reload = 0.0
        self._last_rejection = ""
        self._tls_facts: dict[str, Any] = {}
        #: None until the target was asked; then its posture, or False without the objects.
        self._posture: Mapping[str, Any] | bool | None = None
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
        if self._posture is None:
            self._ask_posture(deadline_s)
        plc = self._open(deadline_s)
        if not self.connection.connected:
            plc.release_connection()  # nothing holds a CIP connection open
        self._plc = plc
        self._write_bytes = self._read_bytes = int(plc.connection_size)
        self._info = {"productName": plc.info.get("product_name", "")}
        for signal in self.spec.signals():
            self._define(signal)

    def _open(self, deadline_s: float, *, probe: bool = False) -> LogixSession:
        transport = self._transport(deadline_s) if self.policy.tls else None
        plc = LogixSession(
            self._path(), routed=self.connection.slot is not None, transport=transport
        )
        # The runtime passes connectMs as seconds: it bounds the TCP connect and each
        # reply of the session set-up; later requests get the per-request deadline.
        try:
            plc.open_session(deadline_s, self.spec.timing.request_timeout_ms / 1000)
        except DeviceError as error:
            raise DeviceError(f"{self.spec.endpoint}: {error}") from error
        if transport is not None and not probe:
            self._note_handshake(transport)
        return plc

    def _ask_posture(self, deadline_s: float) -> None:
        """Reads the target's CIP Security posture once per instance, on a session of its
        own: a target without the objects may end the session instead of answering (cpppo
        does), which must not cost the polling session."""
        session = self._open(deadline_s, probe=True)
        with quiet_probe():
            try:
                self._posture = read_posture(session.security_attribute) or False
            except DeviceError as error:
                _log.info("%s: CIP Security objects not readable: %s", self.spec.id, error)
                self._posture = False
            finally:
                session.close_quietly()
        if not self._posture:
            _log.info("%s: the target has no CIP Security object", self.spec.id)

    # -- CIP Security ----------------------------------------------------------------------

    def _transport(self, deadline_s: float) -> TlsTransport:
        credentials = self._credentials_for_connect()
        self._refuse_unusable_client(credentials.client)
        try:
            config = credentials.config(self.policy)
        except CredentialError as error:
            self._reject(error)
            raise DeviceError(f"{self.spec.endpoint}: {error}") from error
        return TlsTransport(config, self.policy.server_name or self.connection.host, deadline_s)

    def _credentials_for_connect(self) -> Credentials:
        with self._swap_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._credentials = pending
            return pending
        try:
            loaded = load_credentials(self.policy, self._secrets)
        except CredentialError as error:
            self._reject(error)
            if self._credentials is None:
                raise DeviceError(f"{self.spec.endpoint}: {error}") from error
            _log.warning("%s: keeping the previous credentials: %s", self.spec.id, error)
            return self._credentials
        if loaded.digest != self._source_digest or self._credentials is None:
            self._source_digest = loaded.digest
            self._credentials = loaded
        self._next_reload = time.monotonic() + self.policy.reload_interval_secs
        return self._credentials

    def _refuse_unusable_client(self, client: CertificateSummary) -> None:
        self._expiry.check(client)
        now = datetime.datetime.now(datetime.timezone.utc)
        if now < client.not_before:
            raise DeviceError(
                f"{self.spec.endpoint}: the client certificate {client.subject} is not valid "
                f"before {client.not_before.isoformat()}"
            )
        if self.policy.check_expiration and now >= client.not_after:
            raise DeviceError(
                f"{self.spec.endpoint}: the client certificate {client.subject} expired at "
                f"{client.not_after.isoformat()}: refused at connect (checkExpiration)"
            )

    def _reject(self, error: CredentialError) -> None:
        """A credential problem: logged and published once per distinct problem."""
        message = str(error)
        if message == self._last_rejection:
            return
        self._last_rejection = message
        _log.error("%s: credentials rejected: %s", self.spec.id, message)
        self._emit(
            "error",
            CREDENTIAL_REJECTED,
            {
                "error": message,
                "source": self.policy.client_source,
                "keptPrevious": self._credentials is not None,
            },
        )

    def _note_handshake(self, transport: TlsTransport) -> None:
        negotiated = transport.negotiated()
        peer = transport.peer_certificates()
        summary = CertificateSummary.of_der(peer[0]).to_json() if peer else None
        self._tls_facts = {
            "protocol": negotiated[0] if negotiated else None,
            "cipherSuite": negotiated[1] if negotiated else None,
            "peerCertificate": summary,
        }
        if not self.policy.verify_peer:
            self._emit(
                "warning",
                PEER_UNVERIFIED,
                {
                    "endpoint": self.spec.endpoint,
                    "serverName": self.policy.server_name or self.connection.host,
                    "peerCertificate": summary,
                },
            )

    def swap_client_credentials(
        self, cert_chain_pem: bytes, key_pem: bytes, ca_pem: bytes | None = None
    ) -> CertificateSummary:
        """Hands in a new client identity (the EST manager's seam); thread-safe. Checks it
        now (raises CredentialError, keeping the current one), then the instance thread
        reconnects with it at its next poll or probe. `ca_pem` None keeps the trust anchors."""
        current = self._credentials
        if ca_pem is not None:
            roots: tuple[bytes, ...] = (ca_pem,)
        elif current is not None:
            roots = current.roots_pem
        else:
            # A first enrollment: nothing loaded yet, so the configured CA is the trust.
            roots = tuple(load_trust_anchors(self.policy, self._secrets))
        fresh = parse_credentials(cert_chain_pem, key_pem, roots, source="swapped")
        fresh.config(self.policy)  # the Rust side's checks too, before anything changes
        with self._swap_lock:
            self._pending = fresh
        return fresh.client

    def _maintain_credentials(self) -> None:
        """Applies swapped or reloaded credentials by reconnecting; runs on the instance
        thread from read and probe. Bad new material keeps the current connection."""
        if not self.policy.tls:
            return
        with self._swap_lock:
            swapped = self._pending is not None
        changed = swapped
        interval = self.policy.reload_interval_secs
        if not swapped and interval and time.monotonic() >= self._next_reload:
            self._next_reload = time.monotonic() + interval
            try:
                loaded = load_credentials(self.policy, self._secrets)
            except CredentialError as error:
                self._reject(error)
            else:
                if loaded.digest != self._source_digest:
                    _log.info("%s: credentials changed in their source", self.spec.id)
                    self._source_digest = loaded.digest
                    with self._swap_lock:
                        self._pending = loaded
                    changed = True
        if self._credentials is not None:
            self._expiry.check(self._credentials.client)
        if changed:
            self.close()
            try:
                self.connect(self.spec.timing.connect_ms / 1000)
            except DeviceError as error:
                raise DeviceError(str(error), connection_lost=True) from error

    def close(self) -> None:
        plc, self._plc = self._plc, None
        if plc is not None:
            plc.close_quietly()

    def probe(self) -> None:
        self._maintain_credentials()
        plc = self._require()
        try:
            identity = plc.identity()
        except DeviceError as error:
            raise DeviceError(f"probe failed: {error}", connection_lost=True) from error
        if not identity:
            raise DeviceError("probe got no identity reply", connection_lost=True)

    def _security(self) -> dict[str, Any]:
        posture = self._posture if isinstance(self._posture, Mapping) else None
        security: dict[str, Any] = {
            # The configured mode, never a default.
            "mode": self.policy.mode,
            "est": self.enrollment.status()
            if self.enrollment is not None
            else {"enabled": self.policy.est_enabled},
            "target": dict(posture) if posture is not None else None,
            "targetSupportsCipSecurity": posture is not None,
        }
        if not self.policy.tls:
            return security
        credentials = self._credentials
        names = cipher_suite_names()
        security["tls"] = {
            **self._tls_facts,
            "verifyPeer": self.policy.verify_peer,
            "serverName": self.policy.server_name or self.connection.host,
            "checkExpiration": self.policy.check_expiration,
            "allowedCipherSuites": [names[n.strip().upper()] for n in self.policy.cipher_suites]
            if self.policy.cipher_suites
            else sorted(set(names.values())),
            "clientSource": self.policy.client_source,
            "clientCertificate": None if credentials is None else credentials.client.to_json(),
            "trustAnchors": 0 if credentials is None else len(credentials.roots),
            "reloadIntervalSecs": self.policy.reload_interval_secs,
            "lastCredentialError": self._last_rejection or None,
        }
        return security

    def describe(self) -> Mapping[str, Any]:
        return {
            "adapter": "ethernet-ip",
            "endpoint": self.spec.endpoint,
            "path": self._path(),
            "connected": self.connection.connected,
            **self._info,
            "packedBoolArrays": sorted(self._packed),
            "security": self._security(),
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
        self._maintain_credentials()
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
