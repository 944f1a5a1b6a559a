"""The real edge-runtime nucleus (AWS IoT Greengrass v2) for tests, started offline.

The nucleus comes from `UNSKIT_GREENGRASS_DIR`, else `../shared/greengrass/` beside the
project (README, "The edge runtime in tests"). Each `Nucleus` runs in a short temporary root
(the IPC socket path must stay under 108 bytes) with harness components: each writes the
SVCUID the nucleus gave it to a file and sleeps, so a test process that sets that token and
the socket variable speaks IPC as that component, under that component's accessControl.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.servers import require_binary, wait_until

#: Where the nucleus jars are; defaults to ../shared/greengrass beside the project.
GREENGRASS_DIR_ENV = "UNSKIT_GREENGRASS_DIR"
_CHECKOUT = Path(__file__).resolve().parents[2]
THING_NAME = "gw-01"
REGION = "us-east-1"
SOCKET_ENV = "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"
#: The CLI service's version: its client must be unpacked under it, where the service's
#: bin/greengrass-cli symlink points.
CLI_VERSION = "2.14.0"
#: Everything allowed: the harness of tests that are not about permissions.
ALLOW_ALL: dict[str, Any] = {
    "aws.greengrass.ipc.pubsub": {"harness:pubsub:1": {"operations": ["*"], "resources": ["*"]}},
    "aws.greengrass.ShadowManager": {"harness:shadow:1": {"operations": ["*"], "resources": ["*"]}},
    "aws.greengrass.ipc.mqttproxy": {
        "harness:mqttproxy:1": {"operations": ["*"], "resources": ["*"]}
    },
}


def _project_dirs() -> list[Path]:
    """This checkout, and the project it came from: a clone's origin, a worktree's main
    checkout (a fresh clone in /tmp has no ../shared of its own)."""
    found = [_CHECKOUT]
    for args in (["config", "--get", "remote.origin.url"], ["rev-parse", "--git-common-dir"]):
        done = subprocess.run(
            ["git", "-C", str(_CHECKOUT), *args], capture_output=True, text=True, check=False
        )
        path = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
        if path is not None and path.is_absolute() and path.exists():
            found.append(path.parent if path.name == ".git" else path)
    return found


def greengrass_dir() -> Path:
    """The folder holding Greengrass.jar; RuntimeError naming the variable when absent."""
    given = os.environ.get(GREENGRASS_DIR_ENV)
    candidates = (
        [Path(given)] if given else [p.parent / "shared" / "greengrass" for p in _project_dirs()]
    )
    for folder in candidates:
        if (folder / "Greengrass.jar").is_file():
            return folder
    tried = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise RuntimeError(
        f"the edge-runtime nucleus is not at {tried}: set {GREENGRASS_DIR_ENV} to a folder "
        "holding Greengrass.jar (README, 'The edge runtime in tests', says how to build it)"
    )


@dataclass(frozen=True)
class Harness:
    """A component the nucleus runs only so that a test process can use its identity."""

    name: str
    access_control: Mapping[str, Any] = field(default_factory=lambda: ALLOW_ALL)
    #: More of its configuration (GetConfiguration answers with it), beside accessControl.
    configuration: Mapping[str, Any] = field(default_factory=dict)


class Nucleus:
    """One nucleus process in its own root, with harness components and optional services."""

    def __init__(
        self,
        harnesses: Sequence[Harness],
        *,
        shadow_manager: bool = False,
        cli: bool = False,
        services: Mapping[str, Any] | None = None,
        nucleus_configuration: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        system: Mapping[str, Any] | None = None,
    ) -> None:
        """`system`: more keys of the config's `system` block (the device certificate, key
        and root CA the nucleus presents to its cloud MQTT endpoint)."""
        self.jars = greengrass_dir()
        self.root = Path(tempfile.mkdtemp(prefix="gg.", dir="/tmp"))
        self.harnesses = {h.name: h for h in harnesses}
        self.shadow_manager = shadow_manager
        self.cli = cli
        self.services = dict(services or {})
        self.nucleus_configuration = dict(nucleus_configuration or {})
        #: The nucleus's environment, which every component it runs inherits (None: this
        #: process's).
        self.environ = None if environ is None else dict(environ)
        self.system = dict(system or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.root / "ipc.socket"

    def log(self, component: str = "greengrass") -> str:
        """A component's log under the root (the nucleus's own by default), '' if none yet."""
        path = self.root / "logs" / f"{component}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _svcuid_file(self, name: str) -> Path:
        return self.root / f"{name}.svcuid"

    def config_document(self) -> dict[str, Any]:
        nucleus: dict[str, Any] = {
            "awsRegion": REGION,
            "deploymentPollingFrequencySeconds": 1,
            "runWithDefault": {"posixUser": "root:root"},
            **self.nucleus_configuration,
        }
        services: dict[str, Any] = {
            "aws.greengrass.Nucleus": {"componentType": "NUCLEUS", "configuration": nucleus},
        }
        dependencies = list(self.harnesses)
        for harness in self.harnesses.values():
            services[harness.name] = {
                "version": "1.0.0",
                "lifecycle": {
                    "run": f'printf %s "$SVCUID" > {self._svcuid_file(harness.name)}; '
                    "exec sleep 36000"
                },
                "configuration": {
                    **harness.configuration,
                    "accessControl": dict(harness.access_control),
                },
            }
        if self.shadow_manager:
            services["aws.greengrass.ShadowManager"] = {
                "version": "2.3.0",
                "configuration": {
                    "rateLimits": {
                        "maxLocalRequestsPerSecondPerThing": 1000,
                        "maxTotalLocalRequestsRate": 1000,
                    }
                },
            }
            dependencies.append("aws.greengrass.ShadowManager")
        if self.cli:
            services["aws.greengrass.Cli"] = {"version": CLI_VERSION}
            dependencies.append("aws.greengrass.Cli")
        services.update(self.services)
        dependencies.extend(n for n in self.services if n not in dependencies)
        services["main"] = {"dependencies": dependencies}
        return {
            "system": {"rootpath": str(self.root), "thingName": THING_NAME, **self.system},
            "services": services,
        }

    def start(self, timeout: float = 90.0) -> Nucleus:
        """Starts the nucleus; returns once every harness has run (its SVCUID is written)."""
        java = require_binary("java")
        for name in self.harnesses:
            self._svcuid_file(name).unlink(missing_ok=True)
        config = self.root / "config.yaml"
        # YAML is a superset of JSON: the nucleus reads this file as it is.
        config.write_text(json.dumps(self.config_document(), indent=2))
        if self.cli:
            self._unpack_cli()
        jars = [self.jars / "Greengrass.jar"]
        jars += [
            self.jars / jar
            for jar in ("aws.greengrass.ShadowManager.jar", "CliServer.jar")
            if (self.jars / jar).is_file()
        ]
        command = [
            java, f"-Droot={self.root}", "-Dlog.store=FILE",
            "-Daws.greengrass.scanSelfClasspath=true",
            "-cp", ":".join(str(j) for j in jars),
            "com.aws.greengrass.easysetup.GreengrassSetup",
            "--root", str(self.root), "--init-config", str(config),
            "--component-default-user", "root:root", "--setup-system-service", "false",
            "--provision", "false", "--start", "true",
        ]  # fmt: skip
        with (self.root / "nucleus.out").open("ab") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.environ,
            )
        wait_until(
            lambda: (
                self._alive()
                and self.socket_path.exists()
                and all(self._svcuid_file(n).exists() for n in self.harnesses)
            ),
            timeout,
            f"the nucleus in {self.root} running its harness components",
            interval=0.05,
        )
        return self

    def _alive(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            out = (self.root / "nucleus.out").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the nucleus exited ({self.process.returncode}): {out}")
        return True

    def _unpack_cli(self) -> None:
        target = (
            self.root / "packages" / "artifacts-unarchived" / "aws.greengrass.Cli" / CLI_VERSION
            / "aws.greengrass.cli.client"
        )  # fmt: skip
        if not target.exists():
            target.mkdir(parents=True)
            shutil.unpack_archive(self.jars / "cliclient.zip", target, "zip")

    def svcuid(self, name: str) -> str:
        """The token the nucleus gave harness `name` in this run."""
        return self._svcuid_file(name).read_text().strip()

    def component_env(self, name: str) -> dict[str, str]:
        """The variables the nucleus hands harness `name`, for a process acting as it."""
        return {
            SOCKET_ENV: str(self.socket_path),
            "SVCUID": self.svcuid(name),
            "AWS_IOT_THING_NAME": THING_NAME,
            "AWS_REGION": REGION,
        }

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM (the nucleus stops its components first), SIGKILL after `grace_s`."""
        process = self.process
        if process is None:
            return
        self.process = None
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        # Components the nucleus ran live in its session; none may outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL of the nucleus and its components: the runtime gone without a word."""
        process = self.process
        if process is None:
            return
        self.process = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def harness_recipe(self, name: str) -> dict[str, Any]:
        """A recipe for harness `name` as the fixture defines it (same run line, its
        configuration and accessControl as DefaultConfiguration), for a local deployment
        that changes its configuration."""
        harness = self.harnesses[name]
        return {
            "RecipeFormatVersion": "2020-01-25",
            "ComponentName": name,
            "ComponentVersion": "1.0.0",
            "ComponentConfiguration": {
                "DefaultConfiguration": {
                    **harness.configuration,
                    "accessControl": dict(harness.access_control),
                }
            },
            "Manifests": [
                {
                    "Platform": {"os": "linux"},
                    "Lifecycle": {
                        "Run": f'printf %s "$SVCUID" > {self._svcuid_file(name)}; exec sleep 36000'
                    },
                }
            ],
        }

    def deploy_configuration(
        self, name: str, merge: Mapping[str, Any], timeout: float = 90.0
    ) -> tuple[str, str]:
        """A local deployment (Greengrass CLI, `cli=True`) merging `merge` into harness
        `name`'s configuration; waits until it has finished and returns (status, the CLI's
        status output, which holds the failure message).

        Every harness is in the deployment: one defined only in config.yaml and left out
        would be removed by it (measured: GetConfiguration of it is then ResourceNotFound)."""
        recipes = self.root / "recipes"
        recipes.mkdir(exist_ok=True)
        merges: list[str] = []
        for harness in self.harnesses:
            recipe = json.dumps(self.harness_recipe(harness))
            (recipes / f"{harness}-1.0.0.json").write_text(recipe)
            merges += ["--merge", f"{harness}=1.0.0"]
        created = self.cli_command(
            "deployment", "create", "--recipeDir", str(recipes), *merges,
            "--update-config", json.dumps({name: {"MERGE": dict(merge)}}),
        )  # fmt: skip
        found = re.search(r"Deployment Id: (\S+)", created)
        if found is None:
            raise RuntimeError(f"greengrass-cli deployment create said: {created}")
        deployment = found.group(1)
        status: list[str] = []

        def finished() -> bool:
            out = self.cli_command("deployment", "status", "-i", deployment)
            status[:] = [out]
            return any(word in out for word in ("SUCCEEDED", "FAILED", "REJECTED", "CANCELED"))

        wait_until(finished, timeout, f"deployment {deployment} to finish", interval=0.2)
        out = status[0]
        state = next(w for w in ("SUCCEEDED", "FAILED", "REJECTED", "CANCELED") if w in out)
        return state, out

    def cli_command(self, *args: str) -> str:
        """One greengrass-cli command; its output (RuntimeError with it when it fails)."""
        done = subprocess.run(
            [str(self.root / "bin" / "greengrass-cli"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"greengrass-cli {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


_STATE = re.compile(
    r"^(?P<at>\S+) .*service-set-state\. \{serviceName=(?P<name>[^,]+), "
    r"currentState=\S+, newState=(?P<state>[A-Z]+)\}"
)


def states(nucleus: Nucleus, name: str) -> list[tuple[datetime, str]]:
    """The states the nucleus set component `name` to, in order, with when (its log)."""
    found = []
    for line in nucleus.log().splitlines():
        match = _STATE.match(line)
        if match and match["name"] == name:
            found.append(
                (datetime.fromisoformat(match["at"].replace("Z", "+00:00")), match["state"])
            )
    return found


def service_states(nucleus: Nucleus, name: str) -> list[str]:
    """The names of the states the nucleus set component `name` to, in order."""
    return [state for _, state in states(nucleus, name)]
