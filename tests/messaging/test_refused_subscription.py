"""A subscription the broker refuses (SUBACK 0x80: we speak MQTT 3.1.1) is retried with a
jittered backoff until granted; readiness waits for it. Real Mosquitto with its
dynamic-security plugin, whose subscribe ACLs are changed live."""

from __future__ import annotations

import itertools
import json
import logging
import signal
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.messaging.conftest import broker_config
from tests.messaging.test_client import Inbox, reading
from tests.runtime.test_metrics import parse_exposition
from tests.runtime.test_readiness_inbox import camera_config
from tests.support.mosquitto import DynsecMosquitto
from tests.support.servers import component_process, free_port, readyz, wait_until
from unskit.commands import CommandClient
from unskit.config.model import BrokerCredentials, MessagingConfig
from unskit.config.secrets import Secret
from unskit.messaging import MessagingClient, QoS
from unskit.messaging.mqtt import MqttTransport
from unskit.messaging.requests import DeadlineTimer

pytestmark = pytest.mark.integration

_users = itertools.count()
MQTT_LOGGER = "unskit.messaging.mqtt"


@pytest.fixture
def dynsec(tmp_path: Path) -> Iterator[DynsecMosquitto]:
    """A broker of each test's own: tests change its default access."""
    broker = DynsecMosquitto(tmp_path / "dynsec").start()
    yield broker
    broker.stop()


def account(dynsec: DynsecMosquitto) -> BrokerCredentials:
    """A fresh broker account that may subscribe to reply topics only."""
    username, password = f"edge-{next(_users)}", uuid.uuid4().hex
    dynsec.create_client(username, password)
    dynsec.allow_subscribe(username, "lib/#")
    return BrokerCredentials(username=username, password=Secret(password))


def started(dynsec: DynsecMosquitto, creds: BrokerCredentials) -> MessagingClient:
    config = broker_config(dynsec.port, credentials=creds)
    client = MessagingClient(MessagingConfig(local=config), persistent_session=False).start()
    assert client.wait_connected(10), "the client did not connect"
    return client


def refusals_logged(caplog: pytest.LogCaptureFixture, level: int, topic_filter: str) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == MQTT_LOGGER
        and r.levelno == level
        and "refused the subscription" in r.getMessage()
        and repr(topic_filter) in r.getMessage()
    )


@pytest.mark.slow
def test_a_refused_inbox_is_not_ready_and_recovers_once_the_broker_grants_it(
    dynsec: DynsecMosquitto, topic_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=MQTT_LOGGER)
    creds = account(dynsec)
    inbox_filter = f"{topic_root}/cmd/#"
    client = started(dynsec, creds)
    publisher = started(dynsec, account(dynsec))
    try:
        wait_until(client.subscriptions_acknowledged, 10, "the reply filter's SUBACK")
        inbox = Inbox()
        client.subscribe(inbox_filter, inbox)
        # Refused, then retried (0.5-1 s, 0.5-2 s later) and refused again, on one link.
        wait_until(lambda: client.stats().refused_subscriptions >= 3, 20, "two refused retries")
        # The component's readiness is connected() AND subscriptions_acknowledged().
        assert client.connected()
        assert not client.subscriptions_acknowledged()
        assert client.stats().refused_subscriptions >= 3
        assert refusals_logged(caplog, logging.ERROR, inbox_filter) == 1
        assert refusals_logged(caplog, logging.DEBUG, inbox_filter) >= 2
        assert not any(
            r.levelno >= logging.WARNING and "link lost" in r.getMessage() for r in caplog.records
        )

        # The operator fixes the access rules; the broker does not disconnect us for it.
        dynsec.default_subscribe(True)
        wait_until(client.subscriptions_acknowledged, 30, "the retried SUBSCRIBE to be granted")
        inbox.prime(publisher, f"{topic_root}/cmd/probe")
        sent = reading("after-grant")
        publisher.publish(f"{topic_root}/cmd/x", sent)
        assert inbox.wait_for_uuids({sent.header.uuid}) == {sent.header.uuid}
        assert refusals_logged(caplog, logging.ERROR, inbox_filter) == 1
        granted = [r.getMessage() for r in caplog.records if "broker granted" in r.getMessage()]
        assert len(granted) == 1, granted
        assert repr(inbox_filter) in granted[0]
        # No reconnect brought it back: the retry did, on the first connection.
        assert not any("link lost" in r.getMessage() for r in caplog.records)
    finally:
        client.close(2)
        publisher.close(2)


def refused_transport(
    dynsec: DynsecMosquitto, timer: DeadlineTimer | None, creds: BrokerCredentials | None = None
) -> tuple[MqttTransport, str]:
    """A started transport whose one filter the broker refused, its retry armed."""
    config = broker_config(dynsec.port, credentials=creds or account(dynsec))
    transport = MqttTransport(config, persistent_session=False, timer=timer)
    transport.start(lambda _t, _p: None, lambda _up: None)
    wait_until(transport.is_connected, 10, "the transport to connect")
    refused = f"t{uuid.uuid4().hex[:10]}/cmd/#"
    transport.subscribe([refused], QoS.AT_LEAST_ONCE)
    wait_until(lambda: transport.subscribe_refusals >= 1, 10, "the refusal")
    assert transport.refused_filters == [refused]
    return transport, refused


