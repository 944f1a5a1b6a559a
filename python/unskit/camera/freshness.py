"""Capture freshness: how a capture knows its frame is new, judged against its own request
(the frame's age) and against the previous capture of the same camera, and what a capture
profile does with a stale frame (`freshness: require | warn | off`).

A frame is fresh for a capture only if it arrived after the capture was requested, or at
most the camera's `maxFrameAgeMs` before (its age: how long before the request it arrived,
0 when after; the backend says when it arrived, see `Acquired.arrived_at`). An older frame
is stale by `frame-age`, whatever the previous capture was: a stalled stream's decoder
hands out the last frames it received long after they came, and a cache in front of an
HTTP camera answers with a picture taken long ago. Under `require` the pipeline asks again
for such a frame until the capture's deadline (a new frame may yet come).

Against the previous capture, the evidence strongest first (a frame provably the previous
one is stale by it even when young enough, and fails at once under `require`):

- trigger-latency: a software trigger was answered by a frame exposed for that trigger
  (fresh) or by a frame exposed for an earlier one (stale);
- presentation-timestamp: the stream's timestamp advanced since the previous capture of the
  same stream session (fresh), or did not (stale); a new session makes them incomparable;
- etag / last-modified: the HTTP validators changed (fresh) or the ETag stayed (stale);
- frame-counter: the camera's own frame counter advanced (fresh) or did not (stale);
- content-hash: the decoded pixels differ from the previous capture's (fresh) or are bit
  for bit the same (stale). A sensor never delivers two identical frames, so identical
  pixels are stale whatever the transport says: a frozen encoder keeps stamping new
  timestamps on the same picture. The perceptual distance (a 64-bit difference hash) is
  reported beside it, as evidence only: a still scene is legitimately similar.

The verdict is fresh, stale or unknown (the first young-enough capture of a camera with no
other evidence). Only stale fails, and only under `require`.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from unskit.camera.backends import Acquired
from unskit.camera.codec import Frame

__all__ = ["FreshnessMemory", "Judgement", "fingerprint"]

_HASH_SIDE = 8


def fingerprint(frame: Frame) -> tuple[str, int]:
    """The frame's exact pixel digest (sha256 hex) and its 64-bit difference hash."""
    pixels = np.ascontiguousarray(frame.pixels)
    digest = hashlib.sha256()
    digest.update(f"{pixels.shape}{pixels.dtype}".encode())
    digest.update(pixels.data)
    grey = pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_BGR2GRAY)
    small = cv2.resize(grey, (_HASH_SIDE + 1, _HASH_SIDE), interpolation=cv2.INTER_AREA)
    bits = (small[:, 1:] > small[:, :-1]).flatten()
    value = 0
    for bit in bits:
        value = (value << 1) | int(bit)
    return digest.hexdigest(), value


@dataclass(frozen=True)
class _Previous:
    """What the previous capture of a camera left to compare with."""

    capture_id: str
    signals: Mapping[str, Any]
    content: str
    perceptual: int


@dataclass(frozen=True)
class Judgement:
    """A capture's freshness: its verdict and the body's `freshness` object."""

    verdict: str
    body: Mapping[str, Any]

    @property
    def stale(self) -> bool:
        """Whether the frame is too old for its capture or provably the previous capture's."""
        return self.verdict == "stale"

    @property
    def too_old(self) -> bool:
        """Whether it is stale by its age alone (a newer frame may still come)."""
        return self.stale and self.body["method"] == "frame-age"


def _compare(signals: Mapping[str, Any], previous: _Previous | None) -> tuple[str | None, str]:
    """(method, verdict) from the backend's own evidence; (None, unknown) when it has none."""
    before = previous.signals if previous is not None else {}
    if "triggerId" in signals:
        answered = signals.get("frameTriggerId") == signals["triggerId"]
        return "trigger-latency", "fresh" if answered else "stale"
    if signals.get("presentationTimestampMs") is not None:
        same_session = before.get("session") == signals.get("session")
        if same_session and before.get("presentationTimestampMs") is not None:
            advanced = signals["presentationTimestampMs"] > before["presentationTimestampMs"]
            return "presentation-timestamp", "fresh" if advanced else "stale"
        return None, "unknown"
    if signals.get("etag") is not None and before.get("etag") is not None:
        return "etag", "stale" if signals["etag"] == before["etag"] else "fresh"
    if signals.get("lastModified") is not None and before.get("lastModified") is not None:
        # One-second resolution: an unchanged value proves nothing, a changed one does.
        if signals["lastModified"] != before["lastModified"]:
            return "last-modified", "fresh"
        return None, "unknown"
    if "frameCounter" in signals:
        same_session = before.get("session") == signals.get("session")
        if same_session and "frameCounter" in before:
            advanced = signals["frameCounter"] > before["frameCounter"]
            return "frame-counter", "fresh" if advanced else "stale"
    return None, "unknown"


class FreshnessMemory:
    """One camera's previous capture, and the judge of the next against it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._previous: _Previous | None = None

    def judge(
        self, capture_id: str, acquired: Acquired, policy: str, *, age_ms: int, max_age_ms: int
    ) -> Judgement:
        """Judges a frame `age_ms` older than its request (the camera allows `max_age_ms`) and
        against the previous capture; remembers it as the previous unless `require` refuses
        it for its age (the capture then waits for a newer frame)."""
        if policy == "off":
            return Judgement("unchecked", {"policy": "off", "verdict": "unchecked"})
        content, perceptual = fingerprint(acquired.frame)
        signals = dict(acquired.freshness)
        with self._lock:
            previous = self._previous
        method, verdict = _compare(signals, previous)
        evidence: dict[str, Any] = {**signals, "contentSha256": content}
        evidence["frameAgeMs"] = age_ms
        evidence["maxFrameAgeMs"] = max_age_ms
        evidence["perceptualHash"] = f"{perceptual:016x}"
        if previous is not None:
            identical = previous.content == content
            evidence["previousCaptureId"] = previous.capture_id
            evidence["identicalToPrevious"] = identical
            evidence["perceptualDistance"] = bin(previous.perceptual ^ perceptual).count("1")
            for key in ("presentationTimestampMs", "etag", "lastModified", "frameCounter"):
                if key in previous.signals and key in signals:
                    evidence["previous" + key[0].upper() + key[1:]] = previous.signals[key]
            if identical:
                method = method if verdict == "stale" else "content-hash"
                verdict = "stale"
            elif verdict == "unknown":
                method, verdict = "content-hash", "fresh"
        if age_ms > max_age_ms and verdict != "stale":
            # Provably the previous frame is the stronger finding; otherwise its age decides.
            method, verdict = "frame-age", "stale"
        if not (policy == "require" and method == "frame-age"):
            with self._lock:
                self._previous = _Previous(capture_id, signals, content, perceptual)
        body = {
            "policy": policy,
            "verdict": verdict,
            "method": method or "first-capture",
            "evidence": evidence,
        }
        return Judgement(verdict, body)

    def forget(self) -> None:
        """Drops the previous capture (a camera restarted by a reload)."""
        with self._lock:
            self._previous = None
