"""The rtsp-frame backend against a GStreamer RTSP server (H.264) the test starts with the
system Python (gst-rtsp-server through python3-gi; FFmpeg cannot serve RTSP to a client)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.camera.conftest import CameraHarness, Rig
from tests.support.servers import free_port, port_open, wait_until

SERVER = """
import sys
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer
Gst.init(None)
server = GstRtspServer.RTSPServer.new()
server.set_address("127.0.0.1")
server.set_service(sys.argv[1])
factory = GstRtspServer.RTSPMediaFactory.new()
factory.set_shared(True)
factory.set_launch(
    "( videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=10/1"
    " ! videoconvert ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10"
    " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)
server.get_mount_points().add_factory("/cam", factory)
# A stream that froze: the encoder keeps sending (timestamps advance) one picture, losslessly,
# so every decoded frame is the same pixels (what a hung sensor behind a live encoder gives).
frozen = GstRtspServer.RTSPMediaFactory.new()
frozen.set_shared(True)
frozen.set_launch(
    "( videotestsrc pattern=ball num-buffers=1 ! video/x-raw,width=320,height=240,framerate=10/1"
    " ! imagefreeze is-live=true ! video/x-raw,framerate=10/1 ! videoconvert"
    " ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10 pass=quant quantizer=0"
    " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)
server.get_mount_points().add_factory("/frozen", frozen)
server.attach(None)
GLib.MainLoop().run()
"""


def _gst_rtsp_available() -> bool:
    probe = (
        "import gi; gi.require_version('GstRtspServer', '1.0');"
        "from gi.repository import GstRtspServer"
    )
    result = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True, check=False)
    return result.returncode == 0


@pytest.fixture(scope="module")
def rtsp_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not _gst_rtsp_available():
        pytest.fail(
            "gst-rtsp-server is not installed: apt-get install gir1.2-gst-rtsp-server-1.0 "
            "gstreamer1.0-plugins-ugly gstreamer1.0-plugins-good gstreamer1.0-plugins-base"
        )
    script = tmp_path_factory.mktemp("rtsp") / "gst_rtsp.py"
    script.write_text(SERVER)
    port = free_port()
    process = subprocess.Popen(
        ["/usr/bin/python3", str(script), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: port_open(port), 20, "the RTSP server")
        yield f"rtsp://127.0.0.1:{port}/cam"
    finally:
        process.kill()
        process.wait(5)


@pytest.fixture
def rig(harness: CameraHarness, rtsp_url: str) -> Rig:
    return harness.start(
        {
            "cameras": [
                {"instance": "stream", "backend": "rtsp-frame", "connection": {"uri": rtsp_url}},
                {
                    "instance": "frozen",
                    "backend": "rtsp-frame",
                    "connection": {"uri": rtsp_url.replace("/cam", "/frozen")},
                },
                {
                    "instance": "nowhere",
                    "backend": "rtsp-frame",
                    "connection": {"uri": f"rtsp://127.0.0.1:{free_port()}/cam"},
                },
            ],
            "captureProfiles": {"strict": {"freshness": "require"}},
        }
    )


def test_a_fresh_frame_from_a_warm_session(rig: Rig) -> None:
    first = rig.call("capture", {"requestId": "a", "timeoutMs": 20_000}, "stream")
    assert first["captureMode"] == "rtsp-frame"
    assert first["frame"]["width"] == 320
    assert first["frame"]["height"] == 240
    assert first["timestamps"]["cameraFrameTimestampQuality"] == "adapter-receive"
    assert Path(first["image"]["absolutePath"]).stat().st_size == first["image"]["bytes"]
    second = rig.call("capture", {"requestId": "b"}, "stream")
    # The session stayed open: no new connection for the second capture.
    assert second["backendMetadata"]["session"] == first["backendMetadata"]["session"] == 1
    # A fresh frame is one decoded after the request.
    assert second["timestamps"]["frameReceivedAt"] >= second["timestamps"]["requestedAt"]
    assert second["durationsMs"]["acquisition"] < 2000
    rig.call("reconnect", {"requestId": "c"}, "stream")
    third = rig.call("capture", {"requestId": "d", "timeoutMs": 20_000}, "stream")
    assert third["backendMetadata"]["session"] == 2


def test_an_unreachable_stream_fails_before_its_timeout(rig: Rig) -> None:
    body = rig.call("capture", {"requestId": "x", "timeoutMs": 10_000}, "nowhere")
    assert body["failure"]["code"] == "BACKEND_ERROR"
    assert body["failure"]["stage"] == "acquisition"
    assert body["durationsMs"]["total"] < 10_000


def test_a_live_stream_is_fresh_by_its_presentation_timestamps(rig: Rig) -> None:
    first = rig.call(
        "capture", {"requestId": "l1", "captureProfile": "strict", "timeoutMs": 20_000}, "stream"
    )
    second = rig.call("capture", {"requestId": "l2", "captureProfile": "strict"}, "stream")
    assert "image" in second
    fresh = second["freshness"]
    assert fresh["policy"] == "require"
    assert (fresh["verdict"], fresh["method"]) == ("fresh", "presentation-timestamp")
    evidence = fresh["evidence"]
    assert evidence["previousCaptureId"] == first["captureId"]
    assert evidence["presentationTimestampMs"] > evidence["previousPresentationTimestampMs"]
    assert evidence["identicalToPrevious"] is False


def test_a_frozen_stream_fails_as_stale_not_as_a_new_image(rig: Rig) -> None:
    first = rig.call(
        "capture", {"requestId": "f1", "captureProfile": "strict", "timeoutMs": 20_000}, "frozen"
    )
    # Nothing to compare with yet: the first frame of a camera is not judged stale.
    assert "image" in first
    assert first["freshness"]["verdict"] in ("unknown", "fresh")
    second = rig.call("capture", {"requestId": "f2", "captureProfile": "strict"}, "frozen")
    assert "image" not in second
    assert second["failure"]["code"] == "STALE_FRAME"
    fresh = second["freshness"]
    assert (fresh["verdict"], fresh["method"]) == ("stale", "content-hash")
    evidence = fresh["evidence"]
    # The transport moved on (new timestamps), the picture did not.
    assert evidence["presentationTimestampMs"] > evidence["previousPresentationTimestampMs"]
    assert evidence["identicalToPrevious"] is True
    assert evidence["contentSha256"] == first["freshness"]["evidence"]["contentSha256"]
    topic, _ = rig.announced(second["captureId"])
    assert topic.endswith("/app/image/failed")
    # Under warn the same frame is stored, and says it is stale.
    third = rig.call("capture", {"requestId": "f3"}, "frozen")
    assert "image" in third
    assert third["freshness"]["policy"] == "warn"
    assert third["freshness"]["verdict"] == "stale"
