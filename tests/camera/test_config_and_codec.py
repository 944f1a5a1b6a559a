"""The camera-adapter section's rules and defaults, and the codec (JPEG, thumbnails, hashing)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unskit.camera.codec import Frame, encode_jpeg, jpeg_dimensions, thumbnail, write_hashed
from unskit.camera.component import CameraAdapter
from unskit.camera.config import parse_settings
from unskit.config import ConfigLoader
from unskit.errors import ConfigError


def load(tmp_path: Path, component: dict[str, Any]) -> Any:
    path = tmp_path / "camera.json"
    path.write_text(
        json.dumps(
            {
                "component": component,
                "messaging": {"local": {"host": "127.0.0.1", "port": 1883}},
                "commands": {"stateDir": str(tmp_path / "state")},
            }
        )
    )
    loader = ConfigLoader(
        path, thing="gw", component_schema=CameraAdapter.schema, default_component="camera-adapter"
    )
    return loader.load()


def test_defaults(tmp_path: Path) -> None:
    settings = parse_settings(load(tmp_path, {"cameras": [{"instance": "a", "backend": "sim"}]}))
    assert settings.job_terminal_ms == 30_000
    assert settings.capture_lifecycle_events is False
    assert settings.report_unconfigured is False
    assert (settings.limits.max_metadata_bytes, settings.limits.max_cameras_per_group) == (8192, 16)
    assert settings.storage.state_root == tmp_path / "state" / "gw" / "camera-adapter"
    assert settings.storage.output_root == settings.storage.state_root / "images"
    assert settings.storage.fsync is True
    assert set(settings.profiles) == {"default"}
    camera = settings.cameras["a"]
    assert (camera.enabled, camera.default_capture_profile) == (True, "default")
    assert camera.max_frame_age_ms == 1000


@pytest.mark.parametrize(("value", "accepted"), [(0, True), (86_400_000, True), (-1, False),
                                                 (86_400_001, False), (1.5, False)])  # fmt: skip
def test_max_frame_age_ms(tmp_path: Path, value: Any, accepted: bool) -> None:
    camera = {"instance": "a", "backend": "sim", "maxFrameAgeMs": value}
    if accepted:
        settings = parse_settings(load(tmp_path, {"cameras": [camera]}))
        assert settings.cameras["a"].max_frame_age_ms == value
        return
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, {"cameras": [camera]})
    assert [issue.path for issue in caught.value.issues] == ["$.component.cameras[0].maxFrameAgeMs"]


@pytest.mark.parametrize(
    ("component", "where"),
    [
        (
            {"cameras": [{"instance": "a", "backend": "sim"}, {"instance": "a", "backend": "sim"}]},
            "$.component.cameras[1].instance",
        ),
        (
            {"cameras": [{"instance": "a", "backend": "sim", "defaultCaptureProfile": "x"}]},
            "$.component.cameras[0].defaultCaptureProfile",
        ),
        (
            {
                "cameras": [
                    {
                        "instance": "a",
                        "backend": "sim",
                        "schedules": [{"id": "s", "intervalMs": 1000, "captureProfile": "x"}],
                    }
                ]
            },
            "$.component.cameras[0].schedules[0].captureProfile",
        ),
        (
            {"cameras": [{"instance": "a", "backend": "snapshot-uri"}]},
            "$.component.cameras[0].connection.uri",
        ),
    ],
    ids=["duplicate instance", "unknown default profile", "unknown schedule profile", "no uri"],
)
def test_rules_the_schema_cannot_say(tmp_path: Path, component: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(load(tmp_path, component))
    assert [issue.path for issue in caught.value.issues] == [where]


@pytest.mark.parametrize(
    "component",
    [
        {"cameras": []},
        {"cameras": [{"instance": "a/b", "backend": "sim"}]},
        {"cameras": [{"instance": "a", "backend": "usb"}]},
        {"cameras": [{"instance": "a", "backend": "sim"}], "limits": {"maxCamerasPerGroup": 1}},
        {
            "cameras": [{"instance": "a", "backend": "sim"}],
            "global": {"timeouts": {"jobTerminalMs": 5}},
        },
        {
            "cameras": [{"instance": "a", "backend": "sim"}],
            "captureProfiles": {"p": {"thumbnail": {"size": "huge"}}},
        },
        {"cameras": [{"instance": "a", "backend": "sim", "connection": {"password": {"x": 1}}}]},
    ],
    ids=["no cameras", "bad token", "unknown backend", "group cap", "timeout", "thumb", "secret"],
)
def test_the_schema_refuses(tmp_path: Path, component: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        load(tmp_path, component)


@pytest.mark.integration
def test_unskit_validate_reports_a_rule_the_schema_cannot_say(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "component": {
                    "cameras": [
                        {"instance": "a", "backend": "sim"},
                        {"instance": "a", "backend": "sim"},
                    ]
                },
                "messaging": {"local": {"host": "embedded"}},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "unskit.cli", "validate", "-c", str(path), "-t", "gw",
         "--component", "camera-adapter"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "cameras[1].instance" in result.stdout + result.stderr


def frame(width: int, height: int) -> Frame:
    rng = np.random.default_rng(7)
    return Frame(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), "bgr8", "raw")


@pytest.mark.parametrize(
    ("size", "shape", "expected"),
    [
        ("small", (1920, 1080), (160, 90)),
        ("medium", (1920, 1080), (320, 180)),
        ("large", (1920, 1080), (640, 360)),
        ("small", (480, 640), (120, 160)),
        ("large", (100, 50), (100, 50)),
    ],
)
def test_thumbnail_long_edge_and_aspect(
    size: str, shape: tuple[int, int], expected: tuple[int, int]
) -> None:
    thumb = thumbnail(frame(*shape), size)
    assert (thumb.width, thumb.height) == expected
    assert jpeg_dimensions(thumb.data) == expected
    body = thumb.to_body()
    assert body["bytes"] == len(thumb.data)
    assert body["encoding"] == "jpeg"


def test_thumbnail_is_an_area_average() -> None:
    # A 2x2 checkerboard of black and white averages to mid-grey; point sampling would not.
    pixels = np.zeros((640, 640, 3), dtype=np.uint8)
    pixels[::2, ::2] = 255
    pixels[1::2, 1::2] = 255
    thumb = thumbnail(Frame(pixels, "bgr8", "raw"), "small")
    import cv2

    decoded = cv2.imdecode(np.frombuffer(thumb.data, np.uint8), cv2.IMREAD_COLOR)
    assert abs(float(decoded.mean()) - 127.5) < 6


def test_encode_and_write_hashed(tmp_path: Path) -> None:
    data = encode_jpeg(frame(64, 48), 90)
    assert jpeg_dimensions(data) == (64, 48)
    path = tmp_path / "x.jpg"
    assert write_hashed(path, data, fsync=True) == hashlib.sha256(data).hexdigest()
    assert path.read_bytes() == data
    with pytest.raises(FileExistsError):
        write_hashed(path, data, fsync=False)
    assert jpeg_dimensions(b"not a jpeg") is None
