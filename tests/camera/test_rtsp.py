"""The rtsp-frame backend against a GStreamer RTSP server (H.264) the test starts with the
system Python (gst-rtsp-server through python3-gi; FFmpeg cannot serve RTSP to a client)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, Rig
from tests.support.servers import free_port, port_open, wait_until
from tests.support.tiers import server_fixture

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
# A stream that freezes on a line on stdin: the moving ball becomes one still picture while
# the encoder keeps sending (timestamps advance), losslessly, so every decoded frame is then
# the same pixels (what a hung sensor behind a live encoder gives).
sources = []
def configure(factory, media):
    sources.append(media.get_element().get_by_name("src"))
freezing = GstRtspServer.RTSPMediaFactory.new()
freezing.set_shared(True)
freezing.set_launch(
    "( videotestsrc name=src is-live=true pattern=ball"
    " ! video/x-raw,width=320,height=240,framerate=10/1 ! videoconvert"
    " ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10 pass=quant quantizer=0"
    " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)
freezing.connect("media-configure", configure)
server.get_mount_points().add_factory("/freezing", freezing)
# A stream whose pipeline stops sending on "stall" (a valve drops every picture before the
# encoder; the RTSP session and its socket stay up) and sends again on "flow".
valves = []
def configure_stalling(factory, media):
    valves.append(media.get_element().get_by_name("valve"))
stalling = GstRtspServer.RTSPMediaFactory.new()
stalling.set_shared(True)
stalling.set_launch(
    "( videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=10/1"
    " ! valve name=valve drop=false ! videoconvert"
    " ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10"
    " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)
stalling.connect("media-configure", configure_stalling)
server.get_mount_points().add_factory("/stalling", stalling)
loop = GLib.MainLoop()
def on_stdin(channel, condition):
    line = sys.stdin.readline()
    if not line:
        loop.quit()
        return False
    command = line.strip()
    if command in ("stall", "flow"):
        for valve in valves:
            valve.set_property("drop", command == "stall")
        print(f"{command} {len(valves)}", flush=True)
        return True
    for src in sources:
        Gst.util_set_object_arg(src, "pattern", "solid-color")
    print(f"frozen {len(sources)}", flush=True)
    return True
GLib.io_add_watch(
    GLib.IOChannel.unix_new(0), GLib.PRIORITY_DEFAULT, GLib.IO_IN | GLib.IO_HUP, on_stdin
)
server.attach(None)
loop.run()
"""


def _gst_rtsp_available() -> bool:
    probe = (
        "import gi; gi.require_version('GstRtspServer', '1.0');"
        "from gi.repository import GstRtspServer"
    )
    result = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True, check=False)
    return result.returncode == 0


class RtspServer:
    """The GStreamer RTSP server process: /cam (a moving ball), /freezing and /stalling."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port

    def url(self, mount: str) -> str:
        return f"rtsp://127.0.0.1:{self.port}{mount}"

    def _tell(self, command: str) -> str:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(f"{command}\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], 10)
        assert ready, f"the RTSP server did not acknowledge {command!r}"
        return self.process.stdout.readline().strip()

    def freeze(self) -> str:
        """Freezes /freezing; the server's acknowledgement (how many streams froze)."""
        return self._tell("freeze")

    def stall(self) -> str:
        """Stops /stalling's pipeline sending (the session stays up); the acknowledgement."""
        return self._tell("stall")

    def flow(self) -> str:
        """Lets /stalling send again; the acknowledgement."""
        return self._tell("flow")

    def stopped(self) -> bool:
        """Whether the process is stopped by a signal (state T in /proc)."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def suspend(self) -> None:
        """SIGSTOPs the server (it sends nothing, its sockets stay open); returns once it is."""
        os.kill(self.process.pid, signal.SIGSTOP)
        wait_until(self.stopped, 10, "the RTSP server to stop")

    def resume(self) -> None:
        """SIGCONTs the server; returns once it runs."""
        os.kill(self.process.pid, signal.SIGCONT)
        wait_until(lambda: not self.stopped(), 10, "the RTSP server to continue")


@contextlib.contextmanager
def _serve(folder: Path) -> Iterator[RtspServer]:
    if not _gst_rtsp_available():
        pytest.fail(
            "gst-rtsp-server is not installed: apt-get install gir1.2-gst-rtsp-server-1.0 "
            "gstreamer1.0-plugins-ugly gstreamer1.0-plugins-good gstreamer1.0-plugins-base"
        )
    script = folder / "gst_rtsp.py"
    script.write_text(SERVER)
    port = free_port()
    process = subprocess.Popen(
        ["/usr/bin/python3", str(script), str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_until(lambda: port_open(port), 20, "the RTSP server")
        yield RtspServer(process, port)
    finally:
        process.kill()
        process.wait(5)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def rtsp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RtspServer]:
    with _serve(tmp_path_factory.mktemp("rtsp")) as server:
        yield server


@pytest.fixture
def own_rtsp_server(tmp_path: Path) -> Iterator[RtspServer]:
    """A server of the test's own, that the test may stall or SIGSTOP."""
    with _serve(tmp_path) as server:
        yield server


