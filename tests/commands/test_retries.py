"""`CommandClient(retries=)` and `unskit call --retries`: a request that timed out is sent
again with the same requestId, and the inbox's idempotency record answers it (issue 28)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from tests.commands.conftest import Sample
from tests.support.raw_mqtt import RawRecorder
from tests.support.servers import wait_until
from unskit import cli
from unskit.envelope import Message
from unskit.errors import RequestTimeoutError


@pytest.fixture
def raw(broker):
    recorder = RawRecorder(broker.plain_port)
    yield recorder
    recorder.close()


def requests_on(raw: RawRecorder, topic: str, start: int) -> list[Message]:
    return [Message.from_bytes(p) for t, p in raw.since(start) if t == topic]


def test_a_timed_out_request_is_resent_with_the_same_request_id(start_sample, raw) -> None:
    sample: Sample = start_sample()
    topic = sample.client.topic("set-point", "cam-1")
    body = {"requestId": "retry-1", "value": 5}
    start = len(raw)
    sample.app.set_point_release.clear()  # the first attempt's reply comes too late
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["reply"] = sample.client.call(
                "set-point", body, instance="cam-1", timeout=1.0, retries=3
            )
        except Exception as error:  # reported below
            result["error"] = error

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: len(requests_on(raw, topic, start)) >= 2, 20, "the re-sent request")
    sample.app.set_point_release.set()
    caller.join(30)
    assert not caller.is_alive()
    assert "error" not in result, result.get("error")
    assert result["reply"] == {"instance": "cam-1", "value": 5, "execution": 1}
    assert sample.app.executions["set-point/cam-1"] == 1  # ran once for every attempt
    sent = requests_on(raw, topic, start)
    assert [m.body["requestId"] for m in sent] == ["retry-1"] * len(sent)
    assert len({m.correlation_id for m in sent}) == len(sent)  # each a request of its own
    # The first attempt's reply did arrive, after its deadline: dropped and counted.
    wait_until(lambda: sample.client.messaging.stats().stragglers >= 1, 10, "the late reply")
    # The stored outcome answers the same requestId from now on.
    again = sample.client.call("set-point", body, instance="cam-1", timeout=10)
    assert again == result["reply"]
    assert sample.app.executions["set-point/cam-1"] == 1


def test_retries_exhausted_raise_the_timeout(start_sample, raw) -> None:
    sample: Sample = start_sample()
    topic = sample.client.topic("set-point", "cam-2")
    start = len(raw)
    sample.app.set_point_release.clear()
    try:
        with pytest.raises(RequestTimeoutError):
            sample.client.call(
                "set-point", {"requestId": "r-x", "value": 1}, "cam-2", timeout=0.3, retries=2
            )
    finally:
        sample.app.set_point_release.set()
    wait_until(lambda: len(requests_on(raw, topic, start)) == 3, 10, "three attempts")
    wait_until(lambda: sample.client.messaging.pending_requests() == 0, 10, "no pending")


def test_no_retries_by_default(start_sample, raw) -> None:
    sample: Sample = start_sample()
    topic = sample.client.topic("set-point", "cam-2")
    start = len(raw)
    sample.app.set_point_release.clear()
    try:
        with pytest.raises(RequestTimeoutError):
            sample.client.call("set-point", {"requestId": "r-y", "value": 1}, "cam-2", timeout=0.3)
    finally:
        sample.app.set_point_release.set()
    wait_until(lambda: sample.app.executions.get("set-point/cam-2") == 1, 10, "the one run")
    assert len(requests_on(raw, topic, start)) == 1


@pytest.mark.parametrize("retries", [-1, 1.5, True, "2"])
def test_bad_retries_are_refused(start_sample, retries) -> None:
    sample: Sample = start_sample()
    with pytest.raises(ValueError, match="retries"):
        sample.client.call("ping", retries=retries)


def test_unskit_call_retries(start_sample, raw) -> None:
    sample: Sample = start_sample()
    topic = sample.client.topic("set-point", "cam-1")
    start = len(raw)
    sample.app.set_point_release.clear()
    body = json.dumps({"requestId": "cli-retry", "value": 7})
    args = ["call", "set-point", body, "-c", str(sample.config_path), "-t", "gw"]
    args += ["--component", "sample", "--instance", "cam-1", "--timeout", "1", "--retries", "3"]
    code: dict[str, int] = {}
    caller = threading.Thread(target=lambda: code.setdefault("rc", cli.main(args)))
    caller.start()
    wait_until(lambda: len(requests_on(raw, topic, start)) >= 2, 20, "the re-sent request")
    sample.app.set_point_release.set()
    caller.join(30)
    assert not caller.is_alive()
    assert code["rc"] == 0
    assert sample.app.executions["set-point/cam-1"] == 1

    # Every attempt was answered with the one stored outcome, under the CLI's reply filter.
    def replies() -> list[Any]:
        return [
            Message.from_bytes(p).body
            for t, p in raw.since(start)
            if t.startswith("lib/reply-unskit-call-")
        ]

    wait_until(lambda: len(replies()) >= 1, 10, "a reply on the CLI's reply topic")
    assert all(r == {"instance": "cam-1", "value": 7, "execution": 1} for r in replies())


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_unskit_call_refuses_a_bad_retries_value(value, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["call", "ping", "--retries", value])
    assert exited.value.code == 2
    assert "--retries" in capsys.readouterr().err
