"""The `sim` backend: synthetic frames of a configured size with a visible counter and
timestamp drawn into the pixels, a configurable latency and injected failures, and a
simulated PTZ head whose position is drawn as a red disc (x from pan, y from tilt, radius
from zoom).

With `captureMode: software-trigger` it behaves as a machine-vision camera: a capture sends
a trigger, the simulated sensor exposes for `triggerDelayMs`, and the frame read answers
with the id of the trigger it was exposed for; `repeatFrameEvery` N makes every Nth trigger
answered by the previous frame (a camera that re-sends its last buffer)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import cv2
import numpy as np

from unskit.camera.backends import Acquired, PtzHead, still_capabilities
from unskit.camera.backends.simptz import SimPtzHead
from unskit.camera.codec import Frame
from unskit.commands.codes import ErrorCode
from unskit.errors import CaptureError

__all__ = ["SimBackend"]


class SimBackend:
    """Frames from nowhere; `failEvery` N fails every Nth grab, `failFirst` N the first N."""

    name = "sim"
    ptz: PtzHead | None

    def __init__(self, connection: Mapping[str, Any]) -> None:
        self.width = int(connection.get("width", 1280))
        self.height = int(connection.get("height", 720))
        self.pixel_format = str(connection.get("pixelFormat", "bgr8"))
        # noise: the worst case for JPEG (large files and thumbnails).
        self.pattern = str(connection.get("pattern", "gradient"))
        self.latency_s = int(connection.get("latencyMs", 0)) / 1000
        self.fail_every = int(connection.get("failEvery", 0))
        self.fail_first = int(connection.get("failFirst", 0))
        self.vendor = str(connection.get("vendor", "unskit"))
        self.model = str(connection.get("model", "sim"))
        self.capture_mode = str(connection.get("captureMode", "simulated"))
        self.trigger_delay_s = int(connection.get("triggerDelayMs", 0)) / 1000
        self.repeat_frame_every = int(connection.get("repeatFrameEvery", 0))
        self._triggers = 0
        # The last triggered frame: (pixels, the trigger it answered, its epoch ms).
        self._last: tuple[np.ndarray[Any, np.dtype[np.uint8]], int, int] | None = None
        self._lock = threading.Lock()
        self._grabs = 0
        self.sessions = 0
        self._background: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self.head = SimPtzHead(connection)
        self.ptz = self.head

    def capabilities(self) -> dict[str, Any]:
        """Simulated frames; the head is there, but the camera's ptz settings decide
        whether it is offered (sessions.py)."""
        return still_capabilities(self.capture_mode, self.vendor, self.model)

    def _open(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        # A gradient drawn once per session; each grab copies it and draws its counter.
        if self._background is None:
            xs = np.linspace(0, 255, self.width, dtype=np.float32)
            ys = np.linspace(0, 255, self.height, dtype=np.float32)
            blue = np.broadcast_to(xs[None, :], (self.height, self.width))
            green = np.broadcast_to(ys[:, None], (self.height, self.width))
            red = np.full((self.height, self.width), 96, dtype=np.float32)
            image = np.stack([blue, green, red], axis=2).astype(np.uint8)
            if self.pattern == "noise":
                rng = np.random.default_rng(self.sessions)
                image = np.asarray(rng.integers(0, 256, image.shape, dtype=np.uint8), np.uint8)
            if self.pixel_format == "mono8":
                image = np.asarray(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), np.uint8)
            self._background = image
            self.sessions += 1
        return self._background

    def grab(self, deadline: float, abandon: threading.Event) -> Acquired:
        """Waits the configured latency (CAPTURE_TIMEOUT past the deadline), then draws (or,
        in software-trigger mode, triggers and reads the frame that answers)."""
        with self._lock:
            self._grabs += 1
            count = self._grabs
            background = self._open()
        if self.latency_s > 0:
            remaining = deadline - time.monotonic()
            if abandon.wait(min(self.latency_s, max(remaining, 0.0))) or (
                self.latency_s > remaining
            ):
                raise CaptureError(
                    ErrorCode.CAPTURE_TIMEOUT,
                    "acquisition",
                    f"the sim camera's latency of {self.latency_s * 1000:.0f} ms "
                    "outlasted the capture timeout",
                )
        if count <= self.fail_first or (self.fail_every and count % self.fail_every == 0):
            raise CaptureError(
                ErrorCode.BACKEND_ERROR, "acquisition", f"injected failure of grab {count}"
            )
        if self.capture_mode == "software-trigger":
            trigger_id, issued = self.trigger()
            return self.read_frame(trigger_id, issued, background, deadline, abandon)
        now = time.time()
        pixels = self._draw(background, f"#{count}", now)
        now_ms = int(now * 1000)
        return Acquired(
            frame=Frame(pixels, self.pixel_format, "raw"),
            camera_frame_at_ms=now_ms,
            frame_received_at_ms=now_ms,
            arrived_at=time.monotonic(),
            backend_metadata={"frameCounter": count},
            freshness={"frameCounter": count, "session": self.sessions},
        )

    def trigger(self) -> tuple[int, float]:
        """Sends a software trigger: its id and the monotonic instant it was sent."""
        with self._lock:
            self._triggers += 1
            return self._triggers, time.monotonic()

    def read_frame(
        self,
        trigger_id: int,
        issued: float,
        background: np.ndarray[Any, np.dtype[np.uint8]],
        deadline: float,
        abandon: threading.Event,
    ) -> Acquired:
        """Reads the frame exposed for a trigger, once the sensor delivers it."""
        ready = issued + self.trigger_delay_s
        wait = ready - time.monotonic()
        if wait > 0 and (
            abandon.wait(min(wait, max(deadline - time.monotonic(), 0.0))) or (ready > deadline)
        ):
            raise CaptureError(
                ErrorCode.CAPTURE_TIMEOUT,
                "acquisition",
                f"no frame answered trigger {trigger_id} before the capture timeout",
            )
        with self._lock:
            repeat = (
                self.repeat_frame_every > 0
                and trigger_id % self.repeat_frame_every == 0
                and self._last is not None
            )
            if repeat:
                assert self._last is not None
                pixels, answered, frame_ms = self._last
            else:
                now = time.time()
                pixels = self._draw(background, f"T{trigger_id}", now)
                answered, frame_ms = trigger_id, int(now * 1000)
                self._last = (pixels, answered, frame_ms)
        latency_ms = round((time.monotonic() - issued) * 1000, 3)
        return Acquired(
            frame=Frame(pixels.copy(), self.pixel_format, "raw"),
            camera_frame_at_ms=frame_ms,
            frame_received_at_ms=int(time.time() * 1000),
            arrived_at=time.monotonic(),
            backend_metadata={"triggerId": trigger_id, "triggerToFrameMs": latency_ms},
            freshness={
                "triggerId": trigger_id,
                "frameTriggerId": answered,
                "triggerToFrameMs": latency_ms,
            },
        )

    def _draw(
        self, background: np.ndarray[Any, np.dtype[np.uint8]], label: str, now: float
    ) -> np.ndarray[Any, np.dtype[np.uint8]]:
        pixels = np.asarray(background.copy(), np.uint8)
        stamp = datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="milliseconds")
        scale = max(self.height / 360, 0.5)
        thickness = max(int(scale * 2), 1)
        colour = 255 if self.pixel_format == "mono8" else (255, 255, 255)
        cv2.putText(
            pixels, label, (int(20 * scale), int(60 * scale)),
            cv2.FONT_HERSHEY_SIMPLEX, 1.6 * scale, colour, thickness, cv2.LINE_AA,
        )  # fmt: skip
        cv2.putText(
            pixels, stamp, (int(20 * scale), int(110 * scale)),
            cv2.FONT_HERSHEY_SIMPLEX, 0.8 * scale, colour, thickness, cv2.LINE_AA,
        )  # fmt: skip
        self._draw_head(pixels, scale)
        return pixels

    def _draw_head(self, pixels: np.ndarray[Any, np.dtype[np.uint8]], scale: float) -> None:
        # Pure red appears nowhere else (the gradient keeps red at 96, the text is white),
        # so a test finds the disc by colour.
        position = self.head.position()
        x = round((position["pan"] + 1) / 2 * (self.width - 1))
        y = round((1 - position["tilt"]) / 2 * (self.height - 1))
        radius = max(int(8 * scale * (1 + 2 * position["zoom"])), 2)
        colour = 0 if self.pixel_format == "mono8" else (0, 0, 255)
        cv2.circle(pixels, (x, y), radius, colour, -1, cv2.LINE_8)

    def reconnect(self) -> None:
        """Forgets the session; the next grab opens a new one."""
        with self._lock:
            self._background = None

    def close(self) -> None:
        """Nothing to release."""
        self.reconnect()
