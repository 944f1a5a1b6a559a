"""The `onvif` backend's SOAP, the only module that imports zeep and onvif-zeep-async (for the
WSDL and XSD files it ships): the three bindings and their WSDLs parsed once per process,
zeep's hardened parser settings, the client of one binding (on its own requests session), the
WS-Security UsernameToken digest stamped by the device's clock, the credential-free
GetDeviceInformation of discovery, and `soap_call`, which turns every SOAP failure into a
`SoapDeviceError` (DEVICE_UNAVAILABLE for no answer, BACKEND_ERROR for a fault, malformed XML
or refused credentials)."""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Callable
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

from unskit.camera.backends import redacted_uri
from unskit.commands.codes import ErrorCode
from unskit.errors import SoapDeviceError

# Client is listed for the backend, which holds clients: zeep is imported here only.
__all__ = [
    "DEVICE_BINDING",
    "MEDIA_BINDING",
    "PTZ_BINDING",
    "Client",
    "device_information",
    "soap_call",
    "wsdl_document",
]

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


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
