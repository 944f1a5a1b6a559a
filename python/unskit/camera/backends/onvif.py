"""The `onvif` backend: an ONVIF camera's Device, Media and PTZ services over SOAP (zeep, with
the WSDL and XSD files onvif-zeep-async ships), authenticated with a WS-Security
UsernameToken digest. Stills come from the profile's snapshot URI (GetSnapshotUri), fetched
as the snapshot-uri backend does; the PTZ head maps the normalized ranges one to one onto
ONVIF's generic spaces (which are the same ranges).

Every SOAP failure becomes a `SoapDeviceError`: no answer (refused, timed out) is
DEVICE_UNAVAILABLE, and the device is then not asked again for `retryAfterMs`, so a dead
camera costs a command at most one SOAP timeout per interval; a SOAP fault, XML that does not
parse or fit the schema, or refused credentials are BACKEND_ERROR.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import onvif
import requests
from lxml.etree import XMLSyntaxError
from zeep import Client, Settings
from zeep.exceptions import Error as ZeepError
from zeep.exceptions import Fault, TransportError
from zeep.transports import Transport
from zeep.wsdl import Document
from zeep.wsse.username import UsernameToken

from unskit.camera.backends import AXES, Acquired, Preset, PtzHead, PtzStatus, redacted_uri
from unskit.camera.backends.snapshot import SnapshotBackend
from unskit.commands.codes import ErrorCode
from unskit.config.secrets import SecretRef, SecretResolver, resolve_value
from unskit.errors import CommandError, SecretError, SoapDeviceError

__all__ = [
    "DEVICE_BINDING",
    "MEDIA_BINDING",
    "PTZ_BINDING",
    "OnvifBackend",
    "OnvifPtzHead",
    "device_information",
    "soap_call",
    "wsdl_document",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

WSDL_DIR = os.path.join(os.path.dirname(onvif.__file__), "wsdl")
DEVICE_BINDING = "{http://www.onvif.org/ver10/device/wsdl}DeviceBinding"
MEDIA_BINDING = "{http://www.onvif.org/ver10/media/wsdl}MediaBinding"
PTZ_BINDING = "{http://www.onvif.org/ver20/ptz/wsdl}PTZBinding"
_WSDL_FILES = {
    DEVICE_BINDING: "devicemgmt.wsdl",
    MEDIA_BINDING: "media.wsdl",
    PTZ_BINDING: "ptz.wsdl",
}

DEFAULT_SOAP_TIMEOUT_MS = 5000
DEFAULT_RETRY_AFTER_MS = 10_000
# zeep parses a device's answer with these: no DTD, entities or network lookups.
SETTINGS = Settings(
    strict=False, xml_huge_tree=False, forbid_dtd=True, forbid_entities=True, forbid_external=True
)

_documents: dict[str, Document] = {}
_documents_lock = threading.Lock()


def wsdl_document(binding: str) -> Document:
    """The parsed WSDL of a binding, loaded once per process (the ONVIF schema takes ~1 s)."""
    with _documents_lock:
        document = _documents.get(binding)
        if document is None:
            path = os.path.join(WSDL_DIR, _WSDL_FILES[binding])
            # zeep annotates the transport as a class, but takes an instance.
            document = Document(path, Transport(), settings=SETTINGS)  # type: ignore[arg-type]
            _documents[binding] = document
        return document


def _fault_subcodes(fault: Fault) -> list[str]:
    return [getattr(code, "localname", str(code)) for code in (fault.subcodes or [])]


def soap_call(where: str, what: str, call: Callable[[], _T]) -> _T:
    """Runs one SOAP operation, every failure as a SoapDeviceError naming `where` and `what`."""
    try:
        return call()
    except Fault as fault:
        subcodes = _fault_subcodes(fault)
        detail = f"{fault.message or 'no reason given'}" + (
            f" ({', '.join(subcodes)})" if subcodes else ""
        )
        if "NotAuthorized" in subcodes:
            raise SoapDeviceError(
                ErrorCode.BACKEND_ERROR,
                f"{where} refused the credentials for {what}: {detail}",
                retriable=False,
            ) from None
        if "NoToken" in subcodes or "NoEntity" in subcodes:
            raise SoapDeviceError(
                ErrorCode.BAD_ARGS, f"{where} knows no such token for {what}: {detail}"
            ) from None
        if "TooManyPresets" in subcodes:
            raise SoapDeviceError(
                ErrorCode.RESOURCE_LIMIT, f"{where} holds no more presets: {detail}"
            ) from None
        raise SoapDeviceError(
            ErrorCode.BACKEND_ERROR, f"{where} answered {what} with a SOAP fault: {detail}"
        ) from None
    except TransportError as error:
        if error.status_code in (401, 403):
            raise SoapDeviceError(
                ErrorCode.BACKEND_ERROR,
                f"{where} refused the credentials for {what} (HTTP {error.status_code})",
                retriable=False,
            ) from None
        reason = str(error.message).split("\n", 1)[0][:300]
        raise SoapDeviceError(
            ErrorCode.BACKEND_ERROR, f"{where} answered {what} with no SOAP reply: {reason}"
        ) from None
    except requests.Timeout:
        raise SoapDeviceError(
            ErrorCode.DEVICE_UNAVAILABLE, f"{where} did not answer {what} in time"
        ) from None
    except requests.RequestException as error:
        raise SoapDeviceError(
            ErrorCode.DEVICE_UNAVAILABLE,
            f"{where} cannot be reached for {what}: {type(error).__name__}",
        ) from None
    except (XMLSyntaxError, ZeepError, ValueError, TypeError, AttributeError) as error:
        # zeep raises these for answers that do not parse or do not fit the schema.
        message = str(error).split("\n", 1)[0][:300]
        raise SoapDeviceError(
            ErrorCode.BACKEND_ERROR, f"{where} answered {what} with malformed XML: {message}"
        ) from None


def _client(binding: str, timeout_s: float, wsse: Any = None) -> Client:
    session = requests.Session()
    # Loopback and LAN devices: a proxy from the environment would only get in the way.
    session.trust_env = False
    transport = Transport(session=session, timeout=timeout_s, operation_timeout=timeout_s)
    return Client(wsdl_document(binding), wsse=wsse, transport=transport, settings=SETTINGS)


def device_information(uri: str, timeout_s: float) -> dict[str, Any]:
    """A credential-free GetDeviceInformation (discovery); raises SoapDeviceError."""
    client = _client(DEVICE_BINDING, timeout_s)
    try:
        service = client.create_service(DEVICE_BINDING, uri)
        info = soap_call(redacted_uri(uri), "GetDeviceInformation", service.GetDeviceInformation)
        return {
            "vendor": info.Manufacturer,
            "model": info.Model,
            "firmware": info.FirmwareVersion,
        }
    finally:
        client.transport.session.close()


class _ClockedToken(UsernameToken):
    """A digest UsernameToken whose Created follows the device's clock (a camera refuses a
    token stamped too far from its own time)."""

    def __init__(self, username: str, password: str) -> None:
        super().__init__(username, password, use_digest=True)
        self.offset = dt.timedelta()

    def apply(self, envelope: Any, headers: Any) -> Any:
        now = dt.datetime.now(dt.timezone.utc) + self.offset
        self.created = now.replace(tzinfo=None)
        self.zulu_timestamp = True
        return super().apply(envelope, headers)


@dataclasses.dataclass
class _Link:
    """What a connection learnt: the services, the profile and the device's identity."""

    device: Any
    media: Any
    ptz: Any | None
    profile: str
    snapshot: SnapshotBackend
    vendor: str | None
    model: str | None
    firmware: str | None
    serial: str | None
    stream_uri: str | None
    warnings: list[str]
    clients: list[Client]


