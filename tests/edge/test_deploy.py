"""examples/edge-runtime's recipes deployed onto the real nucleus with the real greengrass-cli:
the built wheel installed offline from the wheelhouse artifact, both adapters RUNNING,
publishing on the IPC bus, answering a command, and held to their accessControl.

The artifact is the one the recipes name: a zip of the unskit wheel (dist/, `make wheel`)
and every dependency wheel, from the wheelhouse tests/test_wheel.py keeps (the index is
asked only for a wheel it lacks, the first run). The nucleus runs with the machine's pip
configuration masked (PIP_CONFIG_FILE=/dev/null) and an index that does not answer, so the
install step can only use the artifact; without PYTHONPATH, so the components run the wheel
in their venv, not this tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import time
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.edge.test_ipc_transport import Inbox
from tests.support.greengrass import ALLOW_ALL, REGION, SOCKET_ENV, THING_NAME, Nucleus
from tests.support.servers import wait_until
from tests.support.wheel import ROOT, built, fill_wheelhouse, pip, wheelhouse
from unskit import MessageBuilder
from unskit.config.messaging import IpcConfig
from unskit.config.model import MessagingConfig
from unskit.edge import IpcConnection, IpcEndpoint, edge_error
from unskit.edge.pubsub import StreamCallbacks, close_stream, publish_binary, subscribe
from unskit.errors import AccessDeniedError, EdgeRuntimeError
from unskit.messaging import MessagingClient

# A deployment's fixture installs two venvs (a first run also fills the wheelhouse): more
# than the suite's 120 s per test may pass before the first test of the module runs.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLE = ROOT / "examples" / "edge-runtime"
ADAPTERS = {
    "com.unskit.EthernetIpAdapter": "ethernet-ip-adapter",
    "com.unskit.CameraAdapter": "camera-adapter",
}
LISTENER = "UnsListener"
#: Installing NumPy, OpenCV and awscrt into two venvs at once on two shared cores.
DEPLOY_TIMEOUT_S = 300


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "greengrass_generate", ROOT / "deploy" / "greengrass" / "generate.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _generator()
VERSION = generate.project_version()


@dataclass
class Deployed:
    nucleus: Nucleus
    seconds: float
    inbox: Inbox
    client: MessagingClient

    def cli(self, *args: str) -> str:
        return _cli(self.nucleus, *args)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _artifacts(tmp_path_factory.mktemp("artifacts"))


def _artifacts(folder: Path) -> Path:
    """artifactDir/NAME/VERSION/unskit-wheelhouse-VERSION.zip for each adapter."""
    wheel = built("unskit-*.whl")
    requirement = f"{wheel}[edge]"
    with wheelhouse() as cached:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        probe = folder / "probe"
        resolve = pip(env, folder, "download", "--no-index", "--find-links", str(cached))
        check = resolve("--dest", str(probe), requirement)
        if check.returncode != 0:
            # A dependency the wheelhouse lacks (its first run, a new pin): the index, once.
            fill_wheelhouse(cached, requirement, env, folder)
            check = resolve("--dest", str(probe), requirement)
        assert check.returncode == 0, check.stdout + check.stderr
        # Exactly the wheels `unskit[edge]` needs, as pip resolved them (no index).
        wanted = sorted(p.name for p in (folder / "probe").glob("*.whl"))
    house = generate.wheelhouse_name(VERSION)
    archive = folder / f"{house}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zipped:
        for name in wanted:
            zipped.write(folder / "probe" / name, name)
    root = folder / "artifacts"
    for component in ADAPTERS:
        target = root / component / VERSION
        target.mkdir(parents=True)
        os.link(archive, target / archive.name)
    return root


def _nucleus_environ() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"} and not k.startswith("PIP_")
    }
    # The machine's pip configuration (its find-links) masked, and an index that refuses at
    # once: the install step has the artifact and nothing else.
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_INDEX_URL"] = "http://127.0.0.1:9/simple"
    return env


def _cli(nucleus: Nucleus, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        [str(nucleus.root / "bin" / "greengrass-cli"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    return done.stdout + done.stderr


def _status(nucleus: Nucleus, deployment_id: str) -> str:
    out = _cli(nucleus, "deployment", "status", "-i", deployment_id, check=False)
    if "Cannot find deployment" in out:
        return "NOT-YET-QUEUED"  # asked before the nucleus registered it
    # "<id>: SUCCEEDED" (the CLI's `deployment list` says "Status: SUCCEEDED").
    found = re.search(rf"{re.escape(deployment_id)}: (\w+)", out)
    assert found, out
    return found[1]


def _deploy(
    nucleus: Nucleus,
    recipes: Path,
    artifacts: Path | None,
    *components: str,
    update_config: Mapping[str, Any] | None = None,
    expect: str = "SUCCEEDED",
) -> float:
    """`greengrass-cli deployment create` merging `components` (NAME=VERSION), with
    `update_config` (`--update-config`); the seconds until it ended as `expect`."""
    started = time.monotonic()
    more = [arg for c in components for arg in ("--merge", c)]
    if artifacts is not None:
        more += ["--artifactDir", str(artifacts)]
    if update_config is not None:
        more += ["--update-config", json.dumps(update_config)]
    out = _cli(nucleus, "deployment", "create", "--recipeDir", str(recipes), *more)
    found = re.search(r"Deployment Id: (\S+)", out)
    assert found, out
    deployment_id = found[1]
    wait_until(
        lambda: _status(nucleus, deployment_id) in {"SUCCEEDED", "FAILED"},
        DEPLOY_TIMEOUT_S,
        f"the deployment of {components} to finish",
        interval=0.5,
    )
    status = _status(nucleus, deployment_id)
    logs = {c: nucleus.log(c.split("=")[0])[-4000:] for c in components}
    assert status == expect, (status, logs, nucleus.log()[-4000:])
    return time.monotonic() - started


def _start_nucleus() -> Nucleus:
    nucleus = Nucleus(
        [],
        cli=True,
        # The recipes' accessControl names {iot:thingName}: interpolated only with this on.
        nucleus_configuration={"interpolateComponentConfiguration": True},
        environ=_nucleus_environ(),
    ).start()
    try:
        wait_until((nucleus.root / "bin" / "greengrass-cli").exists, 60, "the CLI installed")
    except BaseException:
        nucleus.remove()
        raise
    return nucleus


def _listener(nucleus: Nucleus, folder: Path) -> MessagingClient:
    """A deployed component that only writes its SVCUID (every pub/sub operation allowed),
    and a client in this process acting as it. It is deployed, not a harness of the nucleus's
    initial configuration: a deployment drops services that no deployment holds, and with
    them their accessControl."""
    recipes = folder / "listener-recipes"
    recipes.mkdir()
    recipe = {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": LISTENER,
        "ComponentVersion": "1.0.0",
        "ComponentConfiguration": {"DefaultConfiguration": {"accessControl": ALLOW_ALL}},
        "Manifests": [
            {
                "Platform": {"os": "linux"},
                "Lifecycle": {"run": 'printf %s "$SVCUID" > {work:path}/svcuid; exec sleep 36000'},
            }
        ],
    }
    (recipes / f"{LISTENER}-1.0.0.json").write_text(json.dumps(recipe))
    _deploy(nucleus, recipes, None, f"{LISTENER}=1.0.0")
    svcuid = nucleus.root / "work" / LISTENER / "svcuid"
    wait_until(lambda: svcuid.exists() and svcuid.read_text(), 30, "the listener's SVCUID")
    config = MessagingConfig(
        local=None, local_ipc=IpcConfig(client_id="deploy-test"), request_timeout_seconds=10
    )
    client = MessagingClient(config, environ=_environ_of(nucleus, svcuid.read_text())).start()
    assert client.wait_connected(15), "the listener's IPC link did not come up"
    return client


def _environ_of(nucleus: Nucleus, svcuid: str) -> dict[str, str]:
    """The variables the nucleus hands the component whose token is `svcuid`."""
    return {
        SOCKET_ENV: str(nucleus.socket_path),
        "SVCUID": svcuid,
        "AWS_IOT_THING_NAME": THING_NAME,
        "AWS_REGION": REGION,
    }


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[Deployed]:
    folder = tmp_path_factory.mktemp("deploy")
    nucleus = _start_nucleus()
    client: MessagingClient | None = None
    try:
        client = _listener(nucleus, folder)
        inbox = Inbox()
        for name in ADAPTERS.values():
            client.subscribe(f"uns/{THING_NAME}/{name}/#", inbox)
        assert client.wait_subscribed(10)
        merges = [f"{c}={VERSION}" for c in ADAPTERS]
        seconds = _deploy(nucleus, EXAMPLE / "recipes", artifacts, *merges)
        yield Deployed(nucleus, seconds, inbox, client)
    finally:
        if client is not None:
            client.close()
        nucleus.remove()


def _components(deployment: Deployed) -> dict[str, str]:
    """Component name -> state, from `greengrass-cli component list`."""
    out = deployment.cli("component", "list")
    return dict(re.findall(r"Component Name: (\S+)\s+Version: \S+\s+State: (\w+)", out))


def _install_seconds(nucleus: Nucleus, component: str) -> float:
    """From the install step's start to the startup step's, by the component log."""
    starts = {}
    for line in nucleus.log(component).splitlines():
        for step in ("install", "startup"):
            if "shell-runner-start" in line and f"lifecycle.{step}" in line:
                starts.setdefault(step, line.split(" ", 1)[0])
    assert set(starts) == {"install", "startup"}, nucleus.log(component)[-3000:]
    install, startup = (
        datetime.fromisoformat(starts[k].replace("Z", "+00:00")) for k in ("install", "startup")
    )
    return round((startup - install).total_seconds(), 1)


def _process(nucleus: Nucleus, component: str) -> int:
    """The pid of the component's `unskit run` (the startup step exec'd it)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _runs(nucleus, component, int(entry.name)):
            return int(entry.name)
    raise AssertionError(f"no process of {component} runs")


