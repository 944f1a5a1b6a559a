"""The northbound link over the edge runtime's cloud MQTT proxy (``messaging.northbound.type:
runtime``) against the real nucleus, pointed at a real Mosquitto with mutual TLS as its cloud
endpoint: publishes at QoS 1 and 0 arrive there, a subscription receives what is published
there, QoS 2 is refused, store-and-forward keeps order and loses nothing (the broker down:
the nucleus's spooler holds, measured; the nucleus not reachable yet: the outbox holds; the
IPC connection cut mid-stream), a configuration section builds the link, and a whole
component run by the nucleus sends its metrics north through it."""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import stat
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest

from tests.edge.conftest import HARNESS
from tests.support.greengrass import THING_NAME, Harness, Nucleus, service_states
from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit import MessageBuilder
from unskit.config.messaging import (
    IpcConfig,
    ReconnectConfig,
    StoreAndForwardConfig,
    messaging_from_section,
)
from unskit.config.model import MessagingConfig
from unskit.config.platform import Platform
from unskit.config.rules import messaging_issues
from unskit.edge import SOCKET_ENV
from unskit.envelope import Message
from unskit.errors import UnsupportedQosError
from unskit.messaging import MessagingClient
from unskit.messaging.transport import QoS

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]

#: What the nucleus logs when its cloud MQTT connection drops.
INTERRUPTED = "AwsIotMqtt5Client: Connection interrupted."
#: Quick reconnects: the tests wait for links coming back.
FAST = ReconnectConfig(initial_delay_seconds=0.1, max_delay_seconds=0.5)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Mosquitto]:
    """A Mosquitto of this module's own (the tests stop and start it)."""
    broker = Mosquitto(tmp_path_factory.mktemp("cloud"), pki).start()
    yield broker
    broker.stop()


#: A whole component whose northbound link is the proxy: its metrics go to the cloud.
ROOT = "uns"
ECHO = "EchoNorth"


def echo_service(folder: Path) -> dict[str, Any]:
    """`unskit run echo` as a nucleus component, its document's northbound the proxy (with an
    outbox) and its metrics emitted there each second."""
    document = {
        "component": {},
        "topic": {"root": ROOT},
        "hierarchy": {"levels": ["site", "device"]},
        "identity": {"site": "plant-1"},
        "messaging": {
            "northbound": {
                "type": "runtime",
                "storeAndForward": {"enabled": True, "path": str(folder / "outbox.sqlite3")},
            }
        },
        "metricEmission": {
            "target": "messaging",
            "intervalSeconds": 1,
            "targetConfig": {"destination": "cloud"},
        },
    }
    config = folder / "echo.json"
    config.write_text(json.dumps(document))
    path = shlex.quote(f"{PROJECT / 'python'}:{PROJECT}")
    command = f"{shlex.quote(sys.executable)} -m unskit.cli run echo -c {shlex.quote(str(config))}"
    everything = {"operations": ["*"], "resources": ["*"]}
    return {
        "version": "1.0.0",
        "lifecycle": {"startup": f"PYTHONPATH={path} exec {command}"},
        "configuration": {
            "accessControl": {
                "aws.greengrass.ipc.pubsub": {"echo:pubsub:1": everything},
                "aws.greengrass.ipc.mqttproxy": {"echo:mqttproxy:1": everything},
            }
        },
    }


@pytest.fixture(scope="module")
def echo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("echo-north")


@server_fixture(scope="module")
def nucleus(cloud: Mosquitto, pki: Pki, echo_folder: Path) -> Iterator[Nucleus]:
    """A nucleus whose cloud endpoint is `cloud`'s mutual-TLS listener. The nucleus counts
    as configured for the cloud only with iotCredEndpoint set too (measured: without it
    PublishToIoTCore fails with "device is configured to run offline")."""
    runtime = Nucleus(
        [Harness(HARNESS)],
        services={ECHO: echo_service(echo_folder)},
        nucleus_configuration={
            "iotDataEndpoint": "localhost",
            "iotCredEndpoint": "localhost",
            "mqtt": {"port": cloud.mtls_port},
        },
        system={
            "certificateFilePath": str(pki.client_cert),
            "privateKeyPath": str(pki.client_key),
            "rootCaPath": str(pki.ca),
        },
    ).start()
    yield runtime
    runtime.remove()