_IDENTITY = ("Manufacturer", "Model", "FirmwareVersion", "SerialNumber")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class OnvifBackend:
    """An ONVIF camera at `connection.uri` (its device service); credentials resolve on the
    first connection, which starts in the background at construction."""

    name = "onvif"
    capture_mode = "snapshot-uri"

    def __init__(self, connection: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.uri = str(connection["uri"])
        self.where = redacted_uri(self.uri)
        self._username = connection.get("username")
        self._password = connection.get("password")
        self._profile = connection.get("profileToken")
        self._vendor = connection.get("vendor")
        self._model = connection.get("model")
        self.timeout_s = int(connection.get("soapTimeoutMs", DEFAULT_SOAP_TIMEOUT_MS)) / 1000
        self.retry_after_s = int(connection.get("retryAfterMs", DEFAULT_RETRY_AFTER_MS)) / 1000
        self._secrets = secrets
        # One SOAP exchange at a time per camera: the head, grabs and the connection share it.
        self._lock = threading.Lock()
        self._link: _Link | None = None
        self._down: tuple[float, str] | None = None
        self._last_error: str | None = None
        self._closed = threading.Event()
        self.head = OnvifPtzHead(self)
        # The head, until a connection finds that the device or profile has no PTZ.
        self.ptz: PtzHead | None = self.head
        self._connector = threading.Thread(
            target=self._connect_quietly, name=f"onvif-connect-{self.where}", daemon=True
        )
        self._connector.start()

    # -- connection ---------------------------------------------------------------------

    def _credential(self, value: Any) -> str | None:
        ref = SecretRef.parse(value)
        secret = resolve_value(ref if ref is not None else value, self._secrets)
        return None if secret is None else secret.reveal()

    def _connect_quietly(self) -> None:
        try:
            self.call("connect", lambda link: None)
        except SoapDeviceError as failure:
            _log.warning("ONVIF camera %s: %s", self.where, failure.message)

    def call(self, what: str, action: Callable[[_Link], _T]) -> _T:
        """Runs `action` over a live link (connecting first), serialized per camera."""
        with self._lock:
            if self._closed.is_set():
                raise SoapDeviceError(ErrorCode.DEVICE_UNAVAILABLE, f"{self.where} is closed")
            if self._down is not None and time.monotonic() < self._down[0]:
                raise SoapDeviceError(
                    ErrorCode.DEVICE_UNAVAILABLE,
                    f"{self._down[1]}; not asked again before {self.retry_after_s:g} s passed "
                    "(connection.retryAfterMs; sb/reconnect asks at once)",
                )
            try:
                if self._link is None:
                    self._link = self._connect()
                    self.ptz = self.head if self._link.ptz is not None else None
                result = action(self._link)
            except SoapDeviceError as failure:
                self._last_error = failure.message
                if failure.code == ErrorCode.DEVICE_UNAVAILABLE:
                    self._down = (time.monotonic() + self.retry_after_s, failure.message)
                    self._drop()
                raise
            self._down = None
            self._last_error = None
            return result

    def _connect(self) -> _Link:
        try:
            username = self._credential(self._username)
            password = self._credential(self._password)
        except SecretError as error:
            raise SoapDeviceError(
                ErrorCode.BACKEND_ERROR,
                f"the credentials of {self.where} cannot be resolved: {error}",
                retriable=False,
            ) from None
        token = _ClockedToken(username, password or "") if username is not None else None
        where = self.where
        clients: list[Client] = []

        def service(binding: str, address: str) -> Any:
            client = _client(binding, self.timeout_s, token)
            clients.append(client)
            return client.create_service(binding, address)

        try:
            device = service(DEVICE_BINDING, self.uri)
            clock = soap_call(where, "GetSystemDateAndTime", device.GetSystemDateAndTime)
            if token is not None:
                token.offset = _clock_offset(clock)
            info = soap_call(where, "GetDeviceInformation", device.GetDeviceInformation)
            capabilities = soap_call(
                where, "GetCapabilities", lambda: device.GetCapabilities(Category="All")
            )
            media_addr = _xaddr(capabilities, "Media")
            if media_addr is None:
                raise SoapDeviceError(
                    ErrorCode.BACKEND_ERROR, f"{where} offers no Media service", retriable=False
                )
            media = service(MEDIA_BINDING, media_addr)
            profiles = soap_call(where, "GetProfiles", media.GetProfiles) or []
            profile = self._pick_profile(profiles)
            snapshot = soap_call(
                where, "GetSnapshotUri", lambda: media.GetSnapshotUri(ProfileToken=profile.token)
            )
            warnings: list[str] = []
            stream_uri = None
            try:
                stream = soap_call(
                    where,
                    "GetStreamUri",
                    lambda: media.GetStreamUri(
                        StreamSetup={"Stream": "RTP-Unicast", "Transport": {"Protocol": "RTSP"}},
                        ProfileToken=profile.token,
                    ),
                )
                stream_uri = redacted_uri(str(stream.Uri))
            except SoapDeviceError as failure:
                if failure.code == ErrorCode.DEVICE_UNAVAILABLE:
                    raise
                warnings.append(f"no stream URI: {failure.message}")
            ptz = None
            ptz_addr = _xaddr(capabilities, "PTZ")
            if ptz_addr is not None and getattr(profile, "PTZConfiguration", None) is not None:
                ptz = service(PTZ_BINDING, ptz_addr)
            snapshot_uri = str(snapshot.Uri)
            identity = [_text(getattr(info, key)) for key in _IDENTITY]
        except (AttributeError, TypeError, ValueError) as error:
            for client in clients:
                client.transport.session.close()
            raise SoapDeviceError(
                ErrorCode.BACKEND_ERROR, f"{where} answered without a field it must send: {error}"
            ) from None
        except BaseException:
            for client in clients:
                client.transport.session.close()
            raise
        vendor, model, firmware, serial = identity
        return _Link(
            device=device,
            media=media,
            ptz=ptz,
            profile=str(profile.token),
            snapshot=SnapshotBackend(
                {"uri": snapshot_uri, "username": self._username, "password": self._password},
                self._secrets,
            ),
            vendor=vendor,
            model=model,
            firmware=firmware,
            serial=serial,
            stream_uri=stream_uri,
            warnings=warnings,
            clients=clients,
        )

    def _pick_profile(self, profiles: list[Any]) -> Any:
        if not profiles:
            raise SoapDeviceError(
                ErrorCode.BACKEND_ERROR, f"{self.where} has no media profile", retriable=False
            )
        if self._profile is None:
            return profiles[0]
        for profile in profiles:
            if profile.token == self._profile:
                return profile
        raise SoapDeviceError(
            ErrorCode.BACKEND_ERROR,
            f"{self.where} has no media profile {self._profile!r} (connection.profileToken); "
            f"it has {', '.join(repr(p.token) for p in profiles)}",
            retriable=False,
        )

    def _drop(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.snapshot.close()
            for client in link.clients:
                client.transport.session.close()

    # -- the Backend interface ----------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        """What the last connection learnt (never asks the device: sb/list must not wait)."""
        link = self._link
        warnings = [] if link is None else list(link.warnings)
        if link is None:
            warnings.append(
                f"not connected: {self._last_error}" if self._last_error else "not connected yet"
            )
        has_ptz = link is None or link.ptz is not None
        capabilities: dict[str, Any] = {
            "captureModes": ["snapshot-uri"],
            "ptz": has_ptz,
            "presets": has_ptz,
            "presetMutation": has_ptz,
            "vendor": link.vendor if link is not None else self._vendor,
            "model": link.model if link is not None else self._model,
            "warnings": warnings,
        }
        if link is not None:
            capabilities["firmware"] = link.firmware
            capabilities["serial"] = link.serial
            capabilities["profileToken"] = link.profile
            capabilities["streamUri"] = link.stream_uri
        return capabilities

    def grab(self, deadline: float, abandon: threading.Event) -> Acquired:
        """The profile's snapshot (GetSnapshotUri once per connection, then one GET)."""
        try:
            link = self.call("GetSnapshotUri", lambda link: link)
        except SoapDeviceError as failure:
            raise failure.to_capture_error() from None
        acquired = link.snapshot.grab(deadline, abandon)
        metadata = {**acquired.backend_metadata, "onvifProfile": link.profile}
        return dataclasses.replace(acquired, backend_metadata=metadata)

    def reconnect(self) -> None:
        """Forgets the link and the no-answer pause; the next call connects again."""
        with self._lock:
            self._drop()
            self._down = None
            self.ptz = self.head

    def close(self) -> None:
        """Closes the link's HTTP sessions."""
        self._closed.set()
        with self._lock:
            self._drop()
        self._connector.join(timeout=self.timeout_s * 8)


def _xaddr(capabilities: Any, service: str) -> str | None:
    entry = getattr(capabilities, service, None)
    address = getattr(entry, "XAddr", None)
    return None if address is None else str(address)


def _clock_offset(clock: Any) -> dt.timedelta:
    # GetSystemDateAndTime is credential-free by the ONVIF core specification.
    utc = getattr(clock, "UTCDateTime", None)
    if utc is None:
        return dt.timedelta()
    try:
        device = dt.datetime(
            utc.Date.Year, utc.Date.Month, utc.Date.Day,
            utc.Time.Hour, utc.Time.Minute, utc.Time.Second, tzinfo=dt.timezone.utc,
        )  # fmt: skip
    except (AttributeError, TypeError, ValueError):
        return dt.timedelta()
    return device - dt.datetime.now(dt.timezone.utc)


def _vector(values: Mapping[str, float], fill: Mapping[str, float]) -> dict[str, Any]:
    """An ONVIF PTZVector or PTZSpeed from normalized axes: PanTilt carries pan and tilt
    together, so a missing one of the pair comes from `fill`."""
    vector: dict[str, Any] = {}
    if "pan" in values or "tilt" in values:
        vector["PanTilt"] = {
            "x": values.get("pan", fill.get("pan", 0.0)),
            "y": values.get("tilt", fill.get("tilt", 0.0)),
        }
    if "zoom" in values:
        vector["Zoom"] = {"x": values["zoom"]}
    return vector


class OnvifPtzHead:
    """The PTZ service of the camera's media profile, as a backend-neutral head."""

    def __init__(self, backend: OnvifBackend) -> None:
        self._backend = backend
        self._known = threading.Lock()
        # Axes this adapter set moving continuously, and the last GetStatus's motion (reset
        # by every command): what known_moving answers without asking the camera.
        self._continuous: set[str] = set()
        self._observed: bool | None = None

    def known_moving(self) -> bool:
        """Whether the head moves, from the commands sent and the last status observed."""
        with self._known:
            return bool(self._continuous) or bool(self._observed)

    def _commanded(self, continuous: set[str] | None = None, stopped: tuple[str, ...] = ()) -> None:
        with self._known:
            self._observed = None
            if continuous is None:
                self._continuous.difference_update(stopped or AXES)
            else:
                self._continuous.difference_update(stopped)
                self._continuous |= continuous

    def _ptz(self, what: str, action: Callable[[Any, str], _T]) -> _T:
        def run(link: _Link) -> _T:
            if link.ptz is None:
                raise SoapDeviceError(
                    ErrorCode.UNSUPPORTED_CAPABILITY,
                    f"{self._backend.where} has no PTZ service for profile {link.profile!r}",
                    retriable=False,
                )
            return soap_call(self._backend.where, what, lambda: action(link.ptz, link.profile))

        return self._backend.call(what, run)

    def _position(self, service: Any, profile: str) -> dict[str, float]:
        return self._position_of(service.GetStatus(ProfileToken=profile)) or {}

    def status(self) -> PtzStatus:
        """GetStatus; a device that does not answer is reported unavailable, not raised."""

        def ask(service: Any, profile: str) -> PtzStatus:
            status = service.GetStatus(ProfileToken=profile)
            position = self._position_of(status)
            move = getattr(status, "MoveStatus", None)
            states = [
                str(state)
                for state in (getattr(move, "PanTilt", None), getattr(move, "Zoom", None))
                if state is not None
            ]
            known = [state for state in states if state != "UNKNOWN"]
            moving = None if not known else any(state == "MOVING" for state in known)
            with self._known:
                self._observed = moving
                if moving is False:
                    self._continuous.clear()
            return PtzStatus(position, moving)

        try:
            return self._ptz("GetStatus", ask)
        except CommandError as error:
            _log.debug("ONVIF camera %s: no PTZ status: %s", self._backend.where, error)
            return PtzStatus(None, None, available=False)

    @staticmethod
    def _position_of(status: Any) -> dict[str, float] | None:
        position = getattr(status, "Position", None)
        if position is None:
            return None
        found: dict[str, float] = {}
        pan_tilt = getattr(position, "PanTilt", None)
        if pan_tilt is not None:
            found["pan"], found["tilt"] = float(pan_tilt.x), float(pan_tilt.y)
        zoom = getattr(position, "Zoom", None)
        if zoom is not None:
            found["zoom"] = float(zoom.x)
        return found or None

    def continuous(self, velocity: Mapping[str, float]) -> None:
        """ContinuousMove without a device timeout (the adapter arms the stop)."""
        self._ptz(
            "ContinuousMove",
            lambda service, profile: service.ContinuousMove(
                ProfileToken=profile, Velocity=_vector(velocity, {})
            ),
        )
        self._commanded(
            continuous={axis for axis, value in velocity.items() if value},
            stopped=tuple(axis for axis, value in velocity.items() if not value),
        )

    def absolute(self, position: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """AbsoluteMove; a lone pan or tilt keeps the other where it is."""

        def move(service: Any, profile: str) -> Any:
            fill = (
                self._position(service, profile)
                if len(position.keys() & {"pan", "tilt"}) == 1
                else {}
            )
            arguments: dict[str, Any] = {
                "ProfileToken": profile,
                "Position": _vector(position, fill),
            }
            if speed:
                arguments["Speed"] = _vector(speed, {"pan": 1.0, "tilt": 1.0})
            return service.AbsoluteMove(**arguments)

        self._ptz("AbsoluteMove", move)
        self._commanded(stopped=tuple(position))

    def relative(self, translation: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """RelativeMove; a missing axis of a pair moves by 0."""

        def move(service: Any, profile: str) -> Any:
            arguments: dict[str, Any] = {
                "ProfileToken": profile,
                "Translation": _vector(translation, {}),
            }
            if speed:
                arguments["Speed"] = _vector(speed, {"pan": 1.0, "tilt": 1.0})
            return service.RelativeMove(**arguments)

        self._ptz("RelativeMove", move)
        self._commanded(stopped=tuple(translation))

    def stop(self, axes: tuple[str, ...]) -> None:
        """Stop: pan or tilt stops the PanTilt pair (ONVIF stops them together)."""
        pan_tilt = "pan" in axes or "tilt" in axes
        self._ptz(
            "Stop",
            lambda service, profile: service.Stop(
                ProfileToken=profile, PanTilt=pan_tilt, Zoom="zoom" in axes
            ),
        )
        self._commanded(stopped=("pan", "tilt", *axes) if pan_tilt else axes)

    def presets(self) -> list[Preset]:
        """GetPresets, in the device's order."""

        def ask(service: Any, profile: str) -> list[Preset]:
            found = service.GetPresets(ProfileToken=profile) or []
            return [Preset(str(p.token), _text(getattr(p, "Name", None))) for p in found]

        return self._ptz("GetPresets", ask)

    def goto_preset(self, token: str) -> None:
        """GotoPreset."""
        self._ptz(
            "GotoPreset",
            lambda service, profile: service.GotoPreset(ProfileToken=profile, PresetToken=token),
        )
        self._commanded(stopped=AXES)

    def set_preset(self, name: str) -> str:
        """SetPreset of a new preset; the device issues the token."""
        return self._ptz(
            "SetPreset",
            lambda service, profile: str(service.SetPreset(ProfileToken=profile, PresetName=name)),
        )

    def remove_preset(self, token: str) -> None:
        """RemovePreset."""
        self._ptz(
            "RemovePreset",
            lambda service, profile: service.RemovePreset(ProfileToken=profile, PresetToken=token),
        )
