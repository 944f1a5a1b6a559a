"""An ONVIF test device on loopback: the Device, Media and PTZ operations the `onvif` backend
uses, over SOAP 1.2 on an in-process HTTP server, and a WS-Discovery responder over UDP.

Every request's body element is validated against the XSD embedded in the WSDL files that
onvif-zeep-async ships (lxml XMLSchema, imports resolved from the same folder) and parsed by
zeep from the same WSDL; every answer is built by zeep from the WSDL and validated again.
A request that fails validation is answered with a ter:InvalidArgVal fault and recorded in
`invalid`, so a test can assert the backend sent none. Operations other than
GetSystemDateAndTime (and GetDeviceInformation when `anonymous_info`) need a WS-Security
UsernameToken whose PasswordDigest = Base64(SHA-1(nonce + created + password)) matches,
Created within five minutes and a nonce not seen before; else a ter:NotAuthorized fault.

`mode` makes the device misbehave: "fault" (every operation answers a SOAP fault),
"bad-xml" (HTTP 200 with text that is not XML) or "silent" (reads the request, never answers
until closed).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
import re
import select
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, ClassVar

import cv2
import numpy as np
import onvif
from lxml import etree
from zeep import Client

WSDL_DIR = os.path.join(os.path.dirname(onvif.__file__), "wsdl")
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
WSU = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
TER = "http://www.onvif.org/ver10/error"
WSA = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
WSD = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
WSD_GROUP = "239.255.255.250"
WSD_PORT = 3702
USER = "onvif-user"
PASSWORD = "onvif-test-password-value"

#: path suffix -> (WSDL file, binding QName, namespace)
SERVICES = {
    "device_service": (
        "devicemgmt.wsdl",
        "{http://www.onvif.org/ver10/device/wsdl}DeviceBinding",
        "http://www.onvif.org/ver10/device/wsdl",
    ),
    "media_service": (
        "media.wsdl",
        "{http://www.onvif.org/ver10/media/wsdl}MediaBinding",
        "http://www.onvif.org/ver10/media/wsdl",
    ),
    "ptz_service": (
        "ptz.wsdl",
        "{http://www.onvif.org/ver20/ptz/wsdl}PTZBinding",
        "http://www.onvif.org/ver20/ptz/wsdl",
    ),
}
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class _Schemas:
    """The XSD of each service (loaded once per process) and zeep's bindings for it."""

    _lock = threading.Lock()
    _loaded: ClassVar[dict[str, tuple[etree.XMLSchema, Any]]] = {}

    @classmethod
    def get(cls, service: str) -> tuple[etree.XMLSchema, Any]:
        with cls._lock:
            if service not in cls._loaded:
                wsdl, binding, _ = SERVICES[service]
                path = os.path.join(WSDL_DIR, wsdl)
                schema_node = etree.parse(path).find(".//{http://www.w3.org/2001/XMLSchema}schema")
                schema = etree.XMLSchema(
                    etree.fromstring(etree.tostring(schema_node), base_url=path)
                )
                cls._loaded[service] = (schema, Client(path).wsdl.bindings[binding])
            return cls._loaded[service]


class SoapFaultError(Exception):
    """A fault to answer: SOAP code (Sender/Receiver), ONVIF subcode, reason, HTTP status."""

    def __init__(self, code: str, subcode: str, reason: str, status: int = 500) -> None:
        super().__init__(reason)
        self.code, self.subcode, self.reason, self.status = code, subcode, reason, status


def fault_envelope(fault: SoapFaultError) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><env:Envelope xmlns:env="{SOAP12}" '
        f'xmlns:ter="{TER}"><env:Body><env:Fault><env:Code><env:Value>env:{fault.code}'
        f"</env:Value><env:Subcode><env:Value>ter:{fault.subcode}</env:Value></env:Subcode>"
        f'</env:Code><env:Reason><env:Text xml:lang="en">{fault.reason}</env:Text>'
        f"</env:Reason></env:Fault></env:Body></env:Envelope>"
    ).encode()


@dataclass
class PtzState:
    """The simulated head: position, whether a continuous move runs, presets."""

    pan: float = 0.0
    tilt: float = 0.0
    zoom: float = 0.0
    moving_pan_tilt: bool = False
    moving_zoom: bool = False
    presets: dict[str, tuple[str, tuple[float, float, float]]] = field(default_factory=dict)
    issued: int = 0
    max_presets: int = 8


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops SYNs when discovery identifies 8 devices at
    # once, and the kernel's 1 s retransmit would then be measured as ours.
    request_queue_size = 128


