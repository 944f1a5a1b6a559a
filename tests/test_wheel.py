"""The wheel as users install it: `make wheel`'s artifacts checked (auditwheel, twine), then the
wheel installed into a fresh virtual environment with no Rust toolchain on PATH and no source
tree on sys.path, and run: `unskit --help`, `unskit validate` on every example, `unskit demo`
naming the extra it lacks, and the echo component answering a request through its embedded
broker."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.support.servers import free_port, readyz, wait_until
from tests.support.wheel import ROOT, built, fill_wheelhouse, pip, wheelhouse
from unskit import MessageBuilder
from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

EXAMPLES = sorted((ROOT / "examples").glob("*.json"))
#: The one extra the fresh environment gets: the echo check needs its broker.
EXTRA = "embedded"
#: Examples whose component needs an SDK extra that environment lacks: `unskit validate`
#: refuses them with the pip command that installs it.
NEEDS_EXTRA = {
    # Discovery on: the example's WS-Discovery identifies ONVIF devices through zeep.
    "camera-adapter.json": "onvif",
    "signal-recorder.json": "recorder",
    "file-egress-blobstore.json": "blobstore",
    "file-egress-bucketstore.json": "bucketstore",
    "file-egress-http.json": "http",
    "opcua-adapter.json": "opcua",
}

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass(frozen=True)
class Artifacts:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class Installed:
    venv: Path
    env: dict[str, str]
    cwd: Path

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def artifacts() -> Artifacts:
    return Artifacts(built("unskit-*.whl"), built("unskit-*.tar.gz"))


def _without_rust(path: str) -> str:
    """PATH less every folder holding a Rust toolchain or the development environment."""
    dev_bin = Path(sys.executable).parent
    kept = [
        d
        for d in path.split(os.pathsep)
        if d
        and Path(d) != dev_bin
        and not any((Path(d) / tool).exists() for tool in ("cargo", "rustc", "maturin"))
    ]
    return os.pathsep.join(kept)


@pytest.fixture(scope="module")
def installed(artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    home = tmp_path_factory.mktemp("wheel")
    venv = home / "venv"
    # The interpreter the development environment was made from, not that environment.
    base = getattr(sys, "_base_executable", sys.executable)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
        and not k.startswith(("CARGO", "RUSTUP", "MATURIN", "PYO3"))
    }
    env["PATH"] = os.pathsep.join([str(venv / "bin"), _without_rust(os.environ["PATH"])])
    assert shutil.which("cargo", path=env["PATH"]) is None
    assert shutil.which("rustc", path=env["PATH"]) is None
    # Without pip of its own: the development environment's pip installs into it (--python),
    # which spares ensurepip; --no-compile spares byte-compiling ~300 MB of dependencies.
    subprocess.run(
        [base, "-m", "venv", "--without-pip", str(venv)], check=True, env=env, timeout=60
    )
    requirement = f"{artifacts.wheel}[{EXTRA}]"
    with wheelhouse() as folder:
        local = ["--no-index", "--find-links", str(folder)]
        install = pip(env, home, "--python", str(venv / "bin" / "python"), "install", *local)
        result = install("--no-compile", requirement)
        if result.returncode != 0:
            # A dependency not in the wheelhouse yet (the first run, a new pin): fetch it once.
            fill_wheelhouse(folder, requirement, env, home)
            result = install("--no-compile", requirement)
    assert result.returncode == 0, result.stdout + result.stderr
    return Installed(venv, env, home)


def test_auditwheel_reports_the_manylinux_policy_of_the_wheels_tag(artifacts):
    result = subprocess.run(
        [_tool("auditwheel"), "show", str(artifacts.wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    found = re.search(r'consistent with the following platform tag: "(manylinux_\w+)"', text)
    assert found, text
    # unskit-0.1.0-cp311-abi3-manylinux_2_34_x86_64.whl
    name, _version, python, abi, platforms = artifacts.wheel.stem.split("-")
    assert (name, python, abi) == ("unskit", "cp311", "abi3")
    assert found.group(1) in platforms.split("."), (found.group(1), platforms)
    assert found.group(1).endswith("_x86_64")


def test_twine_check_passes_the_wheel_and_the_sdist(artifacts):
    result = subprocess.run(
        [_tool("twine"), "check", "--strict", str(artifacts.wheel), str(artifacts.sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_the_installed_package_is_the_wheels_not_the_source_tree(installed):
    probe = (
        "import json, sys, unskit, unskit._core;"
        "print(json.dumps({'unskit': unskit.__file__, 'core': unskit._core.__file__,"
        " 'path': sys.path}))"
    )
    result = installed.run("python", "-c", probe)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    site = installed.venv / "lib"
    assert Path(found["unskit"]).is_relative_to(site), found
    assert Path(found["core"]).is_relative_to(site), found
    assert Path(found["core"]).name == "_core.abi3.so", found
    assert not [p for p in found["path"] if p and Path(p).resolve().is_relative_to(ROOT)], found


#: Runs in the installed environment: a thumbnail of the JPEG at argv[1], the libturbojpeg
#: the process mapped, and the error a corrupt JPEG raises.
THUMBNAIL_PROBE = """
import json, pathlib, sys, unskit
thumb = unskit.thumbnail_from_jpeg(pathlib.Path(sys.argv[1]).read_bytes(), "small")
maps = pathlib.Path("/proc/self/maps").read_text().split()
try:
    unskit.thumbnail_from_jpeg(b"\\xff\\xd8\\xff\\xdb" + bytes(60))
    bad = None
