"""sb/discover: one bounded, credential-free WS-Discovery pass for ONVIF cameras.

A pass sends one Probe (Types dn:NetworkVideoTransmitter) over UDP to the multicast group
239.255.255.250:3702 and/or to the configured unicast addresses, collects the ProbeMatches
that relate to it until `timeoutMs` (or, with unicast only, until every address answered),
then asks each match's device service for GetDeviceInformation without credentials in the
time left. The candidates are kept as the last pass: sb/discover pages through it with a
cursor, and sb/list reports its unconfigured cameras, neither probing again.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from unskit.camera.jobs import now_ms, rfc3339
from unskit.commands.codes import ErrorCode
from unskit.errors import CommandError

__all__ = [
    "DISCOVERY_BACKENDS",
    "MULTICAST_GROUP",
    "Candidate",
    "Discovery",
    "DiscoveryPass",
    "parse_address",
    "probe_message",
]

_log = logging.getLogger(__name__)

#: The backends of this build that can discover cameras.
DISCOVERY_BACKENDS = ("onvif",)
MULTICAST_GROUP = ("239.255.255.250", 3702)
WSD_PORT = 3702
#: At most this many candidates are kept from one pass (the spec's largest page).
MAX_CANDIDATES = 1000
# GetDeviceInformation requests in flight at once during a pass.
INFO_WORKERS = 8
#: The share of a pass spent listening for matches (the rest is for identifying them).
LISTEN_SHARE = 0.75
_DATAGRAM = 65_535

_SOAP = "http://www.w3.org/2003/05/soap-envelope"
_WSA = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
_WSD = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
_NS = {"s": _SOAP, "a": _WSA, "d": _WSD}
_PROBE_ACTION = f"{_WSD}/Probe"
_MATCHES_ACTION = f"{_WSD}/ProbeMatches"


def probe_message(message_id: str) -> bytes:
    """A WS-Discovery Probe for ONVIF video transmitters."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>'
        f'<s:Envelope xmlns:s="{_SOAP}" xmlns:a="{_WSA}" xmlns:d="{_WSD}" '
        f'xmlns:dn="http://www.onvif.org/ver10/network/wsdl">'
        f'<s:Header><a:Action s:mustUnderstand="1">{_PROBE_ACTION}</a:Action>'
        f"<a:MessageID>{message_id}</a:MessageID>"
        f"<a:ReplyTo><a:Address>{_WSA}/role/anonymous</a:Address></a:ReplyTo>"
        f'<a:To s:mustUnderstand="1">urn:schemas-xmlsoap-org:ws:2005:04:discovery</a:To>'
        f"</s:Header><s:Body><d:Probe><d:Types>dn:NetworkVideoTransmitter</d:Types>"
        f"</d:Probe></s:Body></s:Envelope>"
    ).encode()


def parse_address(text: str) -> tuple[str, int]:
    """(host, port) of `host`, `host:port` or `[v6]:port` (port 3702 when absent)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else WSD_PORT
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, int(port)
    return text, WSD_PORT


@dataclass
class Candidate:
    """One discovered device: its selector (device service URI and endpoint) and identity."""

    endpoint: str
    xaddrs: list[str]
    scopes: list[str]
    vendor: str | None = None
    model: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def uri(self) -> str | None:
        """The device service address a camera's connection.uri takes (http first)."""
        for address in self.xaddrs:
            if address.startswith("http://"):
                return address
        return self.xaddrs[0] if self.xaddrs else None

    def _scope(self, kind: str) -> str | None:
        prefix = f"onvif://www.onvif.org/{kind}/"
        for scope in self.scopes:
            if scope.startswith(prefix) and len(scope) > len(prefix):
                from urllib.parse import unquote

                return unquote(scope[len(prefix) :])
        return None

    def body(self) -> dict[str, Any]:
        """The candidate as sb/discover and sb/list report it."""
        ptz = any(scope.rstrip("/").endswith("/type/ptz") for scope in self.scopes)
        vendor = self.vendor or self._scope("manufacturer") or self._scope("name")
        model = self.model or self._scope("hardware")
        return {
            "backend": "onvif",
            "selector": {"uri": self.uri, "endpoint": self.endpoint},
            "vendor": vendor,
            "model": model,
            "capabilities": {
                "captureModes": ["snapshot-uri"],
                "ptz": ptz,
                "presets": ptz,
                "presetMutation": ptz,
                "vendor": vendor,
                "model": model,
                "warnings": list(self.warnings),
            },
        }


