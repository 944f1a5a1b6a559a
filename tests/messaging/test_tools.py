"""`unskit watch` and `unskit request` as a user runs them, against a real Mosquitto."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import paho.mqtt.client as mqtt
import pytest

from tests.messaging.conftest import broker_config
from tests.messaging.test_client import start_echo_responder
from tests.support.servers import wait_until
from unskit import MessageBuilder

UNSKIT = [sys.executable, "-m", "unskit.cli"]


def test_watch_prints_envelopes_as_json_lines(broker, make_client, topic_root):
    publisher = make_client(broker_config(broker.plain_port))
    watcher = subprocess.Popen(
        [
            *UNSKIT,
            "watch",
            f"{topic_root}/#",
            "--count",
            "3",
            "--duration",
            "60",
            "--broker",
            f"127.0.0.1:{broker.plain_port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        sent = 0

        def publish_until_done() -> bool:
            nonlocal sent
            publisher.publish(
                f"{topic_root}/gw/c/data/t",
                MessageBuilder("reading", "1").body({"n": sent}).build(),
            )
            publisher.publish_raw(f"{topic_root}/gw/c/data/raw", {"not": "an envelope"})
            sent += 1
            return watcher.poll() is not None

        wait_until(publish_until_done, 30, "the watcher to print 3 messages", interval=0.1)
        out, err = watcher.communicate(timeout=10)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3
    assert {line["topic"] for line in lines} == {f"{topic_root}/gw/c/data/t"}
    assert all(line["header"]["name"] == "reading" for line in lines)
    numbers = [line["body"]["n"] for line in lines]
    assert numbers == sorted(numbers)
    assert "were not envelopes" in err


def test_request_prints_the_reply(broker, make_client, topic_root):
    responder = make_client(broker_config(broker.plain_port))
    topic = f"{topic_root}/gw/c/cmd/sb/echo"
    start_echo_responder(responder, responder, topic)
    result = subprocess.run(
        [*UNSKIT, "request", topic, '{"ping": 1}', "--broker", f"127.0.0.1:{broker.plain_port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["header"]["name"] == "EchoReply"
    assert reply["body"] == {"ping": 1}


def test_request_without_responder_times_out_with_exit_1(broker, topic_root):
    result = subprocess.run(
        [
            *UNSKIT,
            "request",
            f"{topic_root}/nobody",
            "x",
            "--timeout",
            "0.5",
            "--broker",
            f"127.0.0.1:{broker.plain_port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "no reply" in result.stderr


@pytest.mark.integration
def test_unreachable_broker_is_a_clear_error(topic_root):
    from tests.support.servers import free_port

    result = subprocess.run(
        [
            *UNSKIT,
            "request",
            f"{topic_root}/x",
            "x",
            "--broker",
            f"127.0.0.1:{free_port()}",
            "--connect-timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "cannot connect" in result.stderr


def _session_present(port: int, client_id: str) -> bool:
    """Connects as `client_id` without a clean session and reports the CONNACK's flag."""
    answered = threading.Event()
    present: list[bool] = []

    def on_connect(_c: object, _u: object, flags: mqtt.ConnectFlags, *_rest: object) -> None:
        present.append(bool(flags.session_present))
        answered.set()

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=False,
        protocol=mqtt.MQTTv311,
    )
    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert answered.wait(10), "no CONNACK"
        subscribed = client.subscribe(f"forget-test/{client_id}/#", qos=1)
        assert subscribed[0] == mqtt.MQTT_ERR_SUCCESS
    finally:
        client.disconnect()
        client.loop_stop()
    return present[0]


def test_session_forget_drops_a_persistent_session(broker):
    client_id = "gw-decommissioned-1"
    _session_present(broker.plain_port, client_id)  # leaves a persistent session behind
    assert _session_present(broker.plain_port, client_id), "the broker kept no session"
    forget = subprocess.run(
        [
            *UNSKIT,
            "session",
            "forget",
            "--client-id",
            client_id,
            "--broker",
            f"127.0.0.1:{broker.plain_port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert forget.returncode == 0, forget.stderr
    assert client_id in forget.stdout
    assert not _session_present(broker.plain_port, client_id)


def test_session_forget_needs_a_client_id(broker):
    forget = subprocess.run(
        [*UNSKIT, "session", "forget", "--broker", f"127.0.0.1:{broker.plain_port}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert forget.returncode == 2
    assert "--client-id" in forget.stderr
