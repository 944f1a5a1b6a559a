"""The lifecycle state a component reports to the real nucleus, which runs it itself.

Each component is a service of the nucleus started by its `startup` step (the step whose
process the nucleus holds in STARTING until the component reports RUNNING), with the
worktree on PYTHONPATH. Until the IPC messaging transport lands, messaging.local is a local
Mosquitto: the lifecycle report does not depend on the transport. The nucleus's
`greengrass.log` says each state change; `<component>.log` holds the component's output.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.greengrass import Nucleus, service_states, states
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.config.platform import Platform
from unskit.edge import IpcEndpoint
from unskit.edge.lifecycle import LifecycleReporter, LifecycleState, report_failed_start

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
#: The nucleus's default shutdown timeout for a lifecycle step's process.
SHUTDOWN_TIMEOUT_S = 15.0
#: How long a component that must not report is watched after it became ready: its
#: readiness watch polls every 0.1 s, so a report would come well inside this.
QUIET_WINDOW_S = 1.5


def _service(command: str, *, platform: str | None = None) -> dict[str, Any]:
    path = f"{PROJECT / 'python'}:{PROJECT}"
    env = f"PYTHONPATH={shlex.quote(path)}"
    if platform is not None:
        env += f" UNSKIT_PLATFORM={platform}"
    return {"version": "1.0.0", "lifecycle": {"startup": f"{env} exec {command}"}}


def _document(broker: Mosquitto, component: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "component": component,
        "hierarchy": {"levels": ["site", "device"]},
        "identity": {"site": "plant-1"},
        "messaging": {"local": {"host": "127.0.0.1", "port": broker.plain_port}},
        "logging": {"level": "INFO"},
        **more,
    }


class Components:
    """The services of the module's nucleus and the files their tests drive them with."""

    def __init__(self, folder: Path, broker: Mosquitto) -> None:
        self.folder = folder
        self.gate = folder / "gated.gate"
        self.host_gate = folder / "host.gate"
        self.host_ready = folder / "host.ready"
        python = shlex.quote(sys.executable)
        gated = f"{python} -m tests.edge.gated_component -c "
        unskit = f"{python} -m unskit.cli run "
        self.services = {
            "Gated": _service(
                gated + self._write("gated", _document(broker, {"gate": str(self.gate)}))
            ),
            "HostGated": _service(
                gated
                + self._write(
                    "host",
                    _document(
                        broker,
                        {"gate": str(self.host_gate), "readyMarker": str(self.host_ready)},
                        # On HOST the readiness state exists only with the probe server.
                        health={"enabled": True, "port": 0},
                    ),
                ),
                platform=Platform.HOST.value,
            ),
            # No -t: the thing name is the nucleus's AWS_IOT_THING_NAME.
            "Refused": _service(
                unskit + "echo -c " + self._write("refused", _document(broker, {"colour": "red"}))
            ),
            "Echo": _service(unskit + "echo -c " + self._write("echo", _document(broker, {}))),
        }

    def _write(self, name: str, document: dict[str, Any]) -> str:
        path = self.folder / f"{name}.json"
        path.write_text(json.dumps(document))
        return shlex.quote(str(path))


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto) -> Components:
    return Components(tmp_path_factory.mktemp("lifecycle"), broker)


@server_fixture(scope="module")
def nucleus(components: Components) -> Iterator[Nucleus]:
    runtime = Nucleus([], cli=True, services=components.services).start()
    yield runtime
    runtime.remove()


def connected(nucleus: Nucleus, name: str) -> bool:
    """Whether component `name` opened an IPC connection (only the lifecycle report does)."""
    return f"Connection accepted for {name}." in nucleus.log()