@dataclass(frozen=True)
class _Identity:
    """What a credential-free GetDeviceInformation told (or why it told nothing)."""

    vendor: str | None = None
    model: str | None = None
    warning: str | None = None


@dataclass(frozen=True)
class DiscoveryPass:
    """A completed pass: its candidates and when it completed."""

    candidates: tuple[dict[str, Any], ...]
    completed_ms: int

    @property
    def completed_at(self) -> str:
        """completedAt (RFC 3339)."""
        return rfc3339(self.completed_ms)


def _parse_matches(data: bytes, message_id: str) -> list[Candidate]:
    from lxml import etree

    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, huge_tree=False, load_dtd=False
    )
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError:
        return []
    if root.findtext("s:Header/a:RelatesTo", namespaces=_NS) != message_id:
        return []
    if (root.findtext("s:Header/a:Action", namespaces=_NS) or "").strip() != _MATCHES_ACTION:
        return []
    found = []
    for match in root.iterfind("s:Body/d:ProbeMatches/d:ProbeMatch", namespaces=_NS):
        endpoint = (match.findtext("a:EndpointReference/a:Address", namespaces=_NS) or "").strip()
        xaddrs = (match.findtext("d:XAddrs", namespaces=_NS) or "").split()
        scopes = (match.findtext("d:Scopes", namespaces=_NS) or "").split()
        if endpoint and xaddrs:
            found.append(Candidate(endpoint[:1024], xaddrs[:8], scopes[:64]))
    return found


