"""A real component process: probes while it connects, requests, SIGTERM, drain, exit 0."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.support.mosquitto import Mosquitto
from tests.support.servers import component_process, free_port, wait_until
from tests.support.tiers import server_fixture

from unskit import MessageBuilder
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

ECHO = [sys.executable, "-m", "unskit.cli", "run", "echo"]


def probe(port: int, path: str) -> int | None:
    """The status of one GET, or None when nothing listens."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def echo_process(log_path: Path, *args: str) -> contextlib.AbstractContextManager[Any]:
    """`unskit run echo ARGS` with its output in `log_path`."""
    return component_process("echo", log_path, *args)


@server_fixture
def broker_later(tmp_path, pki):
    """A broker whose ports are known but which starts only when the test says so."""
    mosquitto = Mosquitto(tmp_path / "mosquitto", pki)
    yield mosquitto
    mosquitto.stop()


def write_config(folder: Path, broker_port: int, health_port: int) -> Path:
    path = folder / "echo.json"
    path.write_text(
        json.dumps(
            {
                "component": {},
                "hierarchy": {"levels": ["site", "device"]},
                "identity": {"site": "plant-1"},
                "messaging": {"local": {"host": "127.0.0.1", "port": broker_port}},
                "health": {"enabled": True, "port": health_port},
                "logging": {"level": "INFO"},
            }
        )
    )
    return path


def test_component_process_probes_drain_and_exit(tmp_path, broker_later):
    health_port = free_port()
    config = write_config(tmp_path, broker_later.plain_port, health_port)
    log_path = tmp_path / "component.log"
    with echo_process(log_path, "-c", str(config), "-t", "gw-01") as process:
        # Up but not connected: alive, not ready.
        wait_until(lambda: probe(health_port, "/livez") == 200, 20, "the liveness probe")
        assert probe(health_port, "/readyz") == 503
        assert probe(health_port, "/startupz") == 503
        broker_later.start()
        wait_until(lambda: probe(health_port, "/readyz") == 200, 30, "readiness after connect")
        assert probe(health_port, "/startupz") == 200

        client = MessagingClient(
            MessagingConfig(
                local=BrokerConfig(host="127.0.0.1", port=broker_later.plain_port, client_id="t")
            )
        ).start()
        try:
            wait_until(client.connected, 10, "the test client")
            topic = "uns/gw-01/echo/cmd/sb/echo"
            reply = client.request(topic, MessageBuilder("Echo", "1").body({"x": 1}).build())
            assert reply.get(10).body == {"x": 1}
            # A slow request in flight when SIGTERM arrives: the drain waits for it.
            slow = client.request(
                topic, MessageBuilder("Echo", "1").body({"delayMs": 1500}).build()
            )
            wait_until(
                lambda: b"echo: holding the reply" in log_path.read_bytes(),
                10,
                "the slow request to reach the component",
            )
            statuses: list[int | None] = []
            stop_polling = threading.Event()

            def poll_readiness() -> None:
                while not stop_polling.is_set():
                    statuses.append(probe(health_port, "/readyz"))

            poller = threading.Thread(target=poll_readiness)
            poller.start()
            process.send_signal(signal.SIGTERM)
            assert slow.get(15).body == {"delayMs": 1500}, "the in-flight request was answered"
            assert process.wait(20) == 0
            stop_polling.set()
            poller.join(5)
        finally:
            client.close(2)
    output = log_path.read_text()
    # Readiness answered 503 during the drain, before the server went away (None).
    answered = [s for s in statuses if s is not None]
    assert 503 in answered, statuses
    assert 200 not in statuses[statuses.index(503) :], statuses
    order = [
        "shutdown: SIGTERM received",
        "shutdown: readiness off",
        "shutdown: draining echo",
        "shutdown: draining messaging",
        "shutdown: health server stopped",
        "shutdown: complete",
    ]
    positions = [output.find(line) for line in order]
    assert all(p >= 0 for p in positions), output[-3000:]
    assert positions == sorted(positions), output[-3000:]