def test_running_is_reported_only_once_readiness_is_on(
    nucleus: Nucleus, components: Components
) -> None:
    wait_until(
        lambda: "gated running" in (log := nucleus.log("Gated")) and "link up" in log,
        60,
        "the gated component running with its local link up",
    )
    # Started, connected, serving: only its own gate holds readiness off.
    assert service_states(nucleus, "Gated")[-1] == "STARTING"
    assert not connected(nucleus, "Gated")
    opened = datetime.now().astimezone()
    components.gate.touch()
    wait_until(lambda: "RUNNING" in service_states(nucleus, "Gated"), 15, "Gated RUNNING")
    running_at = next(at for at, state in states(nucleus, "Gated") if state == "RUNNING")
    assert running_at >= opened.replace(microsecond=opened.microsecond // 1000 * 1000)
    wait_until(
        lambda: "lifecycle state RUNNING reported to the edge runtime" in nucleus.log("Gated"),
        5,
        "the component's word that RUNNING was accepted",
    )


def test_a_refused_configuration_is_reported_errored(nucleus: Nucleus) -> None:
    wait_until(lambda: "ERRORED" in service_states(nucleus, "Refused"), 60, "Refused ERRORED")
    wait_until(
        lambda: "lifecycle state ERRORED reported to the edge runtime" in nucleus.log("Refused"),
        10,
        "the component's word that ERRORED was accepted",
    )
    log = nucleus.log("Refused")
    assert "$.component" in log
    assert connected(nucleus, "Refused")
    assert "Traceback" not in log
    assert "RUNNING" not in service_states(nucleus, "Refused")


def test_the_nucleus_stopping_a_component_drains_it_with_exit_0(nucleus: Nucleus) -> None:
    wait_until(lambda: "RUNNING" in service_states(nucleus, "Echo"), 60, "Echo RUNNING")
    cli = nucleus.root / "bin" / "greengrass-cli"
    wait_until(cli.exists, 60, "the greengrass CLI installed")
    asked = time.monotonic()
    subprocess.run(
        [str(cli), "component", "stop", "--names", "Echo"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    wait_until(
        lambda: "Startup script exited" in nucleus.log("Echo"),
        SHUTDOWN_TIMEOUT_S + 10,
        "the Echo process exited",
    )
    took = time.monotonic() - asked
    log = nucleus.log("Echo")
    assert "exitCode=0" in log, log[-3000:]
    assert "shutdown: complete" in log
    assert "Traceback" not in log
    assert took < SHUTDOWN_TIMEOUT_S, f"the component took {took:.1f} s to stop"
    assert service_states(nucleus, "Echo")[-1] in ("STOPPING", "FINISHED")


def test_outside_the_edge_runtime_nothing_is_reported(
    nucleus: Nucleus, components: Components
) -> None:
    components.host_gate.touch()
    wait_until(components.host_ready.exists, 60, "the HOST component ready")
    deadline = time.monotonic() + QUIET_WINDOW_S
    while time.monotonic() < deadline:
        assert not connected(nucleus, "HostGated")
        assert "RUNNING" not in service_states(nucleus, "HostGated")
        time.sleep(0.1)
    assert "lifecycle state" not in nucleus.log("HostGated")


def test_no_reporter_off_the_edge_runtime_or_without_its_variables(nucleus: Nucleus) -> None:
    env = {
        "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT": str(nucleus.socket_path),
        "SVCUID": "x",
    }
    assert LifecycleReporter.for_component(False, env) is None
    assert LifecycleReporter.for_component(True, {}) is None
    assert not report_failed_start(False, env)
    assert not report_failed_start(True, {})


def test_a_failed_report_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reporter = LifecycleReporter(IpcEndpoint(str(tmp_path / "ipc.socket"), "token"))
    assert not reporter.report(LifecycleState.RUNNING)
    assert reporter.reported == ()
    assert "lifecycle state RUNNING not reported" in caplog.text
    assert "no IPC socket" in caplog.text


def test_a_refused_token_is_logged_not_raised(
    nucleus: Nucleus, caplog: pytest.LogCaptureFixture
) -> None:
    reporter = LifecycleReporter(IpcEndpoint(str(nucleus.socket_path), "NOT-A-TOKEN"))
    assert not reporter.report(LifecycleState.ERRORED)
    assert "could not connect to the edge runtime" in caplog.text