class Discovery:
    """Runs passes (one at a time) and keeps the last one."""

    def __init__(
        self, *, multicast: bool, addresses: Sequence[str], interface: str | None = None
    ) -> None:
        self.multicast = multicast
        self.targets = [parse_address(text) for text in addresses]
        self.interface = interface
        self._running = threading.Lock()
        self._stopping = threading.Event()
        self._last: DiscoveryPass | None = None

    @property
    def last(self) -> DiscoveryPass | None:
        """The last completed pass, if any."""
        return self._last

    def run(self, timeout_ms: int, backends: Iterable[str]) -> DiscoveryPass:
        """One pass bounded by `timeout_ms`; RESOURCE_LIMIT while another pass runs."""
        self._claim()
        return self._run_claimed(timeout_ms, backends)

    def submit(self, timeout_ms: int, backends: Iterable[str]) -> Future[DiscoveryPass]:
        """A pass on its own thread (the command inbox goes on serving meanwhile)."""
        self._claim()
        future: Future[DiscoveryPass] = Future()
        chosen = tuple(backends)

        def work() -> None:
            try:
                future.set_result(self._run_claimed(timeout_ms, chosen))
            except BaseException as error:
                future.set_exception(error)

        threading.Thread(target=work, name="camera-discover", daemon=True).start()
        return future

    def _claim(self) -> None:
        if not self._running.acquire(blocking=False):
            raise CommandError(
                ErrorCode.RESOURCE_LIMIT,
                "a discovery pass is already running; ask again when it has completed",
            )

    def _run_claimed(self, timeout_ms: int, backends: Iterable[str]) -> DiscoveryPass:
        try:
            deadline = time.monotonic() + timeout_ms / 1000
            candidates: list[Candidate] = []
            if "onvif" in set(backends) and (self.multicast or self.targets):
                try:
                    candidates = self._probe(deadline)
                except OSError as error:
                    raise CommandError(
                        ErrorCode.BACKEND_ERROR, f"discovery cannot open its UDP socket: {error}"
                    ) from None
            done = DiscoveryPass(tuple(c.body() for c in candidates), now_ms())
            self._last = done
            return done
        finally:
            self._running.release()

    def _sockets(self) -> dict[int, socket.socket]:
        families = {socket.AF_INET6 if ":" in host else socket.AF_INET for host, _ in self.targets}
        if self.multicast:
            families.add(socket.AF_INET)
        opened: dict[int, socket.socket] = {}
        try:
            for family in families:
                sock = socket.socket(family, socket.SOCK_DGRAM)
                opened[family] = sock
                sock.setblocking(False)
                if family == socket.AF_INET and self.multicast:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
                    if self.interface:
                        sock.setsockopt(
                            socket.IPPROTO_IP,
                            socket.IP_MULTICAST_IF,
                            socket.inet_aton(self.interface),
                        )
        except OSError:
            for sock in opened.values():
                sock.close()
            raise
        return opened

    def _probe(self, deadline: float) -> list[Candidate]:
        # Matches are identified as they arrive, on a small pool; listening stops at three
        # quarters of the pass (or once every unicast address answered) so that the last
        # matches still have time for GetDeviceInformation before the deadline.
        started = time.monotonic()
        listen_until = started + (deadline - started) * LISTEN_SHARE
        message_id = f"urn:uuid:{uuid.uuid4()}"
        probe = probe_message(message_id)
        found: dict[str, Candidate] = {}
        asked: list[tuple[Candidate, Future[_Identity]]] = []
        answered: set[tuple[str, int]] = set()
        pool = ThreadPoolExecutor(INFO_WORKERS, thread_name_prefix="discover")
        sockets = self._sockets()
        try:
            with selectors.DefaultSelector() as selector:
                for family, sock in sockets.items():
                    selector.register(sock, selectors.EVENT_READ, sock)
                    if family == socket.AF_INET and self.multicast:
                        self._send(sock, probe, MULTICAST_GROUP)
                for host, port in self.targets:
                    family = socket.AF_INET6 if ":" in host else socket.AF_INET
                    self._send(sockets[family], probe, (host, port))
                pending = set(self.targets)
                while len(found) < MAX_CANDIDATES and not self._stopping.is_set():
                    if not self.multicast and pending and pending <= answered:
                        break  # every unicast address has answered: nothing more to wait for
                    remaining = listen_until - time.monotonic()
                    if remaining <= 0:
                        break
                    for key, _ in selector.select(min(remaining, 0.5)):
                        receiver: socket.socket = key.data
                        try:
                            data, sender = receiver.recvfrom(_DATAGRAM)
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError as error:
                            # An ICMP unreachable from one address: the others still answer.
                            _log.debug("discovery: receive failed: %s", error)
                            continue
                        matches = _parse_matches(data, message_id)
                        if matches:
                            # Only a match to this probe counts as the address's answer.
                            answered.add((str(sender[0]), int(sender[1])))
                        for candidate in matches:
                            if len(found) < MAX_CANDIDATES and candidate.endpoint not in found:
                                found[candidate.endpoint] = candidate
                                asked.append(
                                    (candidate, pool.submit(self._identify, candidate, deadline))
                                )
            for candidate, future in asked:
                try:
                    identity = future.result(timeout=max(deadline - time.monotonic(), 0.0))
                except FutureTimeout:
                    identity = _Identity(warning="not identified: the pass ran out of time")
                candidate.vendor, candidate.model = identity.vendor, identity.model
                if identity.warning:
                    candidate.warnings.append(identity.warning)
        finally:
            for sock in sockets.values():
                sock.close()
            pool.shutdown(wait=False, cancel_futures=True)
        return list(found.values())

    @staticmethod
    def _send(sock: socket.socket, probe: bytes, target: tuple[str, int]) -> None:
        try:
            sock.sendto(probe, target)
        except OSError as error:
            _log.warning("discovery: cannot probe %s:%d: %s", target[0], target[1], error)

    def _identify(self, candidate: Candidate, deadline: float) -> _Identity:
        from unskit.camera.backends.onvif import device_information
        from unskit.errors import SoapDeviceError

        remaining = deadline - time.monotonic()
        uri = candidate.uri
        if remaining <= 0.05 or uri is None or self._stopping.is_set():
            return _Identity(warning="not identified: the pass ran out of time")
        try:
            info = device_information(uri, remaining)
        except SoapDeviceError as failure:
            return _Identity(warning=f"GetDeviceInformation: {failure.message}")
        return _Identity(info.get("vendor") or None, info.get("model") or None)

    def unconfigured(self, configured: Iterable[str]) -> list[dict[str, Any]]:
        """The last pass's candidates whose device service no configured camera uses."""
        done = self._last
        if done is None:
            return []
        known = {uri.rstrip("/") for uri in configured}
        return [
            candidate
            for candidate in done.candidates
            if (candidate["selector"]["uri"] or "").rstrip("/") not in known
        ]

    def close(self) -> None:
        """Ends a running pass early (at its next receive)."""
        self._stopping.set()
