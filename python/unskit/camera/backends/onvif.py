"""The `onvif` backend: an ONVIF camera's Device, Media and PTZ services over SOAP (zeep, with
the WSDL and XSD files onvif-zeep-async ships), authenticated with a WS-Security
UsernameToken digest. Stills come from the profile's snapshot URI (GetSnapshotUri), fetched
as the snapshot-uri backend does; the PTZ head maps the normalized ranges one to one onto
ONVIF's generic spaces (which are the same ranges).

Every SOAP failure becomes a `SoapDeviceError`: no answer (refused, timed out) is
DEVICE_UNAVAILABLE, and the device is then not asked again for `retryAfterMs`, so a dead
camera costs a command at most one SOAP timeout per interval; a SOAP fault, XML that does not
parse or fit the schema, or refused credentials are BACKEND_ERROR.

This module holds `OnvifBackend` (the connection and the Backend interface); the SOAP, the
only import of zeep, is in `onvifsoap.py` and the PTZ head in `onvifptz.py`, whose names are
re-exported here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from unskit.camera.backends import Acquired, PtzHead, redacted_uri
from unskit.camera.backends.onvifptz import OnvifPtzHead
from unskit.camera.backends.onvifsoap import (
    _T,
    DEVICE_BINDING,
    MEDIA_BINDING,
    PTZ_BINDING,
    Client,
    _client,
    _ClockedToken,
    _text,
    device_information,
    soap_call,
    wsdl_document,
)
from unskit.camera.backends.snapshot import SnapshotBackend
from unskit.commands.codes import ErrorCode
from unskit.config.secrets import SecretRef, SecretResolver, resolve_value
from unskit.errors import SecretError, SoapDeviceError

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

DEFAULT_SOAP_TIMEOUT_MS = 5000
DEFAULT_RETRY_AFTER_MS = 10_000


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
