"""Requests sent while the camera adapter is down wait in its broker session and are answered
by the next run: real Mosquitto (persistent sessions), real `unskit run camera-adapter`
processes with the sim backend, real SIGTERM."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

from tests.camera.conftest import sim
from tests.support.adapter import Inbox, connected_client, framework_sections, inbox_answers
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, wait_until
from unskit.commands import CommandClient, reply_body

ALL_STATES = [
    "ACCEPTED",
    "QUEUED",
    "ACQUIRING",
    "ENCODING",
    "PERSISTING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
    "INTERRUPTED",
]


def test_requests_sent_while_stopped_are_answered_after_the_restart(
    broker: Mosquitto, tmp_path: Path
) -> None:
    document = {
        "component": {
            "cameras": [sim("cam-1")],
            "storage": {
                "outputRoot": str(tmp_path / "images"),
                "outputMinFreeBytes": 0,
                "stateMinFreeBytes": 0,
            },
        },
        **framework_sections(broker.plain_port, tmp_path),
    }
    # Its own session, so no other test's subscriptions or backlog mix in.
    document["messaging"]["local"]["clientId"] = f"camera-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "camera.json"
    config.write_text(json.dumps(document))
    root = document["topic"]["root"]
    args = ["-c", str(config), "-t", "gw"]
    messaging = connected_client(broker.plain_port, request_timeout_s=60)
    try:
        seen = Inbox()
        messaging.subscribe(f"{root}/#", seen.add, max_concurrency=1)
        client = CommandClient(messaging, "camera-adapter", "gw", root=root)

        with component_process("camera-adapter", tmp_path / "first.log", *args) as first:
            wait_until(lambda: inbox_answers(client), 30, "the first run's inbox")
            first.send_signal(signal.SIGTERM)
            assert first.wait(30) == 0, (tmp_path / "first.log").read_text()[-3000:]

        # Sent while nothing runs: QoS 1, so the broker keeps them for the session.
        describes = [client.send("describe", timeout=60) for _ in range(5)]
        captures = {
            request_id: client.send(
                "capture-submit", {"requestId": request_id}, instance="cam-1", timeout=60
            )
            for request_id in ("while-down-1", "while-down-2")
        }
        assert not any(f.done() for f in [*describes, *captures.values()])

        with component_process("camera-adapter", tmp_path / "second.log", *args) as second:
            everything = [*describes, *captures.values()]
            wait_until(
                lambda: all(f.done() for f in everything), 30, "the queued requests answered"
            )
            for future in describes:
                described = reply_body(future.get(0))
                assert described["component"] == "camera-adapter"
                assert described["instances"] == ["cam-1"]
                assert "sb/capture-submit" in {verb["verb"] for verb in described["verbs"]}
            accepted = {rid: reply_body(f.get(0)) for rid, f in captures.items()}
            capture_ids = {body["captureId"] for body in accepted.values()}
            assert len(capture_ids) == 2, accepted

            def terminal(capture_id: str) -> bool:
                status = client.call("capture-status", {"captureId": capture_id}, timeout=10)
                return status["terminalAtMs"] is not None

            for capture_id in capture_ids:
                wait_until(lambda c=capture_id: terminal(c), 30, f"{capture_id} terminal")
            # Run exactly once: the catalog holds one job per requestId, succeeded ...
            jobs = client.call("capture-status", {"states": ALL_STATES, "limit": 1000})["jobs"]
            assert {job["captureId"] for job in jobs} == capture_ids, jobs
            assert {job["state"] for job in jobs} == {"SUCCEEDED"}, jobs
            for request_id, body in accepted.items():
                by_request = client.call(
                    "capture-status", {"requestId": request_id}, instance="cam-1"
                )
                assert by_request["captureId"] == body["captureId"]

            # ... and each was announced once.
            def announced() -> list[str]:
                with seen.lock:
                    return [
                        m.body["captureId"]
                        for t, m in seen.messages
                        if t.endswith("/cam-1/app/image/captured")
                    ]

            wait_until(lambda: set(announced()) == capture_ids, 10, "both captures announced")
            assert sorted(announced()) == sorted(capture_ids)
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0, (tmp_path / "second.log").read_text()[-3000:]
    finally:
        messaging.close(1)
