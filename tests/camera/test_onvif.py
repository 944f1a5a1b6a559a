"""The onvif backend against the ONVIF test device (tests/support/onvif_device.py: SOAP over
loopback HTTP, requests validated against the ONVIF XSD that onvif-zeep-async ships, the
UsernameToken digest checked), through the camera adapter on a real Mosquitto: captures from
the snapshot URI, sb/ptz and sb/ptz-presets, capabilities; and every way a device can fail,
each giving DEVICE_UNAVAILABLE or BACKEND_ERROR without holding up another camera."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.camera.conftest import CameraHarness, Rig
from tests.camera.test_config_and_codec import load
from tests.support.onvif_device import PASSWORD, USER, OnvifDevice
from tests.support.servers import free_port, wait_until
from unskit.camera.backends import missing_extra
from unskit.camera.config import parse_settings
from unskit.camera.discovery import parse_address
from unskit.config.vault import Vault, VaultKey
from unskit.errors import CommandError, ConfigError


def rid() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def onvif_camera(instance: str, device: OnvifDevice, **connection: Any) -> dict[str, Any]:
    return {
        "instance": instance,
        "backend": "onvif",
        "connection": {"uri": device.uri, "username": USER, "password": PASSWORD, **connection},
        "ptz": {"enabled": True, "allowPresetMutation": True, "maximumContinuousMoveMs": 10_000},
    }


@pytest.fixture
def device() -> Iterator[OnvifDevice]:
    running = OnvifDevice()
    yield running
    running.close()


@pytest.fixture
def other() -> Iterator[OnvifDevice]:
    running = OnvifDevice(vendor="other-vendor", model="other-model", ptz=False)
    yield running
    running.close()


def ptz(rig: Rig, instance: str, **body: Any) -> dict[str, Any]:
    if body.get("operation") != "status":
        body = {"requestId": rid(), **body}
    return rig.call("ptz", body, instance)


def presets(rig: Rig, instance: str, **body: Any) -> dict[str, Any]:
    if body.get("operation") != "list":
        body = {"requestId": rid(), **body}
    return rig.call("ptz-presets", body, instance)


def capture(rig: Rig, instance: str, timeout_ms: int = 10_000) -> dict[str, Any]:
    return rig.call("capture", {"requestId": rid(), "timeoutMs": timeout_ms}, instance)


def test_capture_ptz_presets_and_capabilities(harness: CameraHarness, device: OnvifDevice) -> None:
    rig = harness.start({"cameras": [onvif_camera("cam", device)]})
    body = capture(rig, "cam")
    assert "image" in body, body
    assert body["image"]["bytes"] > 0
    assert body["captureMode"] == "snapshot-uri"
    assert body["camera"] == {
        "backend": "onvif",
        "vendor": "unskit-test",
        "model": "onvif-device",
        "firmware": "1.0-test",
        "serial": f"SN{device.port}",
    }
    assert body["backendMetadata"]["onvifProfile"] == "main"
    assert device.snapshots >= 1

    listed = rig.call("list", {"includeCapabilities": True})["cameras"][0]
    capabilities = listed["capabilities"]
    assert capabilities["vendor"] == "unskit-test"
    assert capabilities["model"] == "onvif-device"
    assert capabilities["captureModes"] == ["snapshot-uri"]
    assert capabilities["ptz"] is capabilities["presets"] is capabilities["presetMutation"] is True
    assert capabilities["streamUri"] == f"rtsp://127.0.0.1:{device.port}/main"
    assert capabilities["warnings"] == []

    assert ptz(rig, "cam", operation="absolute", position={"pan": 0.5, "zoom": 0.25})
    assert (device.ptz.pan, device.ptz.tilt, device.ptz.zoom) == (0.5, 0.0, 0.25)
    # A lone tilt keeps pan where it is (PanTilt carries both in ONVIF).
    ptz(rig, "cam", operation="relative", translation={"tilt": -0.5})
    status = ptz(rig, "cam", operation="status")
    assert status["position"] == {"pan": 0.5, "tilt": -0.5, "zoom": 0.25}
    assert status["moving"] is False
    assert status["available"] is True

    reply = ptz(rig, "cam", operation="continuous", velocity={"pan": 0.5}, timeoutMs=200)
    assert reply["stopDeadline"] is not None
    assert ptz(rig, "cam", operation="status")["moving"] is True
    # The adapter's armed stop reaches the device.
    wait_until(lambda: ptz(rig, "cam", operation="status")["moving"] is False, 10, "armed stop")
    assert "Stop" in device.calls

    ptz(rig, "cam", operation="continuous", velocity={"zoom": 0.2}, timeoutMs=10_000)
    # Known to move from the command the adapter sent (admission does not ask the camera).
    assert rig.error("capture-submit", {"requestId": rid()}, "cam") == "CAMERA_MOVING"
    ptz(rig, "cam", operation="stop", axes=["zoom"])
    assert device.ptz.moving_zoom is False
    ptz(rig, "cam", operation="home")
    assert (device.ptz.pan, device.ptz.tilt, device.ptz.zoom) == (0.0, 0.0, 0.0)

    listed_presets = presets(rig, "cam", operation="list", limit=1)
    assert listed_presets["presets"] == [{"token": "tok-1", "name": "door"}]
    rest = presets(rig, "cam", operation="list", cursor=listed_presets["nextCursor"])
    assert rest == {"presets": [{"token": "tok-2", "name": "gate"}], "nextCursor": None}
    ptz(rig, "cam", operation="absolute", position={"pan": -0.25, "tilt": 0.75, "zoom": 1.0})
    token = presets(rig, "cam", operation="set", name="dock")["token"]
    assert token == "tok-3"
    assert device.ptz.presets[token][0] == "dock"
    ptz(rig, "cam", operation="home")
    assert presets(rig, "cam", operation="goto", token=token)["state"] == "COMMANDED"
    assert (device.ptz.pan, device.ptz.tilt, device.ptz.zoom) == (-0.25, 0.75, 1.0)
    assert presets(rig, "cam", operation="remove", token=token) == {
        "operation": "remove",
        "removed": True,
    }
    assert token not in device.ptz.presets
    # A token the camera does not hold: its NoToken fault becomes BAD_ARGS.
    assert (
        rig.error("ptz-presets", {"operation": "goto", "requestId": rid(), "token": token}, "cam")
        == "BAD_ARGS"
    )

    # Every request the backend sent was valid against the ONVIF schema, every one but the
    # credential-free clock and identity carried a digest the device accepted.
    assert device.invalid == []
    assert device.errors == []
    assert device.refused == 0
    assert {"GetSystemDateAndTime", "GetCapabilities", "GetProfiles", "GetSnapshotUri"} <= set(
        device.calls
    )


def test_a_device_without_ptz_offers_none(harness: CameraHarness, other: OnvifDevice) -> None:
    rig = harness.start({"cameras": [onvif_camera("plain", other)]})
    assert "image" in capture(rig, "plain")
    capabilities = rig.call("status", {}, "plain")["capabilities"]
    assert capabilities["ptz"] is False
    assert capabilities["vendor"] == "other-vendor"
    code = rig.error("ptz", {"operation": "status"}, "plain")
    assert code == "UNSUPPORTED_CAPABILITY"


@pytest.mark.parametrize(
    ("mode", "password", "code", "words"),
    [
        ("ok", "not-the-password", "BACKEND_ERROR", "refused the credentials"),
        ("fault", PASSWORD, "BACKEND_ERROR", "SOAP fault"),
        ("bad-xml", PASSWORD, "BACKEND_ERROR", "malformed XML"),
        ("silent", PASSWORD, "DEVICE_UNAVAILABLE", "did not answer"),
    ],
)
def test_a_failing_device_fails_alone(
    harness: CameraHarness,
    device: OnvifDevice,
    other: OnvifDevice,
    mode: str,
    password: str,
    code: str,
    words: str,
) -> None:
    device.mode = mode
    bad = onvif_camera("bad", device, password=password, soapTimeoutMs=1000, retryAfterMs=60_000)
    rig = harness.start({"cameras": [bad, onvif_camera("good", other)]})

    failed = capture(rig, "bad")
    assert failed["failure"]["code"] == code, failed
    assert words in failed["failure"]["message"]
    assert device.uri in failed["failure"]["message"]
    assert PASSWORD not in failed["failure"]["message"]
    with pytest.raises(CommandError) as refused:
        presets(rig, "bad", operation="list")
    assert refused.value.code == code
    assert words in refused.value.message
    # The head's status reports the device unavailable rather than failing.
    status = ptz(rig, "bad", operation="status")
    assert status["available"] is False
    assert status["position"] is None
    warnings = rig.call("status", {}, "bad")["capabilities"]["warnings"]
    assert any(words in warning for warning in warnings), warnings

    # A move the device refused does not leave the camera "moving" for admission.
    move = {"requestId": rid(), "operation": "continuous", "velocity": {"pan": 0.5}}
    assert rig.error("ptz", {**move, "timeoutMs": 1000}, "bad") == code
    assert capture(rig, "bad")["failure"]["code"] == code

    if mode == "silent":
        # Not asked again within retryAfterMs: the next command fails at once, saying so,
        # until sb/reconnect asks again.
        calls = device.posts
        with pytest.raises(CommandError) as paused:
            presets(rig, "bad", operation="list")
        assert "not asked again" in paused.value.message
        assert device.posts == calls
        rig.call("reconnect", {"requestId": rid()}, "bad")
        with pytest.raises(CommandError) as asked:
            presets(rig, "bad", operation="list")
        assert "not asked again" not in asked.value.message
        assert device.posts == calls + 1

    # The other camera is not held up by the failing one.
    assert "image" in capture(rig, "good")
    assert device.invalid == []
    assert device.errors == []


def test_a_silent_snapshot_does_not_hold_up_another_camera(
    harness: CameraHarness, device: OnvifDevice, other: OnvifDevice
) -> None:
    rig = harness.start({"cameras": [onvif_camera("slow", device), onvif_camera("good", other)]})
    assert "image" in capture(rig, "slow")
    device.mode = "silent"  # the link is up; the next snapshot GET is never answered
    stuck = rig.call("capture-submit", {"requestId": rid(), "timeoutMs": 8000}, "slow")
    assert "image" in capture(rig, "good")
    early = rig.status(stuck["captureId"])
    assert early["terminalAtMs"] is None, early
    ended = rig.terminal(stuck["captureId"], timeout=30)
    assert ended["state"] == "FAILED"
    assert ended["errorCode"] in (
        "CAPTURE_TIMEOUT",
        "DEVICE_UNAVAILABLE",
    )


def test_the_onvif_extra_missing_is_a_clear_start_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_extra("onvif") is None
    monkeypatch.setitem(sys.modules, "zeep", None)
    message = missing_extra("onvif")
    assert message is not None
    assert "pip install 'unskit[onvif]'" in message
    assert "'zeep'" in message
    assert missing_extra("sim") is None


def test_the_start_refuses_onvif_without_its_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "zeep", None)
    component = {
        "cameras": [{"instance": "a", "backend": "onvif", "connection": {"uri": "http://x/"}}],
        "discovery": {"enabled": True},
    }
    with pytest.raises(ConfigError) as caught:
        parse_settings(load(tmp_path, component))
    issues = {issue.path: issue.message for issue in caught.value.issues}
    assert set(issues) == {"$.component.cameras[0].backend", "$.component.discovery.enabled"}
    assert all("pip install 'unskit[onvif]'" in message for message in issues.values())


def test_onvif_needs_a_uri_and_discovery_keys_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(load(tmp_path, {"cameras": [{"instance": "a", "backend": "onvif"}]}))
    assert [issue.path for issue in caught.value.issues] == [
        "$.component.cameras[0].connection.uri"
    ]
    bad = {
        "cameras": [{"instance": "a", "backend": "sim"}],
        "discovery": {"probeAddresses": ["a b"]},
    }
    with pytest.raises(ConfigError):
        parse_settings(load(tmp_path, bad))
    nothing = {
        "cameras": [{"instance": "a", "backend": "sim"}],
        "discovery": {"enabled": True, "multicast": False},
    }
    with pytest.raises(ConfigError) as caught:
        parse_settings(load(tmp_path, nothing))
    assert [issue.path for issue in caught.value.issues] == ["$.component.discovery.probeAddresses"]
    good = {
        "cameras": [{"instance": "a", "backend": "sim"}],
        "discovery": {"multicast": False, "probeAddresses": ["10.0.0.5", "[::1]:3702", "h:1"]},
    }
    settings = parse_settings(load(tmp_path, good))
    assert settings.discovery_multicast is False
    assert settings.discovery_addresses == ("10.0.0.5", "[::1]:3702", "h:1")
    assert [parse_address(a) for a in settings.discovery_addresses] == [
        ("10.0.0.5", 3702),
        ("::1", 3702),
        ("h", 1),
    ]


def test_secret_credentials_and_a_device_that_is_gone(
    harness: CameraHarness, device: OnvifDevice, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = VaultKey.generate()
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    vault_path = tmp_path / "vault.json"
    Vault(vault_path, key).put("onvif", {"username": USER, "password": PASSWORD})
    vaulted = onvif_camera("vaulted", device)
    vaulted["connection"].update(
        username={"$secret": "onvif", "field": "username"},
        password={"$secret": "onvif", "field": "password"},
    )
    gone = {
        "instance": "gone",
        "backend": "onvif",
        # Nothing listens on a port that was free a moment ago.
        "connection": {"uri": f"http://127.0.0.1:{free_port()}/onvif/device_service"},
    }
    component = {"cameras": [vaulted, gone]}
    document = harness.document(
        component, credentials={"vaultPath": str(vault_path), "keyFile": str(key_file)}
    )
    rig = harness.start(component, document)
    assert "image" in capture(rig, "vaulted")
    assert presets(rig, "vaulted", operation="list")["presets"]
    assert device.refused == 0
    failed = capture(rig, "gone")["failure"]
    assert failed["code"] == "DEVICE_UNAVAILABLE"
    assert "cannot be reached" in failed["message"]
    assert PASSWORD not in caplog.text