class OnvifDevice:
    """One ONVIF device at http://127.0.0.1:`port`/onvif/..., and its discovery responder."""

    def __init__(
        self,
        *,
        username: str = USER,
        password: str = PASSWORD,
        vendor: str = "unskit-test",
        model: str = "onvif-device",
        ptz: bool = True,
        anonymous_info: bool = True,
        presets: tuple[str, ...] = ("door", "gate"),
    ) -> None:
        self.username, self.password = username, password
        self.vendor, self.model = vendor, model
        self.has_ptz = ptz
        self.anonymous_info = anonymous_info
        self.mode = "ok"
        self.endpoint = f"urn:uuid:{uuid.uuid4()}"
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.invalid: list[str] = []
        self.errors: list[str] = []
        #: SOAP requests received, answered or not.
        self.posts = 0
        self.refused = 0
        self.snapshots = 0
        self.ptz = PtzState()
        for name in presets:
            self._store_preset(name)
        self._nonces: set[str] = set()
        self._closed = threading.Event()
        device = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                device._snapshot(self)

            def do_POST(self) -> None:
                device._soap(self)

        self.http = _Server(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]
        self._http_thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self._http_thread.start()
        self.responder = DiscoveryResponders([self])

    # -- addresses ------------------------------------------------------------------------

    def url(self, service: str = "device_service", prefix: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{prefix}/onvif/{service}"

    @property
    def uri(self) -> str:
        """The device service address (a camera's connection.uri)."""
        return self.url()

    @property
    def probe_address(self) -> str:
        return f"127.0.0.1:{self.responder.ports[0]}"

    def scopes(self) -> str:
        kinds = ["type/video_encoder", f"hardware/{self.model}", f"name/{self.vendor}"]
        if self.has_ptz:
            kinds.append("type/ptz")
        return " ".join(f"onvif://www.onvif.org/{kind}" for kind in kinds)

    # -- HTTP -----------------------------------------------------------------------------

    def _snapshot(self, handler: BaseHTTPRequestHandler) -> None:
        if self.mode == "silent":
            self._closed.wait(60)
            handler.close_connection = True
            return
        expected = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        if handler.headers.get("Authorization") != f"Basic {expected}":
            handler.send_response(401)
            handler.send_header("WWW-Authenticate", 'Basic realm="onvif"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        with self.lock:
            self.snapshots += 1
            count = self.snapshots
        image = np.zeros((120, 160, 3), np.uint8)
        image[:, :, 1] = 80
        cv2.putText(image, f"#{count}", (10, 70), cv2.FONT_HERSHEY_SIMPLEX, 1.5, (255, 255, 255), 2)
        ok, data = cv2.imencode(".jpg", image)
        assert ok
        payload = data.tobytes()
        handler.send_response(200)
        handler.send_header("Content-Type", "image/jpeg")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _soap(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        data = handler.rfile.read(length)
        with self.lock:
            self.posts += 1
        if self.mode == "silent":
            self._closed.wait(60)
            handler.close_connection = True
            return
        if self.mode == "bad-xml":
            self._send(handler, 200, b"<this is not <xml at all", "application/soap+xml")
            return
        service = handler.path.rsplit("/", 1)[-1]
        prefix = handler.path[: -len(f"/onvif/{service}")]
        try:
            status, body = 200, self._answer(service, prefix, data)
        except SoapFaultError as fault:
            status, body = fault.status, fault_envelope(fault)
        except Exception as error:  # a bug of the device: a fault, and recorded for the test
            with self.lock:
                self.errors.append(f"{type(error).__name__}: {error}")
            status, body = 500, fault_envelope(SoapFaultError("Receiver", "Action", repr(error)))
        self._send(handler, status, body, "application/soap+xml; charset=utf-8")

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, kind: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _answer(self, service: str, prefix: str, data: bytes) -> bytes:
        if service not in SERVICES:
            raise SoapFaultError("Sender", "ActionNotSupported", f"no service {service}", 400)
        schema, binding = _Schemas.get(service)
        namespace = SERVICES[service][2]
        try:
            envelope = etree.fromstring(data, _PARSER)
        except etree.XMLSyntaxError as error:
            raise SoapFaultError("Sender", "WellFormed", f"not XML: {error}", 400) from None
        body = envelope.find(f"{{{SOAP12}}}Body")
        if envelope.tag != f"{{{SOAP12}}}Envelope" or body is None or len(body) != 1:
            raise SoapFaultError(
                "Sender", "InvalidArgs", "not a SOAP 1.2 envelope with one body", 400
            )
        request = body[0]
        qname = etree.QName(request)
        if qname.namespace != namespace:
            raise SoapFaultError(
                "Sender", "ActionNotSupported", f"{qname} is not of {service}", 400
            )
        operation = qname.localname
        with self.lock:
            self.calls.append(operation)
        if not schema.validate(request):
            error = str(schema.error_log.last_error)
            with self.lock:
                self.invalid.append(f"{operation}: {error}")
            raise SoapFaultError("Sender", "InvalidArgVal", f"invalid {operation}: {error}", 400)
        public = operation == "GetSystemDateAndTime" or (
            operation == "GetDeviceInformation" and self.anonymous_info
        )
        if not public:
            self._authenticate(envelope)
        if self.mode == "fault":
            raise SoapFaultError("Receiver", "Action", f"{operation} failed (simulated)")
        op = binding.get(operation)
        arguments = op.input.deserialize(envelope)
        names = [name for name, _ in op.input.body.type.elements]
        if len(names) == 1:
            # zeep hands a one-field request over as that field's value.
            arguments = SimpleNamespace(**{names[0]: arguments})
        handler: Callable[[Any, str], dict[str, Any]] | None = getattr(
            self, f"_op_{_snake(operation)}", None
        )
        if handler is None:
            raise SoapFaultError("Sender", "ActionNotSupported", f"{operation} is not implemented")
        result = handler(arguments, prefix)
        answer = op.output.serialize(**result).content
        reply = answer.find(f"{{{SOAP12}}}Body")[0]
        assert schema.validate(reply), f"the device's own {operation} answer is invalid"
        return etree.tostring(answer, xml_declaration=True, encoding="UTF-8")

    def _authenticate(self, envelope: Any) -> None:
        token = envelope.find(f"{{{SOAP12}}}Header/{{{WSSE}}}Security/{{{WSSE}}}UsernameToken")

        def refuse(reason: str) -> SoapFaultError:
            with self.lock:
                self.refused += 1
            return SoapFaultError("Sender", "NotAuthorized", f"not authorized: {reason}", 400)

        if token is None:
            raise refuse("no UsernameToken")
        user = token.findtext(f"{{{WSSE}}}Username")
        password = token.find(f"{{{WSSE}}}Password")
        nonce = token.findtext(f"{{{WSSE}}}Nonce") or ""
        created = token.findtext(f"{{{WSU}}}Created") or ""
        if password is None or not str(password.get("Type", "")).endswith("#PasswordDigest"):
            raise refuse("the password is not a digest")
        try:
            stamp = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
            raw_nonce = base64.b64decode(nonce, validate=True)
        except ValueError:
            raise refuse("malformed Created or Nonce") from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.timezone.utc)
        if abs((dt.datetime.now(dt.timezone.utc) - stamp).total_seconds()) > 300:
            raise refuse("Created is too far from the device's clock")
        expected = base64.b64encode(
            hashlib.sha1(raw_nonce + created.encode() + self.password.encode()).digest()
        ).decode()
        with self.lock:
            replay = nonce in self._nonces
            self._nonces.add(nonce)
        if user != self.username or password.text != expected:
            raise refuse("wrong user name or password")
        if replay:
            raise refuse("nonce replayed")

    # -- Device -----------------------------------------------------------------------------

    def _op_get_system_date_and_time(self, _: Any, prefix: str) -> dict[str, Any]:
        now = dt.datetime.now(dt.timezone.utc)
        return {
            "SystemDateAndTime": {
                "DateTimeType": "NTP",
                "DaylightSavings": False,
                "UTCDateTime": {
                    "Date": {"Year": now.year, "Month": now.month, "Day": now.day},
                    "Time": {"Hour": now.hour, "Minute": now.minute, "Second": now.second},
                },
            }
        }

    def _op_get_device_information(self, _: Any, prefix: str) -> dict[str, Any]:
        model = self.model + prefix.replace("/", "-")
        return {
            "Manufacturer": self.vendor,
            "Model": model,
            "FirmwareVersion": "1.0-test",
            "SerialNumber": f"SN{self.port}",
            "HardwareId": "hw-1",
        }

    def _op_get_capabilities(self, _: Any, prefix: str) -> dict[str, Any]:
        capabilities: dict[str, Any] = {
            "Media": {
                "XAddr": self.url("media_service", prefix),
                "StreamingCapabilities": {
                    "RTPMulticast": False, "RTP_TCP": True, "RTP_RTSP_TCP": True,
                },
            },
        }  # fmt: skip
        if self.has_ptz:
            capabilities["PTZ"] = {"XAddr": self.url("ptz_service", prefix)}
        return {"Capabilities": capabilities}

    # -- Media ------------------------------------------------------------------------------

    def _op_get_profiles(self, _: Any, prefix: str) -> dict[str, Any]:
        profile: dict[str, Any] = {"token": "main", "fixed": True, "Name": "main"}
        if self.has_ptz:
            profile["PTZConfiguration"] = {
                "token": "ptz0", "Name": "ptz", "UseCount": 1, "NodeToken": "node0",
            }  # fmt: skip
        return {"Profiles": [profile]}

    def _op_get_snapshot_uri(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        return {
            "MediaUri": {
                "Uri": f"http://127.0.0.1:{self.port}/snapshot.jpg",
                "InvalidAfterConnect": False,
                "InvalidAfterReboot": False,
                "Timeout": dt.timedelta(0),
            }
        }

    def _op_get_stream_uri(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        return {
            "MediaUri": {
                "Uri": f"rtsp://127.0.0.1:{self.port}/main",
                "InvalidAfterConnect": False,
                "InvalidAfterReboot": False,
                "Timeout": dt.timedelta(0),
            }
        }

    @staticmethod
    def _profile(token: str) -> None:
        if token != "main":
            raise SoapFaultError("Sender", "NoProfile", f"no profile {token}", 400)

    # -- PTZ --------------------------------------------------------------------------------

    def _store_preset(self, name: str) -> str:
        state = self.ptz
        state.issued += 1
        token = f"tok-{state.issued}"
        state.presets[token] = (name, (state.pan, state.tilt, state.zoom))
        return token

    def _op_get_status(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        state = self.ptz
        with self.lock:
            return {
                "PTZStatus": {
                    "Position": {
                        "PanTilt": {"x": state.pan, "y": state.tilt},
                        "Zoom": {"x": state.zoom},
                    },
                    "MoveStatus": {
                        "PanTilt": "MOVING" if state.moving_pan_tilt else "IDLE",
                        "Zoom": "MOVING" if state.moving_zoom else "IDLE",
                    },
                    "UtcTime": dt.datetime.now(dt.timezone.utc),
                }
            }

    def _op_continuous_move(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        velocity = arguments.Velocity
        with self.lock:
            if velocity.PanTilt is not None:
                self.ptz.moving_pan_tilt = bool(velocity.PanTilt.x or velocity.PanTilt.y)
            if velocity.Zoom is not None:
                self.ptz.moving_zoom = bool(velocity.Zoom.x)
        return {}

    def _op_absolute_move(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        self._move(arguments.Position, relative=False)
        return {}

    def _op_relative_move(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        self._move(arguments.Translation, relative=True)
        return {}

    def _move(self, vector: Any, relative: bool) -> None:
        def clamp(value: float, low: float) -> float:
            return min(max(value, low), 1.0)

        with self.lock:
            state = self.ptz
            if vector.PanTilt is not None:
                base = (state.pan, state.tilt) if relative else (0.0, 0.0)
                state.pan = clamp(base[0] + vector.PanTilt.x, -1.0)
                state.tilt = clamp(base[1] + vector.PanTilt.y, -1.0)
            if vector.Zoom is not None:
                state.zoom = clamp((state.zoom if relative else 0.0) + vector.Zoom.x, 0.0)

    def _op_stop(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        with self.lock:
            if arguments.PanTilt is not False:
                self.ptz.moving_pan_tilt = False
            if arguments.Zoom is not False:
                self.ptz.moving_zoom = False
        return {}

    def _op_get_presets(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        with self.lock:
            return {
                "Preset": [
                    {"token": token, "Name": name} for token, (name, _) in self.ptz.presets.items()
                ]
            }

    def _op_goto_preset(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        with self.lock:
            entry = self.ptz.presets.get(arguments.PresetToken)
            if entry is None:
                raise SoapFaultError("Sender", "NoToken", f"no preset {arguments.PresetToken}", 400)
            self.ptz.pan, self.ptz.tilt, self.ptz.zoom = entry[1]
        return {}

    def _op_set_preset(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        with self.lock:
            if len(self.ptz.presets) >= self.ptz.max_presets:
                raise SoapFaultError("Receiver", "TooManyPresets", "preset storage is full")
            return {"PresetToken": self._store_preset(arguments.PresetName or "")}

    def _op_remove_preset(self, arguments: Any, prefix: str) -> dict[str, Any]:
        self._profile(arguments.ProfileToken)
        with self.lock:
            if self.ptz.presets.pop(arguments.PresetToken, None) is None:
                raise SoapFaultError("Sender", "NoToken", f"no preset {arguments.PresetToken}", 400)
        return {}

    def close(self) -> None:
        self._closed.set()
        self.responder.close()
        self.http.shutdown()
        self.http.server_close()
        self._http_thread.join(5)


def probe_matches(relates_to: str, device: OnvifDevice, prefix: str = "") -> bytes:
    """A ProbeMatches answer for one device (its service under `prefix`)."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="{SOAP12}" '
        f'xmlns:a="{WSA}" xmlns:d="{WSD}" xmlns:dn="http://www.onvif.org/ver10/network/wsdl">'
        f"<s:Header><a:MessageID>urn:uuid:{uuid.uuid4()}</a:MessageID>"
        f"<a:RelatesTo>{relates_to}</a:RelatesTo>"
        f"<a:To>{WSA}/role/anonymous</a:To>"
        f"<a:Action>{WSD}/ProbeMatches</a:Action></s:Header>"
        f"<s:Body><d:ProbeMatches><d:ProbeMatch><a:EndpointReference><a:Address>"
        f"{device.endpoint}{prefix}</a:Address></a:EndpointReference>"
        f"<d:Types>dn:NetworkVideoTransmitter</d:Types><d:Scopes>{device.scopes()}</d:Scopes>"
        f"<d:XAddrs>{device.url('device_service', prefix)}</d:XAddrs>"
        f"<d:MetadataVersion>1</d:MetadataVersion></d:ProbeMatch></d:ProbeMatches>"
        f"</s:Body></s:Envelope>"
    ).encode()


class DiscoveryResponders:
    """WS-Discovery responders on loopback UDP ports, one thread for all: responder i
    answers a Probe for `devices[i % len(devices)]`, under the prefix /d{i} when `count` > 1
    (so each responder is a distinct device to the prober)."""

    def __init__(
        self,
        devices: list[OnvifDevice],
        count: int = 1,
        host: str = "127.0.0.1",
        multicast: bool = False,
    ) -> None:
        self.devices = devices
        self.count = count
        self.host = host
        self.probes = 0
        self.sockets: list[socket.socket] = []
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            for _ in range(count):
                sock = socket.socket(family, socket.SOCK_DGRAM)
                self.sockets.append(sock)
                if multicast:
                    # The WS-Discovery group on the loopback interface only: a probe sent
                    # with IP_MULTICAST_IF 127.0.0.1 reaches it and never leaves the host.
                    # Several runs may listen at once (SO_REUSEADDR); each answers with its
                    # own endpoints, which a test tells apart.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((WSD_GROUP, WSD_PORT))
                    membership = socket.inet_aton(WSD_GROUP) + socket.inet_aton(host)
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
                else:
                    sock.bind((host, 0))
        except OSError:
            for sock in self.sockets:
                sock.close()
            raise
        self.ports = [sock.getsockname()[1] for sock in self.sockets]
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def addresses(self) -> list[str]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return [f"{host}:{port}" for port in self.ports]

    def _serve(self) -> None:
        index = {sock.fileno(): i for i, sock in enumerate(self.sockets)}
        while True:
            ready, _, _ = select.select([*self.sockets, self._wake_r], [], [], 30)
            if self._wake_r in ready:
                return
            for sock in ready:
                data, sender = sock.recvfrom(65535)
                try:
                    root = etree.fromstring(data, _PARSER)
                except etree.XMLSyntaxError:
                    continue
                message_id = root.findtext(f"{{{SOAP12}}}Header/{{{WSA}}}MessageID")
                if root.find(f"{{{SOAP12}}}Body/{{{WSD}}}Probe") is None or not message_id:
                    continue
                self.probes += 1
                i = index[sock.fileno()]
                prefix = f"/d{i}" if self.count > 1 else ""
                device = self.devices[i % len(self.devices)]
                sock.sendto(probe_matches(message_id, device, prefix), sender)

    def close(self) -> None:
        self._wake_w.send(b"x")
        self._thread.join(5)
        for sock in (*self.sockets, self._wake_r, self._wake_w):
            sock.close()