@pytest.mark.integration
def test_bad_configuration_exits_2_and_starts_nothing(tmp_path):
    health_port = free_port()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"component": {}, "health": {"enabled": True, "port": health_port}}))
    result = subprocess.run(
        [sys.executable, "-m", "unskit.cli", "run", "echo", "-c", str(path), "-t", "gw-01"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "$.messaging" in result.stderr
    assert "embedded" in result.stderr
    assert probe(health_port, "/livez") is None


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unskit.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_configuration_refused_at_start_up_is_one_line_without_a_traceback(tmp_path, broker):
    # The ethernet-ip-adapter refuses, once messaging is up, a document with no valid instance.
    path = tmp_path / "cip.json"
    document = json.loads(write_config(tmp_path, broker.plain_port, free_port()).read_text())
    document["component"] = {"instances": [{"id": "press-1", "adapter": "sim"}]}
    path.write_text(json.dumps(document))
    result = run_cli("ethernet-ip-adapter", "-c", str(path), "-t", "gw-01")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [x for x in result.stderr.splitlines() if "no valid instance" in x]
    assert line.startswith("unskit run ethernet-ip-adapter: configuration error:"), line


def test_a_log_file_that_cannot_be_opened_is_one_line_and_exit_2(tmp_path, broker):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    document = json.loads(write_config(tmp_path, broker.plain_port, free_port()).read_text())
    document["logging"] = {"fileLogging": {"enabled": True, "filePath": f"{blocker}/echo.log"}}
    path = tmp_path / "echo-file.json"
    path.write_text(json.dumps(document))
    result = run_cli("echo", "-c", str(path), "-t", "gw-01")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [x for x in result.stderr.splitlines() if "fileLogging" in x]
    assert "$.logging.fileLogging.filePath: cannot be opened" in line, line


@pytest.mark.integration
def test_embedded_broker_override(tmp_path):
    broker_port, health_port = free_port(), free_port()
    config = write_config(tmp_path, 1, health_port)
    log_path = tmp_path / "component.log"
    with echo_process(
        log_path, "-c", str(config), "-t", "gw-01", "--broker", f"embedded:{broker_port}"
    ) as process:
        wait_until(
            lambda: probe(health_port, "/readyz") == 200, 30, "readiness on the embedded broker"
        )
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 0
    output = log_path.read_text()
    assert f"embedded MQTT broker listening on 127.0.0.1:{broker_port}" in output
    assert output.find("shutdown: draining embedded broker") < output.find(
        "shutdown: health server stopped"
    )


def test_mounted_directory_change_is_followed(tmp_path, broker):
    health_port = free_port()
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    document = json.loads(write_config(tmp_path, broker.plain_port, health_port).read_text())
    (mounted / "config.json").write_text(json.dumps(document))
    log_path = tmp_path / "component.log"
    with echo_process(
        log_path, "-c", str(mounted), "-t", "gw-01", "--platform", "CLUSTER"
    ) as process:
        wait_until(lambda: probe(health_port, "/readyz") == 200, 30, "readiness")
        wait_until(lambda: "echo running" in log_path.read_text(), 10, "the start-up to end")
        # CLUSTER defaults to the JSON sink: one object per line.
        assert json.loads(log_path.read_text().splitlines()[0])["level"] == "INFO"
        document["logging"] = {"level": "DEBUG"}
        document["tags"] = {"shift": "night"}
        staged = mounted / ".config.json.tmp"
        staged.write_text(json.dumps(document))
        staged.replace(mounted / "config.json")
        wait_until(lambda: "restart it to apply the rest" in log_path.read_text(), 20, "the change")
        assert probe(health_port, "/readyz") == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    levels = [json.loads(line)["level"] for line in log_path.read_text().splitlines()]
    assert "DEBUG" in levels, "the new logging level applied live"


def test_a_failed_start_up_stops_what_already_started(tmp_path, broker, restore_root_logging):
    import socket

    from unskit.config import load_config
    from unskit.errors import ConfigError
    from unskit.runtime.component import Runtime
    from unskit.runtime.echo import EchoComponent

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        scrape_port = taken.getsockname()[1]
        health_port = free_port()
        document = json.loads(write_config(tmp_path, broker.plain_port, health_port).read_text())
        document["metricEmission"] = {"target": "scrape", "targetConfig": {"port": scrape_port}}
        path = tmp_path / "scrape.json"
        path.write_text(json.dumps(document))
        config = load_config(path, thing="gw-02", default_component="echo")
        runtime = Runtime(config)
        with pytest.raises(ConfigError, match=r"\$\.metricEmission\.targetConfig\.port.*in use"):
            runtime.start(EchoComponent())
    assert runtime.shutting_down
    assert not runtime.get_messaging().connected()
    assert runtime.health is not None, "the probe server had started"
    assert probe(health_port, "/livez") is None, "and was stopped again"


def test_a_scrape_port_in_use_is_one_line_naming_the_key_and_exit_2(tmp_path, broker):
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        scrape_port = taken.getsockname()[1]
        document = json.loads(write_config(tmp_path, broker.plain_port, free_port()).read_text())
        document["metricEmission"] = {"target": "scrape", "targetConfig": {"port": scrape_port}}
        path = tmp_path / "scrape.json"
        path.write_text(json.dumps(document))
        result = run_cli("echo", "-c", str(path), "-t", "gw-01")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [line] = [x for x in result.stderr.splitlines() if "$.metricEmission" in x]
    assert line.startswith("unskit run echo: configuration error:"), line
    assert f"$.metricEmission.targetConfig.port: port {scrape_port} cannot be bound" in line
    assert "in use" in line, line
    assert "[ERROR]" not in result.stderr, result.stderr


# A stop signal that lands while a logging handler's lock is held, in a component whose drain
# joins a thread that logs: a drain run inside the signal handler waits for that thread while
# holding the lock the thread waits for (the deadlock `unskit run echo` hit at random).
_SIGNAL_WHILE_LOGGING = """
import logging, signal, sys, threading
from unskit.config.loader import load_config
from unskit.runtime.component import Runtime

log = logging.getLogger("unskit.test")

class SignalOnRunning(logging.Handler):
    def emit(self, record):
        if record.getMessage() == "logger running":
            signal.raise_signal(signal.SIGTERM)  # the Python handler runs here, this lock held

class LoggerAtDrain:
    token = "logger"
    schema = None

    def start(self, runtime):
        self.go = threading.Event()
        self.thread = threading.Thread(target=lambda: self.go.wait() and log.info("drained"))
        self.thread.start()

    def drain(self):
        self.go.set()
        self.thread.join()

logging.getLogger("unskit").addHandler(SignalOnRunning())
config = load_config(sys.argv[1], thing="gw-01", default_component="logger")
sys.exit(Runtime(config).run(LoggerAtDrain()))
"""


def test_a_stop_signal_while_a_log_line_is_written_drains_and_exits_zero(broker, tmp_path):
    config = write_config(tmp_path, broker.plain_port, free_port())
    script = tmp_path / "signal_while_logging.py"
    script.write_text(_SIGNAL_WHILE_LOGGING)
    with subprocess.Popen(
        [sys.executable, str(script), str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            pytest.fail("the drain deadlocked: a stop signal while a log line was written")
        stderr = process.stderr.read() if process.stderr else ""
    assert code == 0, stderr
    assert "shutdown: complete" in stderr


def test_requests_sent_while_echo_is_down_are_answered_by_its_next_run(broker, tmp_path):
    config = write_config(tmp_path, broker.plain_port, free_port())
    document = json.loads(config.read_text())
    # Its own session, so no other test's subscriptions or backlog mix in.
    document["messaging"]["local"]["clientId"] = f"echo-{tmp_path.name}"
    config.write_text(json.dumps(document))
    topic = "uns/gw-01/echo/cmd/sb/echo"
    client = MessagingClient(
        MessagingConfig(
            local=BrokerConfig(host="127.0.0.1", port=broker.plain_port, client_id="t-down")
        )
    ).start()
    try:
        assert client.wait_connected(10)
        args = ("-c", str(config), "-t", "gw-01")
        with echo_process(tmp_path / "first.log", *args) as first:
            wait_until(lambda: _echoes(client, topic), 20, "the first run answering")
            first.send_signal(signal.SIGTERM)
            assert first.wait(30) == 0
        # Sent while nothing runs: QoS 1, so the broker keeps them for echo's session.
        bodies = [{"n": n} for n in range(3)]
        futures = [
            client.request(topic, MessageBuilder("Echo", "1.0").body(body).build(), timeout_secs=30)
            for body in bodies
        ]
        assert not any(future.done() for future in futures)
        with echo_process(tmp_path / "second.log", *args) as second:
            assert [future.get(20).body for future in futures] == bodies
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
    finally:
        client.close()


def _echoes(client: MessagingClient, topic: str) -> bool:
    request = MessageBuilder("Echo", "1.0").body({"ping": True}).build()
    try:
        return client.request(topic, request, timeout_secs=1).get(2).body == {"ping": True}
    except Exception:
        return False
