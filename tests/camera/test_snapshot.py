"""The snapshot-uri backend against an HTTP server this test starts: basic and digest
authentication with `$secret` credentials, stored as received or re-encoded, and the
failures an HTTP camera can cause."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from tests.camera.conftest import CameraHarness, Rig
from tests.support.servers import free_port, wait_until
from tests.support.tiers import server_fixture
from unskit.camera.codec import jpeg_dimensions
from unskit.config.vault import Vault, VaultKey

USER, PASSWORD = "viewer", "s3cret-pw"
REALM = "camera"


def _image(kind: str, seed: int = 3) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(kind, pixels)
    assert ok
    return bytes(encoded.tobytes())


JPEG = _image(".jpg")
HOUR_S = 3600
PNG = _image(".png")


class Camera:
    """An HTTP camera: /basic.jpg, /digest.jpg, /open.png, /slow.jpg, /broken.jpg, and for
    freshness /live.jpg (a new picture and ETag each request), /cached.jpg (a cache in front
    of the camera: the same picture and ETag) and /dated.jpg (the same picture with only a
    Last-Modified that never changes, an hour old), /aged.jpg (a cache in front of the
    camera that serves the copy it stored an hour ago, with `Age: 3600`, whatever the request
    says) and /revalidating.jpg (the same cache, but honouring `Cache-Control: no-cache`: it
    asks the camera again and serves a new picture with `Age: 0`)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.nonce = secrets.token_hex(8)
        self.requests = 0
        self.hits: Counter[str] = Counter()
        self.live = 0
        #: An hour before the camera started: the Last-Modified of a picture that never changes.
        self.dated = formatdate(time.time() - HOUR_S, usegmt=True)
        camera = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                camera.requests += 1
                camera.hits[self.path] += 1
                if self.path == "/basic.jpg" and not camera.basic_ok(self):
                    return self.challenge(f'Basic realm="{REALM}"')
                if self.path == "/digest.jpg" and not camera.digest_ok(self):
                    return self.challenge(
                        f'Digest realm="{REALM}", nonce="{camera.nonce}", qop="auth", algorithm=MD5'
                    )
                if self.path == "/slow.jpg":
                    camera.release.wait(30)
                if self.path == "/broken.jpg":
                    return self.send(b"this is not an image", "image/jpeg")
                if self.path == "/live.jpg":
                    camera.live += 1
                    return self.send(
                        _image(".jpg", 100 + camera.live), "image/jpeg", ETag=f'"v{camera.live}"'
                    )
                if self.path == "/cached.jpg":
                    return self.send(
                        JPEG, "image/jpeg", ETag='"v1"', **{"Last-Modified": camera.dated}
                    )
                if self.path == "/dated.jpg":
                    return self.send(JPEG, "image/jpeg", **{"Last-Modified": camera.dated})
                revalidate = self.headers.get("Cache-Control") == "no-cache"
                if self.path == "/revalidating.jpg" and revalidate:
                    camera.live += 1
                    return self.send(_image(".jpg", 100 + camera.live), "image/jpeg", Age="0")
                if self.path in ("/aged.jpg", "/revalidating.jpg"):
                    return self.send(JPEG, "image/jpeg", Age=str(HOUR_S))
                if self.path == "/open.png":
                    return self.send(PNG, "image/png")
                if self.path in ("/basic.jpg", "/digest.jpg", "/slow.jpg"):
                    return self.send(JPEG, "image/jpeg")
                self.send_error(404)

            def challenge(self, header: str) -> None:
                self.send_response(401)
                self.send_header("WWW-Authenticate", header)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def send(self, data: bytes, content_type: str, **headers: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the /slow.jpg timeout tests make it)

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def basic_ok(self, handler: BaseHTTPRequestHandler) -> bool:
        import base64

        expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return handler.headers.get("Authorization") == f"Basic {expected}"

    def digest_ok(self, handler: BaseHTTPRequestHandler) -> bool:
        header = handler.headers.get("Authorization", "")
        if not header.startswith("Digest "):
            return False
        fields: dict[str, str] = {}
        for part in header[7:].split(","):
            key, _, value = part.strip().partition("=")
            fields[key] = value.strip('"')

        def md5(text: str) -> str:
            return hashlib.md5(text.encode()).hexdigest()

        ha1 = md5(f"{USER}:{REALM}:{PASSWORD}")
        ha2 = md5(f"GET:{fields.get('uri', '')}")
        expected = md5(f"{ha1}:{self.nonce}:{fields.get('nc')}:{fields.get('cnonce')}:auth:{ha2}")
        return fields.get("username") == USER and fields.get("response") == expected

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> Camera:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def camera() -> Iterator[Camera]:
    server = Camera().start()
    yield server
    server.stop()


