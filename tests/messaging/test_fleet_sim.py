"""`unskit fleet-sim` against Mosquitto and the 3-node NATS cluster: every sample produced is
delivered at QoS 1, and the report agrees with an independent subscriber's own count; bad
options are refused with exit 2."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import threading
import uuid
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.messaging.conftest import broker_config
from tests.support.servers import free_port, wait_until
from unskit.cli import main
from unskit.envelope import Message, MessageBuilder
from unskit.fleet.sim import LatencyHistogram

FILTER = "+/+/fleet-sim/sim/data/+"


class Watcher:
    """A raw paho subscriber that decodes what the fleet publishes, by topic root."""

    def __init__(self, port: int) -> None:
        self.lock = threading.Lock()
        self.samples: dict[str, set[tuple[str, str, int]]] = {}
        self.messages: dict[str, int] = {}
        self.subscribed = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"w-{uuid.uuid4().hex}")
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_connect = lambda c, *_: c.subscribe(FILTER, 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.subscribed.wait(30), "the watcher did not subscribe"

    def _on_message(self, _c: Any, _u: Any, raw: paho.MQTTMessage) -> None:
        root = raw.topic.split("/", 1)[0]
        message = Message.from_bytes(raw.payload)
        with self.lock:
            self.messages[root] = self.messages.get(root, 0) + 1
            if message.body_case != "southbound_signal_update":
                return
            device = message.identity.device if message.identity else "?"
            signal = message.body["signal"]["id"]
            seen = self.samples.setdefault(root, set())
            for sample in message.body["samples"]:
                seen.add((device, signal, sample["value"]))

    def total(self) -> int:
        with self.lock:
            return sum(len(seen) for seen in self.samples.values())

    def distinct(self, root: str) -> int:
        with self.lock:
            return len(self.samples.get(root, ()))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def run_sim(capsys: pytest.CaptureFixture[str], *options: str) -> dict[str, Any]:
    assert main(["fleet-sim", *options, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def check_report(report: dict[str, Any], watcher: Watcher, gateways: int, signals: int) -> None:
    # Every sample produced reached the subscriber exactly as counted.
    assert report["produced"] > 0
    assert report["produced"] % signals == 0
    assert report["published"] == report["produced"]
    assert report["delivered"] == report["produced"]
    assert report["lost"] == 0
    assert report["overflowed"] == 0
    assert report["publish_errors"] == 0
    assert report["messages"] == report["delivered"] + report["duplicates"]
    assert report["latency_unknown"] == 0
    assert 0 < report["latency_p50_ms"] <= report["latency_p99_ms"] <= report["latency_max_ms"]
    assert report["delivered_msgs_per_s"] > 0
    # An independent subscriber saw the same distinct samples.
    root = report["root"]
    wait_until(lambda: watcher.distinct(root) >= report["delivered"], 30, "the watcher's count")
    assert watcher.distinct(root) == report["delivered"]
    devices = {d for d, _, _ in watcher.samples[root]}
    assert len(devices) == gateways
    assert len({s for _, s, _ in watcher.samples[root]}) == signals


@pytest.mark.integration
def test_fleet_on_mosquitto_delivers_every_sample(broker, capsys) -> None:
    watcher = Watcher(broker.plain_port)
    try:
        report = run_sim(
            capsys,
            *("--broker", f"127.0.0.1:{broker.plain_port}"),
            *("--gateways", "3", "--signals", "4", "--rate", "20", "--duration", "1.5"),
        )
        check_report(report, watcher, 3, 4)
        # 20 changes/s for 1.5 s: about 30 polls per gateway (the first one at the start).
        polls = report["produced"] / 12
        assert 25 <= polls <= 35, polls
    finally:
        watcher.close()


@pytest.mark.integration
def test_an_endpoint_list_fails_over_past_a_dead_broker(broker, capsys) -> None:
    # The subscriber and gateway 0 start at the dead entry, gateway 1 at Mosquitto.
    brokers = f"127.0.0.1:{free_port()},127.0.0.1:{broker.plain_port}"
    report = run_sim(capsys, "--broker", brokers, "-k", "2", "-m", "2", "--duration", "0.5")
    assert report["brokers"] == brokers.split(",")
    assert report["delivered"] == report["produced"] > 0
    assert report["lost"] == 0


@pytest.mark.integration
def test_table_output_names_the_figures(broker, capsys) -> None:
    options = ["--broker", f"127.0.0.1:{broker.plain_port}", "-k", "1", "-m", "1"]
    assert main(["fleet-sim", *options, "--duration", "0.3", "--qos", "0"]) == 0
    out = capsys.readouterr().out
    for label in ("delivered", "latency p50", "latency p99", "lost", "QoS 0"):
        assert label in out, out


@pytest.mark.integration
def test_sigterm_ends_the_run_early_and_it_still_reports(broker, tmp_path) -> None:
    watcher = Watcher(broker.plain_port)
    command = [sys.executable, "-m", "unskit.cli", "fleet-sim", "--json", "--duration", "120"]
    command += ["--broker", f"127.0.0.1:{broker.plain_port}", "-k", "2", "-m", "2"]
    command += ["--rate", "50"]
    with (tmp_path / "err.txt").open("wb") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err)
    try:
        wait_until(lambda: watcher.total() >= 20, 30, "the fleet to publish")
        process.terminate()
        out, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=5)
        watcher.close()
    assert process.returncode == 0, (tmp_path / "err.txt").read_text()
    report = json.loads(out)
    assert report["stopped_early"] is True
    assert report["duration_s"] < 60
    assert report["delivered"] == report["produced"] > 0
    assert report["lost"] == 0


@pytest.mark.integration
def test_an_unreachable_broker_is_exit_1(capsys) -> None:
    options = ["--broker", f"127.0.0.1:{free_port()}", "--connect-timeout", "0.5"]
    assert main(["fleet-sim", *options, "-k", "1", "-m", "1"]) == 1
    assert "cannot connect to 127.0.0.1:" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_fleet_on_the_nats_cluster_delivers_every_sample(nats, make_client, capsys) -> None:
    n1, n2, n3 = nats.nodes
    watcher = Watcher(n2.mqtt_port)
    try:
        # The watcher's interest has reached every node once a probe from each arrives.
        publishers = [make_client(broker_config(n.mqtt_port)) for n in nats.nodes]
        probe_root = f"probe{uuid.uuid4().hex[:8]}"

        def probed() -> bool:
            for k, client in enumerate(publishers):
                topic = f"{probe_root}/n{k}/fleet-sim/sim/data/p"
                client.publish(topic, MessageBuilder("P", "1").body({}).build())
            return watcher.messages.get(probe_root, 0) >= 3

        wait_until(probed, 30, "the watcher's interest on every node", interval=0.2)
        brokers = ",".join(f"127.0.0.1:{n.mqtt_port}" for n in (n1, n2, n3))
        report = run_sim(
            capsys,
            *("--broker", brokers, "--gateways", "3", "--signals", "3"),
            *("--rate", "10", "--duration", "2", "--qos", "1"),
        )
        check_report(report, watcher, 3, 3)
        assert len(report["brokers"]) == 3
    finally:
        watcher.close()


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        (["--gateways", "0"], "--gateways must be 1..1000"),
        (["--signals", "-1"], "--signals must be 1..10000"),
        (["--rate", "0"], "--rate must be > 0"),
        (["--rate", "nan"], "--rate must be > 0"),
        (["--duration", "-2"], "--duration must be > 0"),
        (["--qos", "3"], "--qos must be 0, 1 or 2"),
        (["--broker", "localhost"], "--broker expects HOST:PORT, not 'localhost'"),
        (["--broker", "127.0.0.1:0"], "a port 1..65535"),
        (["--broker", "127.0.0.1:1,127.0.0.1:1"], "an endpoint is listed twice"),
        (["--gateways", "many"], "invalid int value: 'many'"),
    ],
)
def test_bad_options_are_refused_with_exit_2(options, complaint, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["fleet-sim", *options])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert complaint in err, err
    assert "unskit fleet-sim" in err, err


def test_histogram_quantiles_are_within_one_percent() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(-7, 1.5) for _ in range(20_000)]
    histogram = LatencyHistogram()
    for sample in samples:
        histogram.add(sample)
    ordered = sorted(samples)
    for q in (0.5, 0.9, 0.99, 1.0):
        exact = ordered[math.ceil(q * len(ordered)) - 1]
        got = histogram.quantile(q)
        assert got is not None
        assert exact <= got <= exact * 1.0101, (q, exact, got)
    assert histogram.max_s == ordered[-1]
    assert LatencyHistogram().quantile(0.5) is None