def _runs(nucleus: Nucleus, component: str, pid: int) -> bool:
    """Whether process `pid` is the component's `unskit run`."""
    venv = str(nucleus.root / "work" / component / "venv" / "bin" / "unskit")
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.decode(errors="replace") == venv for a in argv)


def test_both_adapters_deploy_and_report_running(deployed: Deployed) -> None:
    states = _components(deployed)
    assert {c: states.get(c) for c in ADAPTERS} == dict.fromkeys(ADAPTERS, "RUNNING"), states
    for component in ADAPTERS:
        log = deployed.nucleus.log(component)
        assert "lifecycle state RUNNING reported to the edge runtime" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    # How long `deployment create` to SUCCEEDED took, and each install step, for the record.
    installs = {c: _install_seconds(deployed.nucleus, c) for c in ADAPTERS}
    print(f"deployment of both adapters: {deployed.seconds:.1f} s, installs {installs}")


def test_the_components_run_the_wheel_installed_offline_in_their_venv(deployed: Deployed) -> None:
    for component in ADAPTERS:
        pid = _process(deployed.nucleus, component)
        environ = dict(
            item.split("=", 1)
            for item in (Path(f"/proc/{pid}/environ").read_text().split("\0"))
            if "=" in item
        )
        assert "PYTHONPATH" not in environ
        site = deployed.nucleus.root / "work" / component / "venv" / "lib"
        probe = subprocess.run(
            [str(site.parent / "bin" / "python"), "-c", "import unskit; print(unskit.__file__)"],
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"]},
            timeout=60,
            check=True,
        )
        assert Path(probe.stdout.strip()).is_relative_to(site), probe.stdout
        # Its configuration is the runtime's (RUNTIME_CONFIG; the live-change test below
        # shows it followed): no file is written or named.
        assert "-c" not in Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert not (deployed.nucleus.root / "work" / component / "config.json").exists()