@server_fixture
def rig(harness: CameraHarness, camera: Camera, tmp_path: Path) -> Rig:
    key = VaultKey.generate()
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    vault_path = tmp_path / "vault.json"
    Vault(vault_path, key).put("camera", {"username": USER, "password": PASSWORD})
    login = {
        "username": {"$secret": "camera", "field": "username"},
        "password": {"$secret": "camera", "field": "password"},
    }

    def snap(instance: str, path: str, **extra: Any) -> dict[str, Any]:
        return {
            "instance": instance,
            "backend": "snapshot-uri",
            "connection": {"uri": camera.url(path), **extra},
        }

    component = {
        "cameras": [
            snap("basic", "/basic.jpg", **login),
            snap("digest", "/digest.jpg", **login),
            snap("wrong", "/basic.jpg", username=USER, password="wrong"),
            snap("png", "/open.png"),
            snap("slow", "/slow.jpg"),
            snap("broken", "/broken.jpg"),
            snap("live", "/live.jpg"),
            # An hour-old picture is young enough for these two: their tests compare it
            # with the previous capture.
            {**snap("cached", "/cached.jpg"), "maxFrameAgeMs": 2 * HOUR_S * 1000},
            {**snap("dated", "/dated.jpg"), "maxFrameAgeMs": 2 * HOUR_S * 1000},
            # The same hour-old pictures with the default maxFrameAgeMs.
            snap("stored", "/dated.jpg"),
            snap("aged", "/aged.jpg"),
            snap("revalidating", "/revalidating.jpg"),
            # Nothing listens on a port that was free a moment ago.
            {
                "instance": "gone",
                "backend": "snapshot-uri",
                "connection": {"uri": f"http://127.0.0.1:{free_port()}/x.jpg"},
            },
        ],
        "captureProfiles": {
            "reencode": {"storeAsReceived": False, "quality": 50},
            "strict": {"freshness": "require"},
            "lax": {"freshness": "warn"},
            "blind": {"freshness": "off"},
        },
    }
    document = harness.document(
        component, credentials={"vaultPath": str(vault_path), "keyFile": str(key_file)}
    )
    return harness.start(component, document)


@pytest.mark.parametrize("instance", ["basic", "digest"])
def test_an_authenticated_jpeg_is_stored_as_received(rig: Rig, instance: str) -> None:
    body = rig.call("capture", {"requestId": f"r-{instance}"}, instance)
    assert body["captureMode"] == "snapshot-uri"
    image = Path(body["image"]["absolutePath"])
    assert image.read_bytes() == JPEG
    assert body["image"]["sha256"] == hashlib.sha256(JPEG).hexdigest()
    assert body["frame"] == {
        "width": 160,
        "height": 120,
        "pixelFormat": "bgr8",
        "sourceEncoding": "jpeg",
    }
    assert body["timestamps"]["cameraFrameTimestampQuality"] == "adapter-receive"
    assert "cameraFrameAt" not in body["timestamps"]
    assert body["backendMetadata"] == {"httpStatus": 200, "contentType": "image/jpeg"}
    assert PASSWORD not in str(body)
    assert body["camera"] == {"backend": "snapshot-uri"}


