"""What survives: a SIGKILL mid-capture (restart recovery) and a full disk (free-space floors)."""

from __future__ import annotations

import hashlib
import json
import signal
import uuid
from pathlib import Path
from typing import Any

from tests.camera.conftest import CameraHarness, sim
from tests.support.adapter import Inbox, framework_sections, inbox_answers
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until
from unskit.commands import CommandClient
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.errors import CommandError
from unskit.messaging import MessagingClient


def _code(client: CommandClient, verb: str, body: dict[str, Any], instance: str | None) -> str:
    try:
        reply = client.call(verb, body, instance=instance, timeout=20)
    except CommandError as error:
        return error.code
    raise AssertionError(f"sb/{verb} succeeded: {reply}")


def test_sigkill_mid_capture_interrupts_and_retries_are_safe(
    broker: Mosquitto, tmp_path: Path
) -> None:
    output = tmp_path / "images"
    document = {
        "component": {
            "cameras": [
                sim("fast", width=320, height=240),
                sim("slow", width=320, height=240, latencyMs=600_000),
            ],
            "storage": {
                "outputRoot": str(output),
                "outputMinFreeBytes": 0,
                "stateMinFreeBytes": 0,
            },
        },
        **framework_sections(broker.plain_port, tmp_path),
    }
    config = tmp_path / "camera.json"
    config.write_text(json.dumps(document))
    root = document["topic"]["root"]
    messaging = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=broker.plain_port, client_id=f"t-{uuid.uuid4().hex}"
            ),
            request_timeout_seconds=30,
        ),
        persistent_session=False,
    ).start()
    try:
        wait_until(messaging.connected, 10, "the test client")
        seen = Inbox()
        messaging.subscribe(f"{root}/#", seen.add, max_concurrency=1)
        client = CommandClient(messaging, "camera-adapter", "gw", root=root)
        args = ["-c", str(config), "-t", "gw"]

        with component_process("camera-adapter", tmp_path / "first.log", *args) as first:
            wait_until(lambda: inbox_answers(client), 30, "the first run's inbox")
            done = client.call("capture", {"requestId": "done"}, instance="fast", timeout=20)
            submitted = client.call("capture-submit", {"requestId": "sub-1"}, instance="slow")
            queued = client.call("capture-submit", {"requestId": "sub-2"}, instance="slow")
            client.send("capture", {"requestId": "held"}, instance="slow", timeout=60)

            def state(capture_id: str) -> str:
                return str(client.call("capture-status", {"captureId": capture_id})["state"])

            wait_until(lambda: state(submitted["captureId"]) == "ACQUIRING", 10, "in flight")
            held: dict[str, Any] = {}

            def held_found() -> bool:
                try:
                    held.update(
                        client.call("capture-status", {"requestId": "held"}, instance="slow")
                    )
                except CommandError:
                    return False
                return True

            wait_until(held_found, 10, "the deferred capture accepted")
            # A crash while a staged image is being written leaves a temporary file.
            (output / ".partial" / "cap_crashed.jpg").write_bytes(b"half an image")
            first.send_signal(signal.SIGKILL)
            first.wait(10)

        interrupted = [submitted["captureId"], queued["captureId"], held["captureId"]]
        with component_process("camera-adapter", tmp_path / "second.log", *args) as second:
            wait_until(lambda: inbox_answers(client), 30, "the second run's inbox")
            for capture_id in interrupted:
                status = client.call("capture-status", {"captureId": capture_id})
                assert status["state"] == "INTERRUPTED", status
                assert status["errorCode"] == "PROCESS_INTERRUPTED"
                assert status["terminalAtMs"] is not None
                failure = status["result"]["failure"]
                assert failure["code"] == "PROCESS_INTERRUPTED"
                assert failure["retriable"] is True
                assert "image" not in status["result"]
            stages = {
                c: client.call("capture-status", {"captureId": c})["result"]["failure"]["stage"]
                for c in interrupted
            }
            assert stages[submitted["captureId"]] == "acquisition"
            assert stages[queued["captureId"]] == "queue"
            # Each interrupted capture is announced once, as a failure.
            for capture_id in interrupted:
                wait_until(
                    lambda c=capture_id: any(
                        t.endswith("/slow/app/image/failed") and m.body["captureId"] == c
                        for t, m in seen.messages
                    ),
                    10,
                    f"the interruption of {capture_id} announced",
                )
            # Retries: the settled outcomes replay, the lost one is unknown.
            again = client.call("capture-submit", {"requestId": "sub-1"}, instance="slow")
            assert again == submitted
            assert client.call("capture", {"requestId": "done"}, instance="fast") == done
            assert (
                _code(client, "capture", {"requestId": "held"}, "slow")
                == "PREVIOUS_OUTCOME_UNKNOWN"
            )
            # What was committed before the kill is intact.
            image = Path(done["image"]["absolutePath"])
            assert hashlib.sha256(image.read_bytes()).hexdigest() == done["image"]["sha256"]
            assert client.call("capture-status", {"captureId": done["captureId"]})["result"] == done
            assert list((output / ".partial").iterdir()) == []
            assert client.call("queue-status")["durableInFlight"] == 0
            # The adapter captures again after recovery.
            fresh = client.call("capture", {"requestId": "fresh"}, instance="fast", timeout=20)
            assert "image" in fresh
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0, (tmp_path / "second.log").read_text()
    finally:
        messaging.close(1)


