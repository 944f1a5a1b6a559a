"""The unskit exception tree; every error the library raises on purpose is one of these.

::

    UnskitError
    ├── EnvelopeError (also ValueError): bytes that are not a valid envelope,
    │                                     or content that breaks an envelope rule
    ├── ImageError (also ValueError): bytes that do not decode as an image, or an image
    │                                  request that cannot be met (shape, size name, quality)
    ├── ConfigError: a configuration document that cannot be read or breaks a rule;
    │                carries every `ConfigIssue` (JSON path and rule), not just the first
    ├── SecretError: a `$secret` reference or vault that cannot be resolved
    │                (no vault, wrong key, tampered file, unknown secret or field)
    ├── MessagingError: a broker link that cannot do what was asked
    │   ├── PublishError: a publish that could not be sent or queued
    │   ├── ReservedTopicError (also ValueError): a topic of class state, metric, cfg, log
    │   ├── RequestTimeoutError (also TimeoutError): no reply before the deadline
    │   └── UnsupportedQosError (also ValueError): a QoS the transport cannot give
    ├── CommandError: a command verb's failure, carrying the spec's errorCode and errorMessage;
    │                 raised by verb handlers (the inbox replies with it) and by
    │                 `CommandClient.call` when the reply is a failure
    │   └── SoapDeviceError: an ONVIF device's SOAP exchange that failed (no answer, a
    │                        fault, malformed XML, refused credentials)
    ├── SignalError (also ValueError): a scaling or deadband setting, or a batch of samples,
    │                                  the signal kernels cannot use
    ├── CipError (also ValueError): a CIP datagram or assembly value that cannot be built,
    │                               or an assembly plan that cannot be compiled
    ├── CredentialError (also ValueError): TLS material or policy that cannot be used (PEM that
    │                                       does not parse, a key not matching its certificate,
    │                                       an expired client certificate, an unknown cipher suite)
    ├── TlsError (also OSError): a TLS handshake or record failure (device certificate refused,
    │                            no cipher suite in common, an alert from the device)
    ├── JournalError (also ValueError): a file that is not an unskit journal (the idempotency
    │                                    records' file), or a record too large for one
    ├── DeviceError: a southbound device that cannot be reached or answered with an error;
    │                `connection_lost` asks the runtime to reconnect with backoff
    ├── EdgeRuntimeError: an edge-runtime IPC call that failed (the nucleus not there, the
    │   │                  connection lost, a request the runtime refused)
    │   ├── AccessDeniedError: the component's recipe lacks the permission (operation, resource)
    │   └── ComponentNotFoundError: a component the runtime does not have (CONFIG_COMPONENT)
    ├── EstError: an EST (RFC 7030) enrollment that failed: server unreachable, TLS refused,
    │             an HTTP error, or a reply that is not what the protocol promises
    ├── CaptureError: a camera capture stage that failed (backend, encoding, persistence);
    │                 carries the failure body's code, stage and retriable flag
    └── EgressError: a file that could not be delivered to one egress destination
        ├── DestinationError: the destination refused or could not be reached (retried later)
        ├── VerificationError: the delivered copy differs from the source (sent again)
        ├── SourceChangedError: the source file changed or vanished while it was sent
        ├── TransferInterruptedError: paused or stopping; resumes from the recorded progress
        └── UnsafePathError (also ValueError): a path that would escape its root

The Rust core's errors are mapped to these classes in ``rust/unskit-py/src/errors.rs``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "AccessDeniedError",
    "CaptureError",
    "CipError",
    "CommandError",
    "ComponentNotFoundError",
    "ConfigError",
    "ConfigIssue",
    "CredentialError",
    "DestinationError",
    "DeviceError",
    "EdgeRuntimeError",
    "EgressError",
    "EnvelopeError",
    "EstError",
    "ImageError",
    "JournalError",
    "MessagingError",
    "PublishError",
    "RequestTimeoutError",
    "ReservedTopicError",
    "SecretError",
    "SignalError",
    "SoapDeviceError",
    "SourceChangedError",
    "TlsError",
    "TransferInterruptedError",
    "UnsafePathError",
    "UnskitError",
    "UnsupportedQosError",
    "VerificationError",
    "extra_installed",
    "missing_extra",
]


class UnskitError(Exception):
    """Root of every error unskit raises on purpose."""


class EnvelopeError(UnskitError, ValueError):
    """Envelope bytes that do not decode, or content that breaks an envelope rule."""


class ImageError(UnskitError, ValueError):
    """Image bytes that do not decode, or a frame or thumbnail request that cannot be met."""


@dataclass(frozen=True, order=True)
class ConfigIssue:
    """One broken rule: the JSON path it sits at (``$.messaging.local.port``) and the rule."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(UnskitError):
    """A configuration that cannot be used; `issues` lists every rule it breaks."""

    issues: tuple[ConfigIssue, ...]

    def __init__(self, issues: Iterable[ConfigIssue], source: str | None = None) -> None:
        self.issues = tuple(issues)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = f" in {self.source}" if self.source else ""
        count = len(self.issues)
        if count == 0:
            return f"configuration error{where}"
        if count == 1:
            return f"configuration error{where}: {self.issues[0]}"
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        return f"{count} configuration errors{where}:\n{lines}"


class SecretError(UnskitError):
    """A secret that cannot be resolved; the message never carries secret material."""


