"""The `snapshot-uri` backend: one HTTP(S) GET of a still image per capture, with basic or
digest authentication. A JPEG is kept as received when the profile allows; anything OpenCV
decodes (PNG, BMP) is re-encoded.

HTTP gives no frame time, so the image arrived when its response did, less the age the
response declares (`declared_age_s`): a cache's `Age`, and how long before the response's
`Date` the image was `Last-Modified`. Each GET says `Cache-Control: no-cache`, so a
conforming cache in front of the camera asks the camera again. A cache that strips both
headers and serves an old picture cannot be told apart by its age: only its bytes, equal
to the previous capture's, betray it (freshness.py)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import Message
from email.utils import parsedate_to_datetime
from typing import Any

from unskit.camera.backends import Acquired, PtzHead, redacted_uri, still_capabilities
from unskit.camera.codec import decode_image
from unskit.commands.codes import ErrorCode
from unskit.config.secrets import SecretRef, SecretResolver, resolve_value
from unskit.errors import CaptureError, SecretError

__all__ = ["SnapshotBackend"]

# A snapshot larger than this is refused rather than held in memory.
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
_CHUNK = 1 << 16


def declared_age_s(headers: Message) -> float:
    """How old a response says its image is, in seconds, at least: its `Age` (time spent in
    caches) plus how long before its `Date` it was `Last-Modified`, less the one second
    either whole-second value may round away. 0 when it says nothing (or nonsense)."""
    age = 0.0
    value = headers.get("Age", "").strip()
    if value.isdigit():
        age = float(value)
    date, modified = headers.get("Date"), headers.get("Last-Modified")
    if date and modified:
        try:
            held = (parsedate_to_datetime(date) - parsedate_to_datetime(modified)).total_seconds()
        except (TypeError, ValueError):
            held = 0.0
        age += max(held - 1.0, 0.0)
    return age


class SnapshotBackend:
    """GETs `connection.uri`; credentials are resolved on the first capture."""

    name = "snapshot-uri"
    capture_mode = "snapshot-uri"
    ptz: PtzHead | None = None

    def __init__(self, connection: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.uri = str(connection["uri"])
        self.vendor = connection.get("vendor")
        self.model = connection.get("model")
        self._username = connection.get("username")
        self._password = connection.get("password")
        self._secrets = secrets
        self._lock = threading.Lock()
        self._opener: urllib.request.OpenerDirector | None = None

    def capabilities(self) -> dict[str, Any]:
        """Snapshots only; no PTZ through this backend."""
        return still_capabilities("snapshot-uri", self.vendor, self.model)

    def _credential(self, value: Any) -> str | None:
        ref = SecretRef.parse(value)
        secret = resolve_value(ref if ref is not None else value, self._secrets)
        return None if secret is None else secret.reveal()

    def _open(self) -> urllib.request.OpenerDirector:
        with self._lock:
            if self._opener is None:
                handlers: list[urllib.request.BaseHandler] = []
                try:
                    username = self._credential(self._username)
                    password = self._credential(self._password)
                except SecretError as error:
                    raise CaptureError(
                        ErrorCode.BACKEND_ERROR,
                        "acquisition",
                        f"the camera's credentials cannot be resolved: {error}",
                        retriable=False,
                    ) from None
                if username is not None:
                    passwords = urllib.request.HTTPPasswordMgrWithDefaultRealm()
                    passwords.add_password(None, self.uri, username, password or "")
                    handlers.append(urllib.request.HTTPBasicAuthHandler(passwords))
                    handlers.append(urllib.request.HTTPDigestAuthHandler(passwords))
                self._opener = urllib.request.build_opener(*handlers)
            return self._opener

    def grab(self, deadline: float, abandon: threading.Event) -> Acquired:
        """One GET, bounded by the capture deadline."""
        opener = self._open()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CaptureError(ErrorCode.CAPTURE_TIMEOUT, "acquisition", "no time left to ask")
        where = redacted_uri(self.uri)
        request = urllib.request.Request(
            self.uri, headers={"Cache-Control": "no-cache", "Pragma": "no-cache"}
        )
        try:
            with opener.open(request, timeout=remaining) as response:
                status = int(response.status)
                content_type = str(response.headers.get("Content-Type", ""))
                validators = {
                    key: response.headers.get(header)
                    for key, header in (("etag", "ETag"), ("lastModified", "Last-Modified"))
                    if response.headers.get(header)
                }
                age_s = declared_age_s(response.headers)
                if response.headers.get("Age", "").strip().isdigit():
                    validators["httpAge"] = int(response.headers["Age"].strip())
                data = bytearray()
                while chunk := response.read(_CHUNK):
                    data += chunk
                    if len(data) > MAX_SNAPSHOT_BYTES or abandon.is_set():
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError
        except urllib.error.HTTPError as error:
            refused = error.code in (401, 403)
            raise CaptureError(
                ErrorCode.BACKEND_ERROR,
                "acquisition",
                f"{where} answered HTTP {error.code}"
                + (": the credentials were refused" if refused else ""),
                retriable=not refused,
            ) from None
        except TimeoutError:
            raise CaptureError(
                ErrorCode.CAPTURE_TIMEOUT, "acquisition", f"{where} did not answer in time"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, TimeoutError):
                raise CaptureError(
                    ErrorCode.CAPTURE_TIMEOUT, "acquisition", f"{where} did not answer in time"
                ) from None
            raise CaptureError(
                ErrorCode.BACKEND_ERROR, "acquisition", f"{where} cannot be reached: {reason}"
            ) from None
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise CaptureError(
                ErrorCode.BACKEND_ERROR,
                "acquisition",
                f"{where} sent more than {MAX_SNAPSHOT_BYTES} bytes",
                retriable=False,
            )
        received_ms, received = time.time_ns() // 1_000_000, time.monotonic()
        payload = bytes(data)
        try:
            frame = decode_image(payload)
        except ValueError:
            raise CaptureError(
                ErrorCode.UNSUPPORTED_PIXEL_FORMAT,
                "acquisition",
                f"{where} sent {content_type or 'data'} that does not decode as an image",
                retriable=False,
            ) from None
        encoded = payload if frame.source_encoding == "jpeg" else None
        return Acquired(
            frame=frame,
            encoded=encoded,
            camera_frame_at_ms=None,
            frame_received_at_ms=received_ms,
            arrived_at=received - age_s,
            backend_metadata={"httpStatus": status, "contentType": content_type},
            freshness=validators,
        )

    def reconnect(self) -> None:
        """Forgets the opener (and any resolved credentials); the next GET builds a new one."""
        with self._lock:
            self._opener = None

    def close(self) -> None:
        """Nothing stays open between captures."""
        self.reconnect()