def test_both_adapters_publish_on_the_ipc_bus(deployed: Deployed) -> None:
    base = f"uns/{THING_NAME}"
    wait_until(
        lambda: any(
            t.startswith(f"{base}/ethernet-ip-adapter/press-1/data/")
            for t in deployed.inbox.topics()
        ),
        30,
        "sim PLC data from the ethernet-ip-adapter",
    )
    wait_until(
        lambda: any(
            t.startswith(f"{base}/camera-adapter/line-1-top/app/image/")
            for t in deployed.inbox.topics()
        ),
        30,
        "a scheduled capture's image event from the camera-adapter",
    )
    # Everything each component published and subscribed to, its policy allowed.
    for component in ADAPTERS:
        log = deployed.nucleus.log(component)
        assert "access denied by the edge runtime" not in log, log[-3000:]
        assert "not authorized" not in log, log[-3000:]


def test_a_command_is_answered_through_the_allowed_topics(deployed: Deployed) -> None:
    # The inbox subscribed to its own filters and the reply went to the caller's lib/reply-
    # topic: both allowed by the recipe, nothing more needed.
    instances = {"ethernet-ip-adapter": "press-1", "camera-adapter": "line-1-top"}
    for name, instance in instances.items():
        request = MessageBuilder("Describe", "1").body({}).build()
        reply = deployed.client.request(f"uns/{THING_NAME}/{name}/cmd/sb/describe", request).get(15)
        assert isinstance(reply.body, dict), reply.body
        assert reply.body["component"] == name, reply.body
        assert reply.body["instances"] == [instance], reply.body
        assert "sb/describe" in {verb["verb"] for verb in reply.body["verbs"]}, reply.body