class MessagingError(UnskitError):
    """A broker link that cannot do what was asked (not configured, closed, refused)."""


class PublishError(MessagingError):
    """A publish that could not be sent nor queued for the next connection."""


class ReservedTopicError(MessagingError, ValueError):
    """A publish, request or reply to a topic of class state, metric, cfg or log."""


class RequestTimeoutError(MessagingError, TimeoutError):
    """No reply arrived before the request's deadline (or the caller's wait)."""


class UnsupportedQosError(MessagingError, ValueError):
    """A QoS the transport cannot give, such as QoS 2 on the edge-runtime IPC bus."""


class CommandError(UnskitError):
    """A command that failed with one of the spec's error codes (``BAD_ARGS``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = str(code)
        self.message = message
        super().__init__(f"{self.code}: {message}")

    def to_body(self) -> dict[str, str]:
        """The failure reply body: ``{"errorCode": ..., "errorMessage": ...}``."""
        return {"errorCode": self.code, "errorMessage": self.message}


class SignalError(UnskitError, ValueError):
    """A scaling or deadband setting, or a batch of samples, the signal kernels cannot use."""


class CipError(UnskitError, ValueError):
    """A CIP datagram or assembly value that cannot be built, or a plan that cannot compile."""


class CredentialError(UnskitError, ValueError):
    """TLS material or policy that cannot be used; the message never contains the PEM."""


class TlsError(UnskitError, OSError):
    """A TLS handshake or record failure (refused certificate, no common suite, alert)."""


class JournalError(UnskitError, ValueError):
    """A file that is not an unskit journal, or a record too large for one."""


class DeviceError(UnskitError):
    """A device that cannot be reached or answered with an error. `connection_lost` tells
    the runtime to reconnect (with backoff) rather than count one failed request."""

    def __init__(self, message: str, *, connection_lost: bool = False, code: str = "") -> None:
        super().__init__(message)
        self.connection_lost = connection_lost
        #: A protocol-level status (a CIP general status, an OPC UA status code) when known.
        self.code = code


class EdgeRuntimeError(UnskitError):
    """An edge-runtime IPC call that failed: the nucleus not there, the connection lost, a
    request the runtime refused."""


class AccessDeniedError(EdgeRuntimeError):
    """The runtime refused an operation the component's recipe does not allow."""

    def __init__(self, message: str, *, operation: str, resource: str = "") -> None:
        super().__init__(message)
        #: The IPC operation refused (e.g. ``SubscribeToTopic``) and what it was on.
        self.operation = operation
        self.resource = resource


class ComponentNotFoundError(EdgeRuntimeError):
    """GetConfiguration or SubscribeToConfigurationUpdate named a component the runtime does
    not have (or one without a configuration)."""

    def __init__(self, operation: str, component: str) -> None:
        super().__init__(
            f"{operation}: the edge runtime has no component {component!r} (or it has no "
            "configuration): check the name and that it is deployed to this device"
        )
        self.component = component


class EstError(UnskitError):
    """An EST enrollment step that failed; `retry_after_s` is set when the server asked for
    a later retry (HTTP 202 or 503 with Retry-After)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CaptureError(UnskitError):
    """A capture that failed in one stage; becomes the terminal body's ``failure`` block."""

    def __init__(self, code: str, stage: str, message: str, *, retriable: bool = True) -> None:
        self.code = str(code)
        self.stage = stage
        self.message = message
        self.retriable = retriable
        super().__init__(f"{self.code} in {stage}: {message}")

    def to_failure(self) -> dict[str, object]:
        """The terminal body's failure block: code, stage, retriable, message."""
        return {
            "code": self.code,
            "stage": self.stage,
            "retriable": self.retriable,
            "message": self.message,
        }


class EgressError(UnskitError):
    """A file that could not be delivered to one egress destination."""


class DestinationError(EgressError):
    """The destination refused the transfer or could not be reached; retried with backoff."""


class VerificationError(EgressError):
    """The delivered copy does not match the source (size, checksum or entity tag)."""


class SourceChangedError(EgressError):
    """The source file changed (size, mtime or content) or vanished while it was sent."""


class TransferInterruptedError(EgressError):
    """The transfer stopped for a pause or shutdown; it resumes from its recorded progress."""


class UnsafePathError(EgressError, ValueError):
    """A relative path that would leave its root (``..``, absolute, or through a symlink)."""


class SoapDeviceError(CommandError):
    """An ONVIF device's SOAP exchange that failed (no answer, a fault, malformed XML, refused
    credentials): a command error code, and whether asking again may help."""

    def __init__(self, code: str, message: str, *, retriable: bool = True) -> None:
        super().__init__(code, message)
        self.retriable = retriable

    def to_capture_error(self) -> CaptureError:
        """The failure as a capture's failure block (stage acquisition)."""
        return CaptureError(self.code, "acquisition", self.message, retriable=self.retriable)


def extra_installed(*modules: str) -> bool:
    """Whether every module an optional extra provides can be found (none is imported)."""
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except ImportError:  # a parent package is missing or set aside
            return False
    return True


def missing_extra(what: str, module: str, extra: str) -> str:
    """The refusal of `what` without the SDK `module`, naming the pip command of its extra."""
    return (
        f"{what} needs the {module!r} package, which is not installed: "
        f"pip install 'unskit[{extra}]'"
    )
