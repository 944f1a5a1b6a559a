"""`opcua-adapter` security end to end: the component in-process on a real Mosquitto against
the asyncua sim with secure endpoints. An untrusted server shows in sb/status and never
stops the instance beside it; trusting it needs no restart; users come from the vault."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.opcua.test_adapter import FAST_TIMING, opcua_instance, values
from tests.support.adapter import Adapter, AdapterHarness
from tests.support.mosquitto import Mosquitto
from tests.support.opcua import AppCertificate, OpcUaSim, sim_options
from tests.support.servers import wait_until
from unskit.config import SecretRef, Vault, VaultKey
from unskit.opcua.component import OpcUaAdapter
from unskit.opcua.security import sha1_thumbprint

pytestmark = pytest.mark.integration

PASSWORD = "vault-Pa55word"


@pytest.fixture
def start_with_vault(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None
) -> Iterator[Callable[..., Adapter]]:
    """Starts the component with a vault (user `bob`, password PASSWORD in `plc-user`)."""
    harness = AdapterHarness(broker, tmp_path)
    key = VaultKey.generate()
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    key_file.chmod(0o600)
    Vault(tmp_path / "vault.json", key).put("plc-user", {"username": "bob", "password": PASSWORD})
    credentials = {"vaultPath": str(tmp_path / "vault.json"), "keyFile": str(key_file)}

    def start(instances: list[dict[str, Any]]) -> Adapter:
        component = {"global": {"timing": FAST_TIMING}, "instances": instances}
        return harness.start(OpcUaAdapter, harness.document(component, credentials=credentials))

    yield start
    harness.close()


def status(adapter: Adapter, instance: str) -> dict[str, Any]:
    return adapter.client.call("status", instance=instance)


def test_an_untrusted_server_shows_in_status_while_the_other_instance_publishes(
    start_with_vault: Callable[..., Adapter],
    opcua_server: Callable[..., OpcUaSim],
    opcua_certs: dict[str, AppCertificate],
    tmp_path: Path,
) -> None:
    server, client = opcua_certs["server"], opcua_certs["client"]
    sim = opcua_server(*sim_options(server, "--users", f"bob:{PASSWORD}", "--no-anonymous"))
    user = {"source": "vault", "secret": "plc-user"}
    pki = tmp_path / "pki"
    live = opcua_instance(sim.endpoint)
    live["connection"]["user"] = user
    secure = opcua_instance(sim.endpoint, "Counter", id="line-2")
    secure["connection"] = {
        "endpoint": sim.endpoint,
        "securityPolicy": "Basic256Sha256",
        "messageMode": "SignAndEncrypt",
        "user": user,
        "clientCertificate": {
            "source": "file",
            "certPath": str(client.der),
            "keyPath": str(client.key),
        },
        "trust": {"pkiDir": str(pki / "{InstanceId}")},
    }
    adapter = start_with_vault([live, secure])
    thumbprint = sha1_thumbprint(server.der.read_bytes())
    rejected = pki / "line-2" / "rejected" / f"{thumbprint}.der"
    wait_until(lambda: status(adapter, "line-2")["lastError"], 20, "line-2's error")
    refused = status(adapter, "line-2")
    assert refused["connected"] is False
    assert "BadCertificateUntrusted" in refused["lastError"]
    assert thumbprint in refused["lastError"]
    assert str(rejected) in refused["lastError"]
    assert rejected.read_bytes() == server.der.read_bytes()
    alarm = adapter.runtime.topics.topic("evt", "error", "device-unreachable", instance="line-2")
    wait_until(lambda: adapter.seen.on(alarm), 10, "line-2's unreachable alarm")
    # The instance beside it (a vault user over the component's vault) keeps publishing.
    before = len(values(adapter, "Counter"))
    wait_until(lambda: len(values(adapter, "Counter")) >= before + 3, 20, "line-1 publishing")
    assert values(adapter, "Counter", "line-2") == []
    # The operator trusts the certificate: line-2 connects at its next attempt, no restart.
    shutil.move(rejected, pki / "line-2" / "trusted" / rejected.name)
    wait_until(lambda: len(values(adapter, "Counter", "line-2")) >= 2, 30, "line-2 publishing")
    connected = status(adapter, "line-2")
    assert connected["lastError"] is None
    assert (
        connected["device"]["serverCertificate"]["sha256"]
        == hashlib.sha256(server.der.read_bytes()).hexdigest()
    )
    assert connected["security"]["clientCertificate"]["source"] == "file"
    assert connected["security"]["user"] == str(SecretRef("plc-user", "username"))