def _as_the_adapter(deployed: Deployed) -> IpcConnection:
    """An IPC connection that is the deployed ethernet-ip-adapter to the nucleus: its SVCUID,
    read from its process's environment."""
    pid = _process(deployed.nucleus, "com.unskit.EthernetIpAdapter")
    svcuid = next(
        item.split("=", 1)[1]
        for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
        if item.startswith("SVCUID=")
    )
    connection = IpcConnection(IpcEndpoint.from_environment(_environ_of(deployed.nucleus, svcuid)))
    connection.connect()
    return connection


def _refusal(connection: IpcConnection, operation: str, topic: str) -> EdgeRuntimeError | None:
    """What the nucleus answered `operation` on `topic` with: None when it allowed it."""
    if operation == "publish":
        future = publish_binary(connection.client, topic, b"x")
        name = "PublishToTopic"
    else:
        callbacks = StreamCallbacks(lambda _t, _p: None, lambda _e: None)
        future, stream = subscribe(connection.client, topic, receive_all=True, callbacks=callbacks)
        name = "SubscribeToTopic"
    error = future.exception(10)
    if operation == "subscribe" and error is None:
        close_stream(stream)
    return None if error is None else edge_error(error, name, topic)


BASE = f"uns/{THING_NAME}/ethernet-ip-adapter"


@pytest.mark.parametrize(
    ("operation", "topic", "allowed"),
    [
        ("publish", f"{BASE}/press-1/data/fast/spindle-speed", True),
        ("publish", f"{BASE}/state", True),
        ("publish", f"lib/reply-{THING_NAME}-someone/1", True),
        ("subscribe", f"{BASE}/cmd/sb/+", True),
        ("subscribe", f"{BASE}/+/cmd/sb/+", True),
        ("subscribe", f"lib/reply-{THING_NAME}-ethernet-ip-adapter/#", True),
        # Another component's topics, another gateway's, and any wider filter: refused.
        ("publish", f"uns/{THING_NAME}/camera-adapter/line-1-top/data/x", False),
        ("publish", "uns/gw-02/ethernet-ip-adapter/press-1/data/x", False),
        ("publish", f"uns/{THING_NAME}/ethernet-ip-adapterX/data/x", False),
        ("subscribe", f"uns/{THING_NAME}/#", False),
        ("subscribe", f"{BASE}/#", False),
        ("subscribe", f"{BASE}/cmd/sb/write", False),
        ("subscribe", f"lib/reply-{THING_NAME}-camera-adapter/#", False),
    ],
)
def test_the_policy_allows_the_components_own_topics_and_nothing_more(
    deployed: Deployed, operation: str, topic: str, allowed: bool
) -> None:
    connection = _as_the_adapter(deployed)
    try:
        refusal = _refusal(connection, operation, topic)
    finally:
        connection.close()
    if allowed:
        assert refusal is None, refusal
    else:
        assert isinstance(refusal, AccessDeniedError), refusal


ADAPTER = "com.unskit.EthernetIpAdapter"


@pytest.fixture(scope="module")
def alone(artifacts: Path) -> Iterator[Nucleus]:
    """A nucleus of its own with only the ethernet-ip-adapter: these tests change it."""
    nucleus = _start_nucleus()
    try:
        _deploy(nucleus, EXAMPLE / "recipes", artifacts, f"{ADAPTER}={VERSION}")
        yield nucleus
    finally:
        nucleus.remove()


def test_a_second_deployment_changes_the_configuration_live(alone: Nucleus) -> None:
    pid = _process(alone, ADAPTER)
    update = {ADAPTER: {"MERGE": {"logging": {"level": "DEBUG"}}}}
    _deploy(alone, EXAMPLE / "recipes", None, f"{ADAPTER}={VERSION}", update_config=update)
    wait_until(lambda: "[DEBUG]" in alone.log(ADAPTER), 30, "the adapter logging at DEBUG")
    # Applied by the running process (RUNTIME_CONFIG followed live), not by a restart.
    assert _runs(alone, ADAPTER, pid)


def test_an_invalid_value_fails_the_deployment_and_the_component_runs_on(alone: Nucleus) -> None:
    pid = _process(alone, ADAPTER)
    bad = {"component": {"global": {"defaults": {"pollIntervalMs": -5}}}}
    _deploy(
        alone,
        EXAMPLE / "recipes",
        None,
        f"{ADAPTER}={VERSION}",
        update_config={ADAPTER: {"MERGE": bad}},
        expect="FAILED",
    )
    # Refused before it applied (the validity report), naming the key: never stopped.
    log = alone.log(ADAPTER)
    assert "refused" in log
    assert "$.component.global.defaults.pollIntervalMs" in log
    assert _runs(alone, ADAPTER, pid)
