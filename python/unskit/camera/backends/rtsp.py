"""The `rtsp-frame` backend: OpenCV's bundled FFmpeg keeps an RTSP session open between
captures (a reader thread decodes continuously, so the stream stays warm), and a capture
takes the first frame decoded after it asked.

Decoded after the request is not arrived after it: FFmpeg's frame-threaded decoder holds a
few frames, and when the stream stalls (the server stops sending, the socket open) it hands
them out at each read timeout, seconds after their bytes came. So each frame's arrival is
told by the stream's own clock (`StreamClock`), and the capture judges its age by that."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import cv2
import numpy as np

from unskit.camera.backends import Acquired, PtzHead, redacted_uri, still_capabilities
from unskit.camera.codec import Frame
from unskit.commands.codes import ErrorCode
from unskit.config.secrets import SecretRef, SecretResolver, resolve_value
from unskit.errors import CaptureError, SecretError

__all__ = ["RtspBackend", "StreamClock"]

_log = logging.getLogger(__name__)

# FFmpeg's demuxer options for every RTSP capture of this process (an operator's own
# OPENCV_FFMPEG_CAPTURE_OPTIONS wins): short probing, so a session opens in well under a
# second instead of about three.
_FFMPEG_OPTIONS = (
    "rtsp_transport;{transport}|analyzeduration;200000|probesize;65536|fflags;nobuffer"
)
OPEN_TIMEOUT_MS = 10_000
READ_TIMEOUT_MS = 5_000
_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
#: How fast the stream clock's offset may rise, in seconds per second: a camera clock up to
#: 1000 ppm slower than ours is followed, a stall (seconds without a frame) is not.
CLOCK_CREEP = 0.001


class StreamClock:
    """When each frame of one session arrived, by its presentation timestamp: a frame should
    have come `offset` after its timestamp, the least delay seen in the session (rising by
    at most CLOCK_CREEP per second, so the clocks may drift). A frame handed out late (a
    decoder draining after a stall) is placed back at its timestamp, never at its decoding.
    A timestamp that does not advance re-anchors the clock at that frame's receipt."""

    def __init__(self) -> None:
        self._offset: float | None = None
        self._received = 0.0
        self._pts_s = 0.0

    def arrival(self, received: float, pts_ms: float) -> float:
        """The monotonic instant a frame received (decoded) at `received` arrived."""
        pts_s = pts_ms / 1000
        delay = received - pts_s
        if self._offset is None or pts_s <= self._pts_s:
            self._offset = delay
        else:
            elapsed = max(received - self._received, 0.0)
            self._offset = min(self._offset + CLOCK_CREEP * elapsed, delay)
        self._received, self._pts_s = received, pts_s
        return pts_s + self._offset


