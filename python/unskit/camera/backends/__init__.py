"""Camera backends: each acquires one frame (or an encoded image) on demand."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from unskit import errors
from unskit.camera.codec import Frame
from unskit.config.secrets import SecretResolver

__all__ = [
    "AXES",
    "EXTRAS",
    "Acquired",
    "Backend",
    "Preset",
    "PtzHead",
    "PtzStatus",
    "create_backend",
    "missing_extra",
]

#: The PTZ axes, in their normalized order.
AXES = ("pan", "tilt", "zoom")


@dataclass(frozen=True)
class Acquired:
    """What a backend returns: a decoded frame, and the camera's own encoding when it sent
    one (stored as received when the profile allows)."""

    frame: Frame
    encoded: bytes | None = None
    #: Epoch ms the camera stamped the frame with, or None when it stamps nothing.
    camera_frame_at_ms: int | None = None
    frame_received_at_ms: int = 0
    #: The monotonic instant (time.monotonic()) the frame arrived at the adapter, as well as
    #: the backend can tell: a stream's frame by its presentation timestamp (a decoder can
    #: hand out a frame long after its bytes came), an HTTP image less the age its headers
    #: declare. A capture's frame is fresh only if it arrived after the request, or within
    #: the camera's maxFrameAgeMs of it (freshness.py).
    arrived_at: float = field(kw_only=True)
    backend_metadata: Mapping[str, Any] = field(default_factory=dict)
    #: What the backend knows about the frame's freshness (freshness.py reads it):
    #: session and presentationTimestampMs (a stream), etag and lastModified (HTTP),
    #: frameCounter (a camera's own counter), triggerId, frameTriggerId and triggerToFrameMs
    #: (a software trigger).
    freshness: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PtzStatus:
    """Where a PTZ head is: normalized pan, tilt (-1..1) and zoom (0..1), and whether it
    moves (None where the head cannot tell)."""

    position: Mapping[str, float] | None
    moving: bool | None
    available: bool = True


@dataclass(frozen=True)
class Preset:
    """A preset the camera holds: its camera-issued token and its name (None if unnamed)."""

    token: str
    name: str | None


class PtzHead(Protocol):
    """A camera's pan-tilt-zoom head, backend-neutral: every value is normalized (pan and
    tilt -1..1, zoom 0..1, velocities and translations -1..1, speeds 0..1) and an axis
    missing from a mapping is left alone. Failures raise CommandError."""

    def status(self) -> PtzStatus:
        """The head's position and motion now."""
        ...

    def continuous(self, velocity: Mapping[str, float]) -> None:
        """Starts moving at `velocity` until stopped (the adapter arms the stop)."""
        ...

    def absolute(self, position: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """Moves to `position`."""
        ...

    def relative(self, translation: Mapping[str, float], speed: Mapping[str, float]) -> None:
        """Moves by `translation`."""
        ...

    def stop(self, axes: tuple[str, ...]) -> None:
        """Stops the named axes."""
        ...

    def presets(self) -> list[Preset]:
        """The presets the camera holds, in a stable order."""
        ...

    def goto_preset(self, token: str) -> None:
        """Moves to a preset; BAD_ARGS for a token the camera does not hold."""
        ...

    def set_preset(self, name: str) -> str:
        """Stores the current position as a new preset named `name`; its camera-issued token."""
        ...

    def remove_preset(self, token: str) -> None:
        """Forgets a preset; BAD_ARGS for a token the camera does not hold."""
        ...


class Backend(Protocol):
    """A camera's connection."""

    #: The backend name of the configuration (sim, snapshot-uri, rtsp-frame).
    name: str
    #: The captureMode its frames are reported with.
    capture_mode: str
    #: The camera's PTZ head, or None when this backend (or camera) has none.
    ptz: PtzHead | None

    def capabilities(self) -> dict[str, Any]:
        """captureModes, ptz, presets, presetMutation, vendor, model, warnings."""
        ...

    def grab(self, deadline: float, abandon: threading.Event) -> Acquired:
        """One frame asked for by this call, before the monotonic `deadline`, with when it
        arrived (`arrived_at`); raises CaptureError."""
        ...

    def reconnect(self) -> None:
        """Drops the live session (the next grab opens a new one)."""
        ...

    def close(self) -> None:
        """Releases the connection."""
        ...


def still_capabilities(mode: str, vendor: Any, model: Any) -> dict[str, Any]:
    """The capabilities of a camera that takes stills in one mode and has no PTZ."""
    return {
        "captureModes": [mode],
        "ptz": False,
        "presets": False,
        "presetMutation": False,
        "vendor": vendor,
        "model": model,
        "warnings": [],
    }


def redacted_uri(uri: str) -> str:
    """The URI without user information or query (which may carry tokens)."""
    parts = urlsplit(uri)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def create_backend(
    name: str, connection: Mapping[str, Any], secrets: SecretResolver | None = None
) -> Backend:
    """The backend `name` over `connection`; `$secret` credentials resolve on first connect."""
    if name == "sim":
        from unskit.camera.backends.sim import SimBackend

        return SimBackend(connection)
    if name == "snapshot-uri":
        from unskit.camera.backends.snapshot import SnapshotBackend

        return SnapshotBackend(connection, secrets)
    if name == "rtsp-frame":
        from unskit.camera.backends.rtsp import RtspBackend

        return RtspBackend(connection, secrets)
    if name == "onvif":
        from unskit.camera.backends.onvif import OnvifBackend

        return OnvifBackend(connection, secrets)
    raise ValueError(f"backend {name!r} is not available in this build")


#: The backends that need an optional extra: backend -> (extra, module it provides).
EXTRAS = {"onvif": ("onvif", "zeep")}


def missing_extra(backend: str) -> str | None:
    """The refusal of a backend whose optional extra is not installed (None: installed)."""
    if backend not in EXTRAS:
        return None
    extra, module = EXTRAS[backend]
    for name in (module, "onvif"):
        if not errors.extra_installed(name):
            return errors.missing_extra(f"backend {backend!r}", name, extra)
    return None
