"""The issue's crash test: 300 captures submitted while the adapter process is killed with
SIGKILL at random moments and restarted. Afterwards every accepted captureId is terminal,
every SUCCEEDED image exists with its recorded SHA-256, every installed image belongs to a
SUCCEEDED capture, no temporary file remains, and a retry of any requestId returns the
original outcome or PREVIOUS_OUTCOME_UNKNOWN."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.camera.conftest import sim
from tests.support.adapter import framework_sections, inbox_answers
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until
from unskit.camera.jobs import NON_TERMINAL, TERMINAL
from unskit.commands import CommandClient, reply_body
from unskit.commands.codes import failure_code
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.errors import MessagingError
from unskit.messaging import MessagingClient

TOTAL = 300
CAMERAS = ("cam-a", "cam-b", "cam-c")


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_committed(
    broker: Mosquitto, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"crash test seed {seed}")
    output = tmp_path / "images"
    document = {
        "component": {
            "cameras": [sim(name, width=640, height=480, latencyMs=5) for name in CAMERAS],
            "limits": {"maxQueuedCapturesPerCamera": 200, "maxPendingCaptures": 600},
            "storage": {
                "outputRoot": str(output),
                "outputMinFreeBytes": 0,
                "stateMinFreeBytes": 0,
                "fsync": False,
            },
        },
        **framework_sections(broker.plain_port, tmp_path),
    }
    document["logging"] = {"level": "WARNING"}
    config = tmp_path / "camera.json"
    config.write_text(json.dumps(document))
    messaging = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(
                host="127.0.0.1", port=broker.plain_port, client_id=f"t-{uuid.uuid4().hex}"
            ),
            request_timeout_seconds=30,
        ),
        persistent_session=False,
    ).start()
    client = CommandClient(messaging, "camera-adapter", "gw", root=document["topic"]["root"])
    args = ["-c", str(config), "-t", "gw"]
    requests = [(f"c-{i}", CAMERAS[i % len(CAMERAS)]) for i in range(TOTAL)]
    answered: dict[str, dict[str, Any]] = {}
    captured: list[str] = []
    messaging_ready = messaging.wait_connected(10)
    assert messaging_ready
    messaging.subscribe(
        f"{document['topic']['root']}/+/camera-adapter/+/app/image/captured",
        lambda _topic, message: captured.append(message.body["captureId"]),
    )

    def submit(request_id: str, camera: str) -> Any:
        return client.send("capture-submit", {"requestId": request_id}, instance=camera, timeout=20)

    def settle(future: Any) -> dict[str, Any] | None:
        """The acceptance, or None when the kill came first (no reply, or a refusal)."""
        try:
            reply = future.get()
        except MessagingError:
            return None
        return None if failure_code(reply.body) is not None else reply_body(reply)

    next_index = 0
    rounds = 0
    try:
        wait_until(messaging.connected, 10, "the test client")
        while next_index < TOTAL:
            rounds += 1
            log = tmp_path / f"run-{rounds}.log"
            with component_process("camera-adapter", log, *args) as process:
                wait_until(lambda: inbox_answers(client), 60, f"run {rounds}'s inbox")
                # Kill once a random number of this run's captures have been announced,
                # with more accepted, queued and in flight, and requests still unanswered.
                batch = requests[next_index : next_index + rng.randint(40, 90)]
                kill_after = rng.randint(1, max(1, len(batch) - 10))
                before = len(captured)
                futures = [(request_id, submit(request_id, camera)) for request_id, camera in batch]
                wait_until(
                    lambda b=before, k=kill_after: len(captured) - b >= k,
                    60,
                    f"{kill_after} captures",
                )
                process.send_signal(signal.SIGKILL)
                process.wait(10)
            for request_id, future in futures:
                outcome = settle(future)
                if outcome is not None:
                    answered[request_id] = outcome
            next_index += len(batch)

        # A last run, left alive: recovery, then every retry.
        log = tmp_path / "final.log"
        with component_process("camera-adapter", log, *args) as process:
            wait_until(lambda: inbox_answers(client), 60, "the final run's inbox")
            outcomes: dict[str, dict[str, Any]] = {}
            unknown = 0
            for request_id, camera in requests:
                reply = submit(request_id, camera).get()
                if failure_code(reply.body) is not None:
                    assert reply.body["errorCode"] == "PREVIOUS_OUTCOME_UNKNOWN", reply.body
                    assert request_id not in answered, "a settled outcome must replay"
                    unknown += 1
                    continue
                outcome = reply_body(reply)
                if request_id in answered:
                    assert outcome == answered[request_id], request_id
                outcomes[request_id] = outcome

            accepted = {o["captureId"] for o in outcomes.values()}
            accepted |= {o["captureId"] for o in answered.values()}

            def settled() -> bool:
                jobs = client.call(
                    "capture-status", {"states": [s.value for s in NON_TERMINAL], "limit": 1000}
                )["jobs"]
                return not jobs

            wait_until(settled, 60, "every capture terminal")
            succeeded: dict[str, dict[str, Any]] = {}
            for capture_id in accepted:
                status = client.call("capture-status", {"captureId": capture_id})
                assert status["state"] in {s.value for s in TERMINAL}, status
                if status["state"] == "SUCCEEDED":
                    succeeded[capture_id] = status["result"]["image"]
            for image in succeeded.values():
                path = Path(image["absolutePath"])
                assert hashlib.sha256(path.read_bytes()).hexdigest() == image["sha256"]
            installed = {p.stem for p in output.glob("*/*/*.jpg")}
            all_succeeded = {
                job["captureId"]
                for job in client.call("capture-status", {"states": ["SUCCEEDED"], "limit": 1000})[
                    "jobs"
                ]
            }
            assert installed == all_succeeded
            assert list((output / ".partial").iterdir()) == []
            interrupted = client.call("capture-status", {"states": ["INTERRUPTED"], "limit": 1000})[
                "jobs"
            ]
            print(
                f"{rounds} kills, {len(accepted)} accepted, {len(succeeded)} succeeded, "
                f"{len(interrupted)} interrupted, {unknown} unknown outcomes"
            )
            assert rounds >= 3
            assert succeeded
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
    finally:
        messaging.close(1)