def test_a_profile_may_reencode(rig: Rig) -> None:
    body = rig.call("capture", {"requestId": "r", "captureProfile": "reencode"}, "basic")
    data = Path(body["image"]["absolutePath"]).read_bytes()
    assert data != JPEG
    assert jpeg_dimensions(data) == (160, 120)


def test_a_png_is_reencoded_as_jpeg(rig: Rig) -> None:
    body = rig.call("capture", {"requestId": "r"}, "png")
    data = Path(body["image"]["absolutePath"]).read_bytes()
    assert jpeg_dimensions(data) == (160, 120)
    assert body["frame"]["sourceEncoding"] == "png"
    assert body["image"]["contentType"] == "image/jpeg"


@pytest.mark.parametrize(
    ("instance", "code", "retriable"),
    [
        ("wrong", "BACKEND_ERROR", False),
        ("gone", "BACKEND_ERROR", True),
        ("broken", "UNSUPPORTED_PIXEL_FORMAT", False),
    ],
)
def test_failures_are_failure_bodies(rig: Rig, instance: str, code: str, retriable: bool) -> None:
    body = rig.call("capture", {"requestId": "r"}, instance)
    failure = body["failure"]
    assert (failure["code"], failure["stage"], failure["retriable"]) == (
        code,
        "acquisition",
        retriable,
    )
    assert "image" not in body
    assert PASSWORD not in failure["message"]
    assert rig.call("status", instance=instance)["state"] == "DEGRADED"


def test_a_camera_that_does_not_answer_times_out(rig: Rig, camera: Camera) -> None:
    body = rig.call("capture", {"requestId": "r", "timeoutMs": 1000}, "slow")
    assert body["failure"]["code"] == "CAPTURE_TIMEOUT"
    assert body["durationsMs"]["total"] < 5000
    camera.release.set()


# (camera, method that decides the second capture, verdict, outcome under require)
FRESHNESS = [
    ("live", "etag", "fresh", None),
    ("cached", "etag", "stale", "STALE_FRAME"),
    ("dated", "content-hash", "stale", "STALE_FRAME"),
]


@pytest.mark.parametrize(("instance", "method", "verdict", "code"), FRESHNESS)
def test_snapshot_freshness(
    rig: Rig, camera: Camera, instance: str, method: str, verdict: str, code: str | None
) -> None:
    strict = {"captureProfile": "strict"}
    first = rig.call("capture", {"requestId": f"{instance}-1", **strict}, instance)
    assert "image" in first
    second = rig.call("capture", {"requestId": f"{instance}-2", **strict}, instance)
    fresh = second["freshness"]
    assert (fresh["method"], fresh["verdict"]) == (method, verdict)
    evidence = fresh["evidence"]
    assert evidence["previousCaptureId"] == first["captureId"]
    if code is None:
        assert "image" in second
        assert evidence["etag"] != evidence["previousEtag"]
        assert evidence["identicalToPrevious"] is False
    else:
        assert second["failure"]["code"] == code
        assert "image" not in second
        assert evidence["identicalToPrevious"] is True
        assert evidence["lastModified"] == evidence["previousLastModified"] == camera.dated
        if method == "etag":
            assert evidence["etag"] == evidence["previousEtag"] == '"v1"'
        topic, _ = rig.announced(second["captureId"])
        assert topic.endswith("/app/image/failed")


# A cache in front of the camera, by what its response declares: (camera, profile) ->
# (outcome, verdict, method, frameAgeMs about). An image is as old as the response says:
# its Age plus how long before the response's Date it was Last-Modified (less the one
# second either may round away), counted back from the request. `require` asks again
# until the capture's timeout.
AGED = [
    ("aged", "strict", "STALE_FRAME", "stale", "frame-age", HOUR_S * 1000),
    ("aged", "lax", "SUCCEEDED", "stale", "frame-age", HOUR_S * 1000),
    ("aged", "blind", "SUCCEEDED", "unchecked", None, HOUR_S * 1000),
    ("stored", "strict", "STALE_FRAME", "stale", "frame-age", (HOUR_S - 1) * 1000),
    ("stored", "lax", "SUCCEEDED", "stale", "frame-age", (HOUR_S - 1) * 1000),
    # The cache honours the no-cache every GET sends: a new picture, not the stored one.
    ("revalidating", "strict", "SUCCEEDED", "unknown", "first-capture", 0),
    ("live", "strict", "SUCCEEDED", "unknown", "first-capture", 0),
]