except unskit.ImageError as exc:
    bad = str(exc)
libs = sorted({m for m in maps if "turbojpeg" in m})
print(json.dumps({"size": [thumb.width, thumb.height], "libs": libs, "bad": bad}))
"""


def test_jpeg_thumbnails_run_on_the_libjpeg_turbo_the_wheel_carries(installed):
    jpeg = installed.cwd / "frame.jpg"
    noise = np.random.default_rng(1).integers(0, 256, (480, 640, 3), np.uint8)
    jpeg.write_bytes(cv2.imencode(".jpg", cv2.GaussianBlur(noise, (9, 9), 3))[1].tobytes())
    result = installed.run("python", "-c", THUMBNAIL_PROBE, str(jpeg))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["size"] == [160, 120], found
    # The copy auditwheel bundled (unskit.libs/libturbojpeg-HASH.so.0), not the system's.
    assert len(found["libs"]) == 1, found
    assert Path(found["libs"][0]).is_relative_to(installed.venv), found
    assert "/unskit.libs/libturbojpeg" in found["libs"][0], found
    assert str(found["bad"]).startswith("malformed image: JPEG: "), found


def test_help(installed):
    result = installed.run("unskit", "--help")
    assert result.returncode == 0, result.stderr
    for command in ("run", "validate", "demo"):
        assert re.search(rf"\b{command}\b", result.stdout), result.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_validate_every_example(installed, example):
    component = json.loads(example.read_text())["component"].get("token", example.stem)
    result = installed.run(
        "unskit", "validate", "-c", str(example), "-t", "gw-01", "--component", component
    )
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    extra = NEEDS_EXTRA.get(example.name)
    if extra is None:
        assert result.returncode == 0, output
    else:
        # Refused, and only for the missing extra, with the command that installs it.
        assert result.returncode == 2, output
        assert f"pip install 'unskit[{extra}]'" in output, output


@pytest.mark.parametrize(
    "destination",
    [
        {"id": "s3", "type": "objectstore", "bucket": "bkt"},
        {"id": "nas", "type": "sftp", "host": "127.0.0.1", "username": "u", "password": "p"},
    ],
    ids=lambda d: d["type"],
)
def test_a_backend_without_its_sdk_is_refused_with_the_pip_command(
    installed, tmp_path, destination
):
    document = json.loads((ROOT / "examples" / "file-egress.json").read_text())
    document["component"]["instances"][0]["egress"] = [destination]
    config = tmp_path / "egress.json"
    config.write_text(json.dumps(document))
    result = installed.run("unskit", "validate", "-c", str(config), "-t", "gw-01")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "$.component.instances[0].egress[0].type" in output, output
    assert "pip install 'unskit[egress]'" in output, output


def test_echo_answers_through_its_embedded_broker(installed, tmp_path):
    broker_port, health_port = free_port(), free_port()
    config = tmp_path / "echo.json"
    document = json.loads((ROOT / "examples" / "echo.json").read_text())
    document["messaging"]["local"]["port"] = broker_port
    document["health"]["port"] = health_port
    config.write_text(json.dumps(document))
    log_path = tmp_path / "echo.log"
    with _Process(installed, log_path, "unskit", "run", "echo", "-c", str(config), "-t", "gw-01"):
        wait_until(lambda: readyz(health_port) == 200, 60, "the installed echo to be ready")
        client = MessagingClient(
            MessagingConfig(
                local=BrokerConfig(host="127.0.0.1", port=broker_port, client_id="wheel-test")
            )
        ).start()
        try:
            wait_until(client.connected, 10, "a connection to the echo's embedded broker")
            request = MessageBuilder("Echo", "1").body({"from": "the wheel"}).build()
            reply = client.request("uns/gw-01/echo/cmd/sb/echo", request).get(10)
            assert reply.body == {"from": "the wheel"}
        finally:
            client.close(2)
    output = log_path.read_text()
    assert f"embedded MQTT broker listening on 127.0.0.1:{broker_port}" in output, output
    assert "Traceback" not in output, output


def test_the_demo_without_the_opcua_extra_names_its_pip_command(installed, tmp_path):
    # The environment has the `embedded` extra only; the demo also runs the OPC UA server
    # and adapter (asyncua), so it refuses before starting anything and says what to add.
    output_dir = tmp_path / "demo-output"
    result = installed.run("unskit", "demo", "--output", str(output_dir), "--duration", "5")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    assert "'asyncua'" in result.stderr, output
    assert result.stderr.rstrip().endswith("pip install 'unskit[opcua]'"), output
    assert not output_dir.exists(), output


class _Process:
    """`args` run from the fresh environment; SIGTERM at the end must exit it 0."""

    def __init__(self, installed: Installed, log_path: Path, *args: str) -> None:
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [str(installed.venv / "bin" / args[0]), *args[1:]],
            env=installed.env,
            cwd=installed.cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def __enter__(self) -> subprocess.Popen[bytes]:
        return self.process

    def __exit__(self, *exc: object) -> None:
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                code = self.process.wait(30)
                if exc[0] is None:
                    assert code == 0, f"exit {code} after SIGTERM"
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(5)
            self._log.close()


def _tool(name: str) -> str:
    """A checker of the test extra, from PATH (`make test` puts the environment's bin first)."""
    found = shutil.which(name)
    assert found, f"{name} is not on PATH: it is in the test extra (pip install -e '.[test]')"
    return found