class CloudSubscriber:
    """A paho client on the cloud broker with the test's client certificate: a persistent
    session, so what arrives while it reconnects after a broker restart waits for it."""

    def __init__(self, broker: Mosquitto, pki: Pki, topic_filter: str) -> None:
        self.lock = threading.Lock()
        self.received: list[tuple[str, bytes, int]] = []
        self.subscribed = threading.Event()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=f"cloud-{uuid.uuid4().hex[:8]}",
            clean_session=False,
        )
        self.client.tls_set(
            ca_certs=str(pki.ca), certfile=str(pki.client_cert), keyfile=str(pki.client_key)
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_connect = lambda c, *_: c.subscribe(topic_filter, 1)
        self.client.reconnect_delay_set(0.1, 0.5)
        self.client.connect("localhost", broker.mtls_port)
        self.client.loop_start()
        assert self.subscribed.wait(10), "the cloud subscriber did not subscribe"

    def _on_message(self, _c: paho.Client, _u: object, message: paho.MQTTMessage) -> None:
        with self.lock:
            self.received.append((message.topic, bytes(message.payload), message.qos))

    def bodies(self) -> list[object]:
        with self.lock:
            return [Message.from_bytes(payload).body for _, payload, _ in self.received]

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, 1).wait_for_publish(10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def prefix() -> str:
    return f"nb-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def subscriber(cloud: Mosquitto, pki: Pki, prefix: str) -> Iterator[CloudSubscriber]:
    client = CloudSubscriber(cloud, pki, f"{prefix}/#")
    yield client
    client.close()


def runtime_client(
    nucleus: Nucleus,
    outbox: Path | None = None,
    *,
    environ: dict[str, str] | None = None,
    connected: bool = True,
) -> MessagingClient:
    """A started client acting as the harness: its local link the IPC bus, its northbound
    link the nucleus's cloud MQTT proxy (with an outbox at `outbox`)."""
    token = uuid.uuid4().hex[:8]
    northbound = IpcConfig(client_id=f"test-{token}", reconnect=FAST)
    if outbox is not None:
        northbound = replace(northbound, store_and_forward=StoreAndForwardConfig(path=outbox))
    config = MessagingConfig(
        local=None,
        local_ipc=IpcConfig(client_id=f"test-{token}", reconnect=FAST),
        northbound_runtime=northbound,
        request_timeout_seconds=5,
    )
    client = MessagingClient(config, environ=environ or nucleus.component_env(HARNESS)).start()
    if connected:
        wait_until(client.northbound_connected, 15, "the northbound link over the proxy")
    return client


def envelope(body: object) -> Message:
    return MessageBuilder("Test", "1.0").body(body).build()


def test_publishes_at_qos_1_and_0_reach_the_cloud_broker(
    nucleus: Nucleus, subscriber: CloudSubscriber, prefix: str
) -> None:
    client = runtime_client(nucleus)
    try:
        assert client.link_status(northbound=True)["endpoint"].startswith("ipc+iotcore:")
        client.publish_northbound(f"{prefix}/one", envelope("at least once"), QoS.AT_LEAST_ONCE)
        client.publish_northbound(f"{prefix}/zero", envelope("at most once"), QoS.AT_MOST_ONCE)
        wait_until(lambda: len(subscriber.received) == 2, 10, "both publishes at the broker")
        topics = sorted(topic for topic, _, _ in subscriber.received)
        assert topics == [f"{prefix}/one", f"{prefix}/zero"]
        assert sorted(map(str, subscriber.bodies())) == ["at least once", "at most once"]
        # The nucleus answers both: nothing waits, nothing was lost. Its IPC reply may come
        # after the broker already delivered the message, so the backlog is waited on.
        wait_until(lambda: client.publish_status(northbound=True).backlog == 0, 10, "both answered")
        assert client.publish_status(northbound=True).failures == 0
    finally:
        client.close()


def test_a_northbound_subscription_receives_what_the_cloud_publishes(
    nucleus: Nucleus, subscriber: CloudSubscriber, prefix: str
) -> None:
    client = runtime_client(nucleus)
    received: list[tuple[str, object]] = []
    try:
        client.subscribe_northbound(
            f"{prefix}/down/+", lambda t, m: received.append((t, m.body)), QoS.AT_LEAST_ONCE
        )
        # The nucleus answers SubscribeToIoTCore once the broker took the subscription.
        assert client.wait_subscribed(10, northbound=True)
        subscriber.publish(f"{prefix}/down/cmd", envelope({"from": "cloud"}).to_bytes())
        wait_until(lambda: received, 10, "the cloud's publish at the component")
        assert received == [(f"{prefix}/down/cmd", {"from": "cloud"})]
    finally:
        client.close()


def test_qos_2_is_refused_before_anything_is_sent_or_stored(
    nucleus: Nucleus, subscriber: CloudSubscriber, prefix: str, tmp_path: Path
) -> None:
    plain = runtime_client(nucleus)
    stored = runtime_client(nucleus, tmp_path / "outbox.sqlite3")
    try:
        for client in (plain, stored):
            with pytest.raises(UnsupportedQosError, match="QoS 0 and 1 only"):
                client.publish_northbound(f"{prefix}/two", envelope(2), QoS.EXACTLY_ONCE)
            with pytest.raises(UnsupportedQosError, match="QoS 0 and 1 only"):
                client.subscribe_northbound(f"{prefix}/two", lambda t, m: None, QoS.EXACTLY_ONCE)
        status = stored.outbox_status()
        assert status is not None
        assert status.entries == 0
        # A publish after them still goes: the refusals left both links as they were.
        stored.publish_northbound(f"{prefix}/after", envelope("after"), QoS.AT_LEAST_ONCE)
        wait_until(lambda: subscriber.bodies() == ["after"], 10, "the publish after the refusals")
    finally:
        plain.close()
        stored.close()


def test_with_the_broker_down_the_nucleus_spools_qos_1_and_delivers_it_in_order(
    nucleus: Nucleus, cloud: Mosquitto, subscriber: CloudSubscriber, prefix: str, tmp_path: Path
) -> None:
    """Measured on the real nucleus: it answers PublishToIoTCore once the message is in its
    own spooler (in memory, 2.5 MB by default), so while the cloud broker is down the outbox
    empties at once and the nucleus holds the QoS 1 messages; it refuses a QoS 0 one
    (keepQos0WhenOffline is false by default), counted as a failure."""
    client = runtime_client(nucleus, tmp_path / "outbox.sqlite3")
    try:
        interruptions = nucleus.log().count(INTERRUPTED)
        cloud.stop()  # SIGTERM: the subscriber's persistent session is saved
        # Published only once the nucleus knows its cloud connection is gone: before, a
        # QoS 0 publish could still be written to the dying connection.
        wait_until(
            lambda: nucleus.log().count(INTERRUPTED) > interruptions,
            15,
            "the nucleus seeing its cloud connection drop",
        )
        for i in range(20):
            client.publish_northbound(f"{prefix}/spooled", envelope(i), QoS.AT_LEAST_ONCE)
        client.publish_northbound(f"{prefix}/dropped", envelope("qos0"), QoS.AT_MOST_ONCE)
        outbox = client.outbox_status
        wait_until(
            lambda: (s := outbox()) is not None and s.entries == 0,
            10,
            "the nucleus answering every stored publish while the broker is down",
        )
        wait_until(
            lambda: client.publish_status(northbound=True).failures == 1,
            10,
            "the QoS 0 publish refused by the offline nucleus",
        )
        assert subscriber.received == []
        cloud.start()
        wait_until(lambda: len(subscriber.received) >= 20, 60, "the spooled publishes")
        assert subscriber.bodies() == list(range(20))
        assert {topic for topic, _, _ in subscriber.received} == {f"{prefix}/spooled"}
    finally:
        client.close()
        if cloud.process is None:
            cloud.start()


def test_the_outbox_holds_publishes_until_the_nucleus_is_reachable(
    nucleus: Nucleus, subscriber: CloudSubscriber, prefix: str, tmp_path: Path
) -> None:
    """The component up before the nucleus's socket is there (the socket path a link that
    does not exist yet): publishes are stored, and go out in order once it is reachable."""
    folder = Path(tempfile.mkdtemp(prefix="nb.", dir="/tmp"))  # a socket path < 108 bytes
    socket = folder / "ipc.socket"
    environ = {**nucleus.component_env(HARNESS), SOCKET_ENV: str(socket)}
    client = runtime_client(nucleus, tmp_path / "outbox.sqlite3", environ=environ, connected=False)
    try:
        for i in range(10):
            client.publish_northbound(f"{prefix}/held", envelope(i), QoS.AT_LEAST_ONCE)
        status = client.outbox_status()
        assert status is not None
        assert status.entries == 10
        assert not client.northbound_connected()
        assert subscriber.received == []
        os.symlink(nucleus.socket_path, socket)
        wait_until(client.northbound_connected, 15, "the northbound link once reachable")
        wait_until(lambda: len(subscriber.received) >= 10, 15, "the stored publishes")
        assert subscriber.bodies() == list(range(10))
        wait_until(
            lambda: (s := client.outbox_status()) is not None and s.entries == 0,
            10,
            "the outbox emptied",
        )
    finally:
        client.close()
        socket.unlink(missing_ok=True)
        folder.rmdir()


def test_the_outbox_keeps_order_and_loses_nothing_across_a_cut_ipc_connection(
    nucleus: Nucleus,
    subscriber: CloudSubscriber,
    prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The IPC connection shut down under the SDK while the outbox streams: the publishes it
    had sent and not yet had answered are sent again on the next connection before anything
    newer (the ids kept across the hold), so every one arrives, first arrivals in order
    (QoS 1: one the nucleus took but whose answer the cut lost arrives twice)."""
    caplog.set_level(logging.WARNING, "unskit.messaging.ipc")
    before = socket_fds()
    client = runtime_client(nucleus, tmp_path / "outbox.sqlite3")
    count = 300
    try:
        ours = socket_fds() - before
        assert ours, "no IPC socket found"
        for i in range(count):
            client.publish_northbound(f"{prefix}/flap", envelope(i), QoS.AT_LEAST_ONCE)
            if i == count // 3:
                cut(ours)
        wait_until(
            lambda: len(set(map(str, subscriber.bodies()))) >= count,
            30,
            "every publish at the broker",
        )
        lost = "messaging northbound: the IPC link to the edge runtime was lost"
        assert any(lost in r.getMessage() for r in caplog.records), "the cut did not cut"
        first_arrivals = list(dict.fromkeys(subscriber.bodies()))
        assert first_arrivals == list(range(count))
        wait_until(
            lambda: (s := client.outbox_status()) is not None and s.entries == 0,
            10,
            "the outbox emptied",
        )
        assert client.publish_status(northbound=True).failures == 0
    finally:
        client.close()


def socket_fds() -> set[int]:
    """This process's open sockets (the IPC connections are among them)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                found.add(int(name))
        except OSError:
            continue
    return found


def cut(fds: set[int]) -> None:
    """Shuts the connections' sockets down under the SDK, as a broken link would: the
    nucleus stays up and the token stays valid."""
    for fd in fds:
        try:
            twin = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            twin.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            twin.close()


def test_a_configuration_section_with_type_runtime_builds_the_proxy_link(
    nucleus: Nucleus, subscriber: CloudSubscriber, prefix: str, tmp_path: Path
) -> None:
    """The document's path: `messaging.northbound.type: runtime` with its keys, read by
    `messaging_from_section`, gives a client whose northbound link is the proxy, with its
    outbox in the state directory and its default QoS from the section."""
    section = {
        "local": {"type": "ipc"},
        "northbound": {
            "type": "runtime",
            "qos": {"publish": 0},
            "reconnect": {"initialDelaySeconds": 0.1, "maxDelaySeconds": 0.5},
            "publishDegradedAfterSeconds": 7,
            "storeAndForward": {"enabled": True},
        },
    }
    assert list(messaging_issues(section, Platform.EDGE_RUNTIME)) == []
    config = messaging_from_section(section, "gw-01", "t1", state_dir=tmp_path)
    client = MessagingClient(config, environ=nucleus.component_env(HARNESS)).start()
    try:
        wait_until(client.northbound_connected, 15, "the northbound link over the proxy")
        assert client.outbox_status() is not None
        assert (tmp_path / "outbox.sqlite3").exists()
        assert client.publish_status(northbound=True).degraded_after_s == 7
        # No QoS given: the section's publish QoS 0, which the broker hands on as QoS 0.
        client.publish_reserved(f"{prefix}/default", envelope("default"), northbound=True)
        wait_until(lambda: subscriber.received, 10, "the publish at the broker")
        assert [(t, q) for t, _, q in subscriber.received] == [(f"{prefix}/default", 0)]
    finally:
        client.close()


def test_a_whole_component_sends_its_metrics_through_the_proxy(
    nucleus: Nucleus, cloud: Mosquitto, pki: Pki, echo_folder: Path
) -> None:
    """`unskit run echo` under the nucleus with `northbound.type: runtime`: RUNNING, and its
    metrics (destination cloud) arrive at the cloud broker, through its outbox."""
    cloud_side = CloudSubscriber(cloud, pki, f"{ROOT}/#")

    def metrics() -> list[tuple[str, bytes, int]]:
        with cloud_side.lock:
            return [m for m in cloud_side.received if "/metric/" in m[0]]

    try:
        wait_until(lambda: "RUNNING" in service_states(nucleus, ECHO), 60, "EchoNorth RUNNING")
        wait_until(lambda: bool(metrics()), 20, "a metric message at the cloud broker")
        topic, payload, _ = metrics()[0]
        assert topic.startswith(f"{ROOT}/{THING_NAME}/echo/metric/")
        assert Message.from_bytes(payload).body is not None
        assert "messaging northbound: connected to the edge runtime" in nucleus.log(ECHO)
        assert (echo_folder / "outbox.sqlite3").exists()
    finally:
        cloud_side.close()


def test_a_full_nucleus_spooler_leaves_the_rest_in_the_outbox(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    """Measured: with its cloud broker down and its spooler full the nucleus refuses
    PublishToIoTCore with ServiceError ("Message spool is full"), and takes some again as its
    spooler's retries free room. The outbox's entries are then held and retried with
    backoff, not deleted unsent: once the broker is back, every one arrives. Order is kept
    only up to the first refusal: publishes already sent behind a refused one may be taken
    before its retry (measured). A broker and a nucleus of its own, with a 4 kB spooler."""
    caplog.set_level(logging.WARNING, "unskit.messaging.ipc")
    broker = Mosquitto(tmp_path / "cloud", pki).start()
    runtime = Nucleus(
        [Harness(HARNESS)],
        nucleus_configuration={
            "iotDataEndpoint": "localhost",
            "iotCredEndpoint": "localhost",
            "mqtt": {"port": broker.mtls_port, "spooler": {"maxSizeInBytes": 4000}},
        },
        system={
            "certificateFilePath": str(pki.client_cert),
            "privateKeyPath": str(pki.client_key),
            "rootCaPath": str(pki.ca),
        },
    )
    subscriber: CloudSubscriber | None = None
    client: MessagingClient | None = None
    count = 200
    try:
        runtime.start()
        subscriber = CloudSubscriber(broker, pki, "full/#")
        client = runtime_client(runtime, tmp_path / "outbox.sqlite3")
        interruptions = runtime.log().count(INTERRUPTED)
        broker.stop()
        wait_until(
            lambda: runtime.log().count(INTERRUPTED) > interruptions,
            15,
            "the nucleus seeing its cloud connection drop",
        )
        for i in range(count):
            client.publish_northbound("full/spool", envelope(i), QoS.AT_LEAST_ONCE)
        refused = "Message spool is full"
        wait_until(
            lambda: any(refused in r.getMessage() for r in caplog.records),
            15,
            "the nucleus refusing for its full spooler",
        )
        status = client.outbox_status()
        assert status is not None
        assert 0 < status.entries < count  # some in the nucleus's spooler, the rest here
        assert client.publish_status(northbound=True).failures == 0
        broker.start()
        wait_until(
            lambda: len(set(map(str, subscriber.bodies()))) >= count,
            60,
            "every publish at the broker",
        )
        assert sorted(set(subscriber.bodies())) == list(range(count))  # type: ignore[type-var]
        refusals = [r for r in caplog.records if refused in r.getMessage()]
        assert len(refusals) == 1, "one warning a minute at most"
        wait_until(
            lambda: (s := client.outbox_status()) is not None and s.entries == 0,
            15,
            "the outbox emptied",
        )
        assert client.publish_status(northbound=True).failures == 0
    finally:
        if client is not None:
            client.close()
        if subscriber is not None:
            subscriber.close()
        runtime.remove()
        broker.stop()