@server_fixture(scope="module")
def rtsp_url(rtsp_server: RtspServer) -> str:
    return f"rtsp://127.0.0.1:{rtsp_server.port}/cam"


@server_fixture
def rig(harness: CameraHarness, rtsp_url: str) -> Rig:
    return harness.start(
        {
            "cameras": [
                {"instance": "stream", "backend": "rtsp-frame", "connection": {"uri": rtsp_url}},
                {
                    "instance": "freezing",
                    "backend": "rtsp-frame",
                    "connection": {"uri": rtsp_url.replace("/cam", "/freezing")},
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


def test_a_stream_that_freezes_fails_as_stale_not_as_a_new_image(
    rig: Rig, rtsp_server: RtspServer
) -> None:
    strict = {"captureProfile": "strict"}
    rig.call("capture", {"requestId": "f0", "timeoutMs": 20_000, **strict}, "freezing")
    moving = rig.call("capture", {"requestId": "f1", **strict}, "freezing")
    assert "image" in moving
    assert (moving["freshness"]["verdict"], moving["freshness"]["method"]) == (
        "fresh",
        "presentation-timestamp",
    )
    assert rtsp_server.freeze() == "frozen 1"
    # Frames encoded before the freeze are still on their way: under warn, capture until one
    # is stale (then the stream is frozen); none of them is a failure.
    seen: list[dict[str, Any]] = []

    def frozen() -> bool:
        body = rig.call("capture", {"requestId": f"w{len(seen)}"}, "freezing")
        assert "image" in body
        seen.append(body)
        return bool(body["freshness"]["verdict"] == "stale")

    wait_until(frozen, 20, "the stream to freeze", interval=0.05)
    assert seen[-1]["freshness"]["policy"] == "warn"
    stale = rig.call("capture", {"requestId": "f2", **strict}, "freezing")
    assert "image" not in stale
    assert stale["failure"]["code"] == "STALE_FRAME"
    assert stale["failure"]["stage"] == "acquisition"
    fresh = stale["freshness"]
    assert (fresh["policy"], fresh["verdict"], fresh["method"]) == (
        "require",
        "stale",
        "content-hash",
    )
    evidence = fresh["evidence"]
    # The transport moved on (new timestamps), the picture did not.
    assert evidence["presentationTimestampMs"] > evidence["previousPresentationTimestampMs"]
    assert evidence["identicalToPrevious"] is True
    assert evidence["previousCaptureId"] == seen[-1]["captureId"]
    assert evidence["contentSha256"] == seen[-1]["freshness"]["evidence"]["contentSha256"]
    topic, _ = rig.announced(stale["captureId"])
    assert topic.endswith("/app/image/failed")


# How a stream stalls: the server process SIGSTOPped (nothing is sent, the connection stays
# open), or its pipeline stopped sending while the process answers and the socket stays up.
# Either way FFmpeg's decoder still holds the last frames it received and hands them out at
# its read timeouts, seconds later: frames older than any capture asked for in between.
STALLS = {
    "server-stopped": ("/cam", RtspServer.suspend, RtspServer.resume),
    "pipeline-stalled": ("/stalling", RtspServer.stall, RtspServer.flow),
}
#: The test cameras' maxFrameAgeMs.
MAX_AGE_MS = 500


def _stall_rig(harness: CameraHarness, server: RtspServer, how: str) -> Rig:
    mount = STALLS[how][0]
    camera = {"instance": "cam", "backend": "rtsp-frame", "connection": {"uri": server.url(mount)}}
    return harness.start(
        {
            "cameras": [{**camera, "maxFrameAgeMs": MAX_AGE_MS}],
            "captureProfiles": {"strict": {"freshness": "require"}},
        }
    )


def _stall(server: RtspServer, how: str) -> None:
    """Stalls the stream, then lets the stall outlast maxFrameAgeMs: every frame the server
    sent before it is then too old for a capture requested now."""
    STALLS[how][1](server)
    stalled = time.monotonic()
    # The scenario's own time passing, not a synchronisation: a capture 3x maxFrameAgeMs
    # into the stall.
    wait_until(lambda: time.monotonic() - stalled >= 3 * MAX_AGE_MS / 1000, 10, "the stall")


def _warm(rig: Rig) -> dict[str, Any]:
    body = rig.call(
        "capture", {"requestId": "warm", "captureProfile": "strict", "timeoutMs": 20_000}, "cam"
    )
    assert "image" in body, body.get("failure")
    assert 0 <= body["frameAgeMs"] <= MAX_AGE_MS
    assert body["freshness"]["evidence"]["frameAgeMs"] == body["frameAgeMs"]
    return body


@pytest.mark.slow
@pytest.mark.parametrize("how", list(STALLS))
def test_a_frame_from_before_a_stall_is_stale_not_a_new_image(
    harness: CameraHarness, own_rtsp_server: RtspServer, how: str
) -> None:
    rig = _stall_rig(harness, own_rtsp_server, how)
    _warm(rig)
    _stall(own_rtsp_server, how)
    # The decoder hands out a frame from before the stall at its read timeout (5 s), within
    # this capture's time; `require` refuses it and asks again until the deadline.
    timeout = 7_000
    body = rig.call(
        "capture", {"requestId": "late", "captureProfile": "strict", "timeoutMs": timeout}, "cam"
    )
    assert "image" not in body
    failure = body["failure"]
    assert (failure["code"], failure["stage"]) == ("STALE_FRAME", "acquisition")
    assert body["frameAgeMs"] > MAX_AGE_MS
    assert f"{body['frameAgeMs']} ms before the request" in failure["message"]
    fresh = body["freshness"]
    assert (fresh["policy"], fresh["verdict"], fresh["method"]) == ("require", "stale", "frame-age")
    assert fresh["evidence"]["frameAgeMs"] == body["frameAgeMs"]
    assert fresh["evidence"]["maxFrameAgeMs"] == MAX_AGE_MS
    assert body["frame"]["width"] == 320
    assert body["durationsMs"]["total"] >= timeout
    topic, message = rig.announced(body["captureId"])
    assert topic.endswith("/app/image/failed")
    assert message.body["frameAgeMs"] == body["frameAgeMs"]
    assert rig.status(body["captureId"])["errorCode"] == "STALE_FRAME"


@pytest.mark.slow
@pytest.mark.parametrize("how", list(STALLS))
def test_require_waits_through_a_stall_for_a_fresh_frame(
    harness: CameraHarness, own_rtsp_server: RtspServer, how: str
) -> None:
    rig = _stall_rig(harness, own_rtsp_server, how)
    warm = _warm(rig)
    _stall(own_rtsp_server, how)
    submitted = rig.call(
        "capture-submit",
        {"requestId": "waiting", "captureProfile": "strict", "timeoutMs": 60_000},
        "cam",
    )
    stale = rig.runtime.metrics.counter("captures", "staleFrames", {"camera": "cam"})
    # The decoder's frame from before the stall came and was refused...
    wait_until(lambda: stale.total >= 1, 20, "a frame from before the stall to be refused")
    assert rig.status(submitted["captureId"])["state"] == "ACQUIRING"
    # ... and the capture still waits: once the stream moves again, a new frame is taken.
    STALLS[how][2](own_rtsp_server)
    body = rig.terminal(submitted["captureId"], timeout=60)["result"]
    assert "image" in body, body.get("failure")
    assert 0 <= body["frameAgeMs"] <= MAX_AGE_MS
    fresh = body["freshness"]
    assert (fresh["verdict"], fresh["evidence"]["frameAgeMs"]) == ("fresh", body["frameAgeMs"])
    # The refused frame did not become the baseline: the warm capture still is.
    assert fresh["evidence"]["previousCaptureId"] == warm["captureId"]
    assert stale.total == 1
