"""deploy/kubernetes: every manifest is valid against the Kubernetes API schemas, and each
Deployment agrees with the configuration it mounts (probes, ports, volumes, vault)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from unskit.config.observability import HealthConfig
from unskit.config.platform import Platform
from unskit.runtime.component import DRAIN_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes release still maintained when the manifests were written.
KUBERNETES_VERSION = "1.33"
CONFIG_MOUNT = "/etc/unskit/config"  # the CLUSTER platform's MOUNTED_DIR default


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        with path.open() as stream:
            found.extend((path.name, doc) for doc in yaml.safe_load_all(stream) if doc)
    return found


DOCUMENTS = _documents()
BY_KIND: dict[tuple[str, str], dict[str, Any]] = {
    (doc["kind"], doc["metadata"]["name"]): doc for _, doc in DOCUMENTS
}
DEPLOYMENTS = [doc for _, doc in DOCUMENTS if doc["kind"] == "Deployment"]


def test_the_manifests_exist() -> None:
    assert {d["metadata"]["name"] for d in DEPLOYMENTS} == {
        "ethernet-ip-adapter",
        "opcua-adapter",
        "camera-adapter",
        "file-egress",
    }


DOCUMENT_IDS = [f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in DOCUMENTS]


@pytest.mark.parametrize(("name", "doc"), DOCUMENTS, ids=DOCUMENT_IDS)
def test_manifest_is_valid_against_the_api_schema(name: str, doc: dict[str, Any]) -> None:
    # strict: an unknown or misspelt field is an error, as `kubectl apply --validate=strict`.
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_misspelt_field_is_caught() -> None:
    doc = json.loads(json.dumps(DEPLOYMENTS[0]))
    doc["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _mounts(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Mount path -> the pod volume mounted there."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in _container(deployment)["volumeMounts"]}


def _config(deployment: dict[str, Any]) -> dict[str, Any]:
    volume = _mounts(deployment)[CONFIG_MOUNT]
    config_map = BY_KIND["ConfigMap", volume["configMap"]["name"]]
    document: dict[str, Any] = json.loads(config_map["data"]["config.json"])
    return document


def _mounted_at(deployment: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume whose mount holds `path`, and it must be backed by a declared object."""
    candidates = [m for m in _mounts(deployment) if PurePosixPath(path).is_relative_to(m)]
    assert candidates, f"{path} is on no volume of {deployment['metadata']['name']}"
    volume = _mounts(deployment)[max(candidates, key=len)]
    if "persistentVolumeClaim" in volume:
        assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in BY_KIND
    return volume


NAMES = [d["metadata"]["name"] for d in DEPLOYMENTS]


@pytest.mark.integration
@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=NAMES)
def test_mounted_configuration_validates_as_the_pod_would_load_it(
    deployment: dict[str, Any], tmp_path: Path
) -> None:
    # The pod sees the ConfigMap as a directory; validate that directory on CLUSTER with
    # the thing name the gateway ConfigMap gives, through the CLI users run.
    (tmp_path / "config.json").write_text(json.dumps(_config(deployment)))
    env = {**os.environ}
    for source in _container(deployment)["envFrom"]:
        env.update(BY_KIND["ConfigMap", source["configMapRef"]["name"]]["data"])
    args = _container(deployment)["args"]
    assert args[:2] == ["unskit", "run"]
    command = ["validate", "-c", str(tmp_path), "--component", args[2]]
    result = subprocess.run(
        [sys.executable, "-m", "unskit.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid on CLUSTER" in result.stdout


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=NAMES)
def test_probes_match_the_health_section(deployment: dict[str, Any]) -> None:
    health = HealthConfig.from_section(_config(deployment).get("health"))
    assert health.enabled_for(Platform.CLUSTER)
    container = _container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in (
        ("livenessProbe", health.liveness_path),
        ("readinessProbe", health.readiness_path),
        ("startupProbe", health.startup_path),
    ):
        check = container[probe]["httpGet"]
        assert check["path"] == path, probe
        assert ports[check["port"]] == health.port, probe


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=NAMES)
def test_pod_shape(deployment: dict[str, Any]) -> None:
    spec = deployment["spec"]["template"]["spec"]
    # The drain runs messaging, watches and heartbeat each within DRAIN_TIMEOUT_S after the
    # component's own drain: leave room for all of them before the kubelet's SIGKILL.
    assert spec["terminationGracePeriodSeconds"] >= 6 * DRAIN_TIMEOUT_S
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    resources = _container(deployment)["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    config = _config(deployment)
    assert _mounted_at(deployment, config["commands"]["stateDir"])["persistentVolumeClaim"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=NAMES)
def test_vault_and_its_key_come_from_secrets(deployment: dict[str, Any]) -> None:
    config = _config(deployment)
    env = {e["name"]: e for e in _container(deployment).get("env", [])}
    if "credentials" not in config:
        assert "UNSKIT_VAULT_KEY" not in env
        return
    vault = _mounted_at(deployment, config["credentials"]["vaultPath"])
    assert "secret" in vault
    assert (
        env["UNSKIT_VAULT_KEY"]["valueFrom"]["secretKeyRef"]["name"]
        != vault["secret"]["secretName"]
    ), "the key and the file it opens live in different Secrets"


def test_camera_output_is_the_egress_source() -> None:
    camera = BY_KIND["Deployment", "camera-adapter"]
    egress = BY_KIND["Deployment", "file-egress"]
    output = _config(camera)["component"]["storage"]["outputRoot"]
    (instance,) = _config(egress)["component"]["instances"]
    assert instance["source"]["path"] == output
    shared = _mounted_at(camera, output)
    assert shared == _mounted_at(egress, output)
    claim = BY_KIND["PersistentVolumeClaim", shared["persistentVolumeClaim"]["claimName"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