def test_a_full_disk_refuses_new_work_and_keeps_what_was_committed(
    harness: CameraHarness,
) -> None:
    component = {"cameras": [sim("cam-1"), sim("cam-2")]}
    document = harness.document(component)
    rig = harness.start(component, document)
    kept = rig.call("capture", {"requestId": "before"}, "cam-1")
    harness.stop(rig)

    # The same state and output, now below the output root's free-space floor.
    document["component"]["storage"]["outputMinFreeBytes"] = 2**62
    full = harness.start(component, document)
    assert full.error("capture", {"requestId": "after"}, "cam-1") == "STORAGE_PRESSURE"
    assert full.error("capture-submit", {"requestId": "after-2"}, "cam-2") == "STORAGE_PRESSURE"
    group = {"requestId": "after-3", "instances": ["cam-1", "cam-2"]}
    assert full.error("capture-group", group) == "STORAGE_PRESSURE"
    assert full.call("capture-status", {"states": ["ACCEPTED", "QUEUED"]})["jobs"] == []
    alarm = full.runtime.topics.topic("evt", "error", "storage-low")
    wait_until(lambda: full.seen.on(alarm), 10, "the storage-low alarm")
    assert full.seen.on(alarm)[0].body["context"]["reason"].startswith("the output root")
    status = full.status(kept["captureId"])
    assert status["state"] == "SUCCEEDED"
    assert status["result"] == kept
    image = Path(kept["image"]["absolutePath"])
    assert hashlib.sha256(image.read_bytes()).hexdigest() == kept["image"]["sha256"]
    # Refusals of the moment are not remembered: the same requestId runs once there is room.
    harness.stop(full)
    document["component"]["storage"]["outputMinFreeBytes"] = 0
    document["component"]["storage"]["stateMinFreeBytes"] = 2**62
    state_full = harness.start(component, document)
    assert state_full.error("capture", {"requestId": "after"}, "cam-1") == "STORAGE_PRESSURE"
    harness.stop(state_full)
    document["component"]["storage"]["stateMinFreeBytes"] = 0
    recovered = harness.start(component, document)
    assert "image" in recovered.call("capture", {"requestId": "after"}, "cam-1")
    assert not recovered.runtime.events.is_raised("storage-low")


def test_an_unreadable_output_root_is_storage_pressure(
    harness: CameraHarness, tmp_path: Path
) -> None:
    component = {"cameras": [sim("cam-1")]}
    rig = harness.start(component)
    # The output root vanishes (an unmounted volume): new work is refused, not failed later.
    images = rig.output
    moved = tmp_path / "moved-away"
    images.rename(moved)
    try:
        assert rig.error("capture", {"requestId": "x"}) == "STORAGE_PRESSURE"
        assert rig.runtime.events is not None
        assert rig.runtime.events.is_raised("storage-low")
    finally:
        moved.rename(images)
    assert "image" in rig.call("capture", {"requestId": "x"})
    # Room again: the alarm clears (and the clear is published).
    assert not rig.runtime.events.is_raised("storage-low")
    alarm = rig.runtime.topics.topic("evt", "error", "storage-low")
    wait_until(lambda: len(rig.seen.on(alarm)) == 2, 10, "the raise and the clear")
    assert [m.body["state"] for m in rig.seen.on(alarm)] == ["raised", "cleared"]