def test_close_while_a_retry_waits_cancels_it(dynsec: DynsecMosquitto) -> None:
    timer = DeadlineTimer("test-retries")
    try:
        transport, _ = refused_transport(dynsec, timer)
        # A refusal arms exactly one retry on the timer it was given.
        wait_until(lambda: len(timer) == 1, 5, "the retry to be armed")
        sent = transport.subscribes_sent
        transport.close(2)
        assert len(timer) == 0, "the retry outlived close"
        assert transport.subscribes_sent == sent
        assert not transport.is_connected()
    finally:
        timer.stop()


def test_close_stops_the_transports_own_retry_timer(dynsec: DynsecMosquitto) -> None:
    before = set(threading.enumerate())
    transport, _ = refused_transport(dynsec, None)
    started = {t.name for t in set(threading.enumerate()) - before}
    assert "unskit-local-resubscribe" in started, started
    transport.close(2)
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert left == [], f"threads left after close: {left}"


def test_unsubscribing_a_refused_filter_cancels_its_retry_and_restores_readiness(
    dynsec: DynsecMosquitto,
) -> None:
    timer = DeadlineTimer("test-retries")
    try:
        transport, refused = refused_transport(dynsec, timer)
        allowed = f"lib/t{uuid.uuid4().hex[:10]}/#"  # the account may subscribe lib/#
        transport.subscribe([allowed], QoS.AT_LEAST_ONCE)
        assert transport.wait_acknowledged([allowed], 10)
        assert not transport.acknowledged([allowed, refused])
        wait_until(lambda: len(timer) == 1, 5, "the retry to be armed")
        transport.unsubscribe([refused])
        assert len(timer) == 0, "the retry outlived the unsubscribe"
        assert transport.refused_filters == []
        assert transport.acknowledged([allowed])
        transport.close(2)
    finally:
        timer.stop()


def test_a_reconnect_resubscribes_a_refused_filter_and_drops_its_pending_retry(
    dynsec: DynsecMosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=MQTT_LOGGER)
    timer = DeadlineTimer("test-retries")
    creds = account(dynsec)
    try:
        transport, refused = refused_transport(dynsec, timer, creds)
        wait_until(lambda: len(timer) == 1, 5, "the retry to be armed")
        # A role change makes the broker disconnect the client: the reconnect's SUBSCRIBE
        # carries every filter, the refused one included, and is granted.
        dynsec.allow_subscribe(str(creds.username), refused)
        assert transport.wait_acknowledged([refused], 30)
        assert any("link lost" in r.getMessage() for r in caplog.records)
        assert transport.refused_filters == []
        assert len(timer) == 0, "a retry is still armed after the grant"
        transport.close(2)
    finally:
        timer.stop()


def refusals(scrape_port: int) -> float:
    """``messaging/refusedSubscriptions{link="local"}`` as the component's scrape endpoint
    shows it (0 before the first emit)."""
    url = f"http://127.0.0.1:{scrape_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        _, values = parse_exposition(response.read().decode())
    return max(
        (
            v
            for (name, labels), v in values.items()
            if name == "messaging_refusedSubscriptions" and ("link", "local") in labels
        ),
        default=0.0,
    )


@pytest.mark.slow
def test_a_component_whose_inbox_is_refused_answers_readyz_503_until_it_is_granted(
    dynsec: DynsecMosquitto, tmp_path: Path
) -> None:
    health_port, scrape_port = free_port(), free_port()
    config, root = camera_config(tmp_path / "camera", dynsec.port, health_port)
    creds = account(dynsec)
    assert isinstance(creds.password, Secret)
    document = json.loads(config.read_text())
    document["messaging"]["local"]["credentials"] = {
        "username": creds.username,
        "password": creds.password.reveal(),
    }
    document["metricEmission"] = {
        "target": "scrape",
        "targetConfig": {"host": "127.0.0.1", "port": scrape_port},
    }
    config.write_text(json.dumps(document))
    messaging = started(dynsec, account(dynsec))
    log = tmp_path / "camera.log"
    try:
        with component_process("camera-adapter", log, "-c", str(config), "-t", "gw") as proc:
            wait_until(lambda: "refused the subscription" in log.read_text(), 30, "the refusal")
            # Start-up has ended: the 503 below is the refused inbox's.
            wait_until(lambda: "camera-adapter running" in log.read_text(), 30, "start-up")
            wait_until(lambda: readyz(health_port) is not None, 30, "the probe server")
            assert readyz(health_port) == 503
            wait_until(lambda: refusals(scrape_port) >= 1, 30, "the refusal in the metrics")
            dynsec.default_subscribe(True)
            wait_until(lambda: readyz(health_port) == 200, 30, "readiness after the grant")
            client = CommandClient(messaging, "camera-adapter", "gw", root=root)
            assert client.call("describe", timeout=10)["component"] == "camera-adapter"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "link lost" not in text, text[-3000:]
        assert "the broker granted the subscription" in text, text[-3000:]
    finally:
        messaging.close(2)