class RtspBackend:
    """One warm RTSP session per camera; `reconnect` drops it."""

    name = "rtsp-frame"
    capture_mode = "rtsp-frame"
    ptz: PtzHead | None = None

    def __init__(self, connection: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.uri = str(connection["uri"])
        self.where = redacted_uri(self.uri)
        self.vendor = connection.get("vendor")
        self.model = connection.get("model")
        self.transport = str(connection.get("transport", "tcp"))
        self._username = connection.get("username")
        self._password = connection.get("password")
        self._secrets = secrets
        os.environ.setdefault(
            "OPENCV_FFMPEG_CAPTURE_OPTIONS", _FFMPEG_OPTIONS.format(transport=self.transport)
        )
        self._cond = threading.Condition()
        self._frame: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._frame_ms = 0
        self._frame_arrived = 0.0
        self._frame_pts: float | None = None
        self._frame_session = 0
        self._sequence = 0
        self._error: str | None = None
        self._error_at = 0.0
        self._session = 0
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self.sessions = 0

    def capabilities(self) -> dict[str, Any]:
        """Frames from a stream; PTZ is a later issue."""
        return still_capabilities("rtsp-frame", self.vendor, self.model)

    def _credential(self, value: Any) -> str | None:
        ref = SecretRef.parse(value)
        secret = resolve_value(ref if ref is not None else value, self._secrets)
        return None if secret is None else secret.reveal()

    def _source(self) -> str:
        username = self._credential(self._username)
        if username is None:
            return self.uri
        password = self._credential(self._password) or ""
        parts = urlsplit(self.uri)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        login = f"{quote(username, safe='')}:{quote(password, safe='')}@{host}"
        return urlunsplit((parts.scheme, login, parts.path, parts.query, ""))

    def _ensure_reader(self) -> None:
        with self._cond:
            if self._reader is None or not self._reader.is_alive():
                self._stop = threading.Event()
                self._session += 1
                self._reader = threading.Thread(
                    target=self._read,
                    args=(self._session, self._stop),
                    name=f"rtsp-{self.where}",
                    daemon=True,
                )
                self._reader.start()

    def _read(self, session: int, stop: threading.Event) -> None:
        attempt = 0
        while not stop.is_set():
            try:
                source = self._source()
            except SecretError as error:
                self._failed(f"the camera's credentials cannot be resolved: {error}")
                return
            capture = cv2.VideoCapture(
                source,
                cv2.CAP_FFMPEG,
                [
                    cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, OPEN_TIMEOUT_MS,
                    cv2.CAP_PROP_READ_TIMEOUT_MSEC, READ_TIMEOUT_MS,
                ],
            )  # fmt: skip
            if not capture.isOpened():
                capture.release()
                self._failed(f"{self.where} could not be opened")
                stop.wait(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
                attempt += 1
                continue
            self.sessions += 1
            opened = self.sessions
            clock = StreamClock()
            attempt = 0
            try:
                while not stop.is_set():
                    ok, pixels = capture.read()
                    if not ok or pixels is None:
                        self._failed(f"{self.where} stopped sending frames")
                        break
                    # The stream's presentation timestamp of this frame (ms from the start
                    # of the session): the freshness evidence of a stream.
                    pts = float(capture.get(cv2.CAP_PROP_POS_MSEC))
                    arrived = clock.arrival(time.monotonic(), pts)
                    with self._cond:
                        if session != self._session:
                            return
                        self._frame = np.asarray(pixels, np.uint8)
                        self._frame_ms = time.time_ns() // 1_000_000
                        self._frame_arrived = arrived
                        self._frame_pts = pts
                        self._frame_session = opened
                        self._sequence += 1
                        self._error = None
                        self._cond.notify_all()
            finally:
                capture.release()

    def _failed(self, message: str) -> None:
        with self._cond:
            self._error = message
            self._error_at = time.monotonic()
            self._cond.notify_all()
        _log.debug("rtsp: %s", message)

    def grab(self, deadline: float, abandon: threading.Event) -> Acquired:
        """The first frame decoded after this call, before the deadline (when it arrived
        by the stream's clock in `arrived_at`)."""
        asked = time.monotonic()
        self._ensure_reader()
        with self._cond:
            seen = self._sequence
            while self._sequence == seen:
                if self._error is not None and self._error_at >= asked:
                    raise CaptureError(ErrorCode.BACKEND_ERROR, "acquisition", self._error)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or abandon.is_set():
                    reason = f": {self._error}" if self._error else ""
                    raise CaptureError(
                        ErrorCode.CAPTURE_TIMEOUT,
                        "acquisition",
                        f"no fresh frame from {self.where} in time{reason}",
                    )
                self._cond.wait(min(remaining, 0.5))
            assert self._frame is not None
            pixels, received, arrived = self._frame, self._frame_ms, self._frame_arrived
            pts, session = self._frame_pts, self._frame_session
        return Acquired(
            frame=Frame(pixels, "bgr8", "h264"),
            camera_frame_at_ms=None,
            frame_received_at_ms=received,
            arrived_at=arrived,
            backend_metadata={"session": self.sessions},
            freshness={"session": session, "presentationTimestampMs": pts},
        )

    def reconnect(self) -> None:
        """Ends the live session; the next capture opens a new one."""
        with self._cond:
            self._session += 1
            self._stop.set()
            self._reader = None
            self._error = None
            self._cond.notify_all()

    def close(self) -> None:
        """Ends the session."""
        self.reconnect()