@pytest.mark.parametrize(("instance", "profile", "outcome", "verdict", "method", "age"), AGED)
def test_an_old_picture_from_a_cache_is_not_a_new_image(
    rig: Rig,
    camera: Camera,
    instance: str,
    profile: str,
    outcome: str,
    verdict: str,
    method: str | None,
    age: int,
) -> None:
    timeout = 1000
    request = {"requestId": f"{instance}-{profile}", "captureProfile": profile}
    body = rig.call("capture", {**request, "timeoutMs": timeout}, instance)
    fresh = body["freshness"]
    assert (fresh["verdict"], fresh.get("method")) == (verdict, method)
    assert body["frame"]["width"] == 160
    if instance in ("live", "revalidating"):
        assert body["frameAgeMs"] == 0
    else:
        # Counted at the request, a moment before the answer (and the camera's start).
        assert age - 60_000 < body["frameAgeMs"] <= age + 60_000
    if verdict != "unchecked":
        assert fresh["evidence"]["frameAgeMs"] == body["frameAgeMs"]
        assert fresh["evidence"]["maxFrameAgeMs"] == 1000
    served = f"/{'dated' if instance == 'stored' else instance}.jpg"
    if outcome == "SUCCEEDED":
        assert "image" in body
        assert "failure" not in body
        assert camera.hits[served] == 1
        return
    assert "image" not in body
    assert body["failure"]["code"] == "STALE_FRAME"
    assert body["failure"]["stage"] == "acquisition"
    assert f"{body['frameAgeMs']} ms before the request" in body["failure"]["message"]
    # It asked again until the timeout: no answer was young enough.
    assert camera.hits[served] >= 2
    assert body["durationsMs"]["total"] >= timeout
    status = rig.status(body["captureId"])
    assert (status["state"], status["errorCode"]) == ("FAILED", "STALE_FRAME")
    assert status["result"]["frameAgeMs"] == body["frameAgeMs"]
    topic, message = rig.announced(body["captureId"])
    assert topic.endswith("/app/image/failed")
    assert message.body["frameAgeMs"] == body["frameAgeMs"]


def test_a_capture_cancelled_while_waiting_for_a_young_frame_reports_the_old_one(
    rig: Rig, camera: Camera
) -> None:
    request = {"requestId": "waiting", "captureProfile": "strict", "timeoutMs": 60_000}
    submitted = rig.call("capture-submit", request, "aged")
    stale = rig.runtime.metrics.counter("captures", "staleFrames", {"camera": "aged"})
    # Asked again and again (the cache keeps its hour-old copy), counted once.
    wait_until(lambda: camera.hits["/aged.jpg"] >= 3, 20, "the camera asked again")
    assert stale.total == 1
    assert rig.status(submitted["captureId"])["state"] == "ACQUIRING"
    cancel = rig.call("capture-cancel", {"requestId": "c", "captureId": submitted["captureId"]})
    assert cancel["cancelled"] is True
    body = rig.terminal(submitted["captureId"])["result"]
    assert "image" not in body
    assert "failure" not in body
    assert (HOUR_S - 60) * 1000 < body["frameAgeMs"] <= HOUR_S * 1000
    assert body["freshness"]["method"] == "frame-age"
    topic, message = rig.announced(submitted["captureId"])
    assert topic.endswith("/app/image/cancelled")
    assert message.body["frameAgeMs"] == body["frameAgeMs"]
