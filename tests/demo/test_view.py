"""The live view's lines: one aligned line per envelope, bookkeeping only counted."""

from __future__ import annotations

from typing import Any

from unskit.demo.view import SOURCE_WIDTH, describe, uns_class
from unskit.envelope import Identity, Message, MessageBuilder

ROOT = "uns/gw-01"


def message(name: str, body: Any, component: str, instance: str | None = None) -> Message:
    identity = Identity("site/device", "plant-1/gw-01", component)
    return MessageBuilder(name, "1.0").identity(identity).instance(instance).body(body).build()


def columns(line: str | None) -> list[str]:
    assert line is not None
    stamp, rest = line[:8], line[10:]
    return [stamp, rest[:7].strip(), rest[9 : 9 + SOURCE_WIDTH].strip(), rest[11 + SOURCE_WIDTH :]]


def test_a_signal_update_is_name_equals_value() -> None:
    update = (
        MessageBuilder("SouthboundSignalUpdate", "1.0")
        .identity(Identity("site/device", "plant-1/gw-01", "ethernet-ip-adapter", "press-1"))
        .signal_update("Speed", [{"value": 12.3456}], name="spindle-speed")
        .build()
    )
    line = describe(f"{ROOT}/ethernet-ip-adapter/press-1/data/spindle-speed", update)
    assert columns(line)[1:] == ["signal", "press-1", "spindle-speed = 12.35"]


def test_a_capture_is_its_id_size_and_digest() -> None:
    body = {
        "captureId": "cap_1",
        "cameraId": "cam-top",
        "image": {"bytes": 1234, "sha256": "ab" * 32, "relativePath": "cam-top/d/cap_1.jpg"},
    }
    captured = message("ImageCaptured", body, "camera-adapter", "cam-top")
    line = describe(f"{ROOT}/camera-adapter/cam-top/app/image/captured", captured)
    assert columns(line)[1:] == ["capture", "cam-top", f"cap_1  1234 bytes  sha256 {'ab' * 8}"]


def test_egress_bookkeeping_and_metrics_are_only_counted() -> None:
    topic = f"{ROOT}/file-egress/camera-images/evt/info/file-queued"
    queued = message("Event", {"type": "file-queued", "context": {"file": "a.jpg"}}, "file-egress")
    assert describe(topic, queued) is None
    sidecar = message(
        "Event", {"type": "file-delivered", "context": {"file": "d/a.json"}}, "file-egress"
    )
    assert describe(topic, sidecar) is None
    metric = message("Metrics", {"metrics": []}, "file-egress")
    assert describe(f"{ROOT}/file-egress/metric/egress", metric) is None


def test_a_delivered_image_names_the_file_and_destination() -> None:
    context = {"file": "cam-top/d/cap_1.jpg", "destination": "local"}
    delivered = message("Event", {"type": "file-delivered", "context": context}, "file-egress")
    topic = f"{ROOT}/file-egress/camera-images/evt/info/file-delivered"
    assert columns(describe(topic, delivered))[3] == "delivered cap_1.jpg to local"


def test_the_class_is_found_after_the_component_level() -> None:
    assert uns_class(f"{ROOT}/camera-adapter/cam-top/app/image/captured") == "app"
    assert uns_class(f"{ROOT}/ethernet-ip-adapter/press-1/data/speed") == "data"
    assert uns_class(f"{ROOT}/file-egress/state/heartbeat") == "state"


def test_an_instance_named_like_a_class_is_not_the_class() -> None:
    assert uns_class(f"{ROOT}/file-egress/state/data/x") == "data"
    assert uns_class(f"{ROOT}/ethernet-ip-adapter/data/evt/alarm") == "evt"
    assert uns_class(f"{ROOT}/file-egress/metric/state/heartbeat") == "state"
    # A class word deeper than the layout's class level is a name, not the class.
    assert uns_class(f"{ROOT}/file-egress/sink/other/data") == "other"
