"""CIP Security (mutual TLS) for poll instances, through stunnel in front of cpppo's Logix
simulator, with a throwaway PKI (tests/support/pki.py) and the real vault."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cip.conftest import plc_instance, plc_signal
from tests.support.adapter import Adapter, AdapterHarness
from tests.support.cpppo import LogixSimulator
from tests.support.mosquitto import Mosquitto
from tests.support.pki import CipPki, Issued, make_cip_pki
from tests.support.servers import wait_until
from tests.support.stunnel import OpenSslServer, Stunnel
from tests.support.tiers import server_fixture
from unskit.cip.component import EthernetIpAdapter
from unskit.config.vault import Vault, VaultKey

pytestmark = pytest.mark.integration

FAST = {
    "connectMs": 2000,
    "requestTimeoutMs": 2000,
    "reconnectBackoffMinMs": 50,
    "reconnectBackoffMaxMs": 200,
    "keepaliveProbeIntervalMs": 200,
}


@pytest.fixture(scope="module")
def cip_pki(tmp_path_factory: pytest.TempPathFactory) -> CipPki:
    return make_cip_pki(tmp_path_factory.mktemp("cip-pki"))


@server_fixture
def logix(tmp_path: Path) -> Iterator[LogixSimulator]:
    simulator = LogixSimulator(("Temp=REAL", "Count=DINT"), tmp_path / "cpppo").start()
    yield simulator
    simulator.stop()


@pytest.fixture
def tunnel(
    tmp_path: Path, logix: LogixSimulator, cip_pki: CipPki
) -> Iterator[Callable[..., Stunnel]]:
    started: list[Stunnel] = []

    def start(device: Issued | None = None, client_ca: Path | None = None, **kw: Any) -> Stunnel:
        device = device or cip_pki.device
        folder = tmp_path / f"stunnel-{len(started)}"
        st = Stunnel(folder, logix.port, device.chain, device.key, client_ca or cip_pki.root, **kw)
        started.append(st.start())
        return st

    yield start
    for st in started:
        st.stop()


@pytest.fixture
def vault(tmp_path: Path) -> tuple[Vault, dict[str, str]]:
    key = VaultKey.generate()
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    key_file.chmod(0o600)
    path = tmp_path / "vault.json"
    return Vault(path, key), {"vaultPath": str(path), "keyFile": str(key_file)}


@pytest.fixture
def start_tls(
    broker: Mosquitto, tmp_path: Path, restore_root_logging: None, vault: Any
) -> Iterator[Callable[..., Adapter]]:
    harness = AdapterHarness(broker, tmp_path)

    def start(*instances: dict[str, Any]) -> Adapter:
        component = {"instances": list(instances), "global": {"timing": FAST}}
        document = harness.document(component, credentials=vault[1])
        return harness.start(EthernetIpAdapter, document)

    yield start
    harness.close()


def files_identity(pki: CipPki, client: Issued | None = None, **security: Any) -> dict[str, Any]:
    client = client or pki.client
    return {
        "mode": "tls",
        "client": {"certFile": str(client.chain), "keyFile": str(client.key)},
        "ca": {"file": str(pki.root)},
        **security,
    }


def tls_plc(endpoint: str, security: dict[str, Any], instance: str = "plc-tls") -> dict[str, Any]:
    plc = plc_instance(instance, endpoint, plc_signal("Temp", "REAL"), plc_signal("Count", "DINT"))
    plc["connection"]["security"] = security
    return plc


def status(adapter: Adapter, instance: str = "plc-tls") -> dict[str, Any]:
    return adapter.client.call("status", instance=instance)


def reads(adapter: Adapter, instance: str = "plc-tls") -> float:
    return float(status(adapter, instance)["counters"]["reads"])


def polled(adapter: Adapter, instance: str = "plc-tls", more_than: float = 0) -> None:
    wait_until(lambda: reads(adapter, instance) > more_than, 20, f"{instance} polled over TLS")


def events(adapter: Adapter, severity: str, kind: str, instance: str = "plc-tls") -> list[Any]:
    topic = adapter.runtime.topics.topic("evt", severity, kind, instance=instance)
    return adapter.seen.on(topic)


def failing_with(adapter: Adapter, text: str, instance: str = "plc-tls") -> str:
    def seen() -> bool:
        return text in (status(adapter, instance)["lastError"] or "")

    wait_until(seen, 20, f"lastError containing {text!r}")
    assert status(adapter, instance)["connected"] is False, status(adapter, instance)
    return str(status(adapter, instance)["lastError"])


def no_pem_in(text: str) -> None:
    assert "BEGIN" not in text, text[:200]
    assert "PRIVATE KEY" not in text, text[:200]


# -- the transport -------------------------------------------------------------------------------


def test_verified_mutual_tls_polls_and_reports_its_posture(
    start_tls, tunnel, cip_pki, capfd
) -> None:
    st = tunnel()
    adapter = start_tls(tls_plc(st.endpoint, files_identity(cip_pki)))
    polled(adapter)
    security = status(adapter)["security"]
    assert security["mode"] == "tls"
    assert security["tls"]["protocol"] in ("TLSv1.3", "TLSv1.2")
    assert security["tls"]["peerCertificate"]["subject"] == "CN=device"
    assert security["tls"]["clientCertificate"]["subject"] == "CN=edge-client"
    assert security["targetSupportsCipSecurity"] is False, "cpppo has no CIP Security object"
    assert security["target"] is None
    assert security["est"] == {"enabled": False}
    no_pem_in(json.dumps(status(adapter)))
    logged = capfd.readouterr().err
    assert "has no CIP Security object" in logged
    assert "Generic message 'security' failed" not in logged, "the probe's failure is quiet"


@pytest.mark.parametrize(
    ("suites", "negotiated"),
    [
        (["TLS13_AES_128_GCM_SHA256"], "TLS_AES_128_GCM_SHA256"),
        (
            ["TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"],
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        ),
    ],
    ids=["tls13-rustls-name", "tls12-iana-name"],
)
def test_the_allow_list_decides_the_suite(start_tls, tunnel, cip_pki, suites, negotiated) -> None:
    st = tunnel()
    adapter = start_tls(tls_plc(st.endpoint, files_identity(cip_pki, cipherSuites=suites)))
    polled(adapter)
    tls = status(adapter)["security"]["tls"]
    assert tls["cipherSuite"] == negotiated
    assert tls["allowedCipherSuites"] == [negotiated]


def test_unverified_peer_polls_and_raises_tls_peer_unverified(start_tls, tunnel, cip_pki) -> None:
    st = tunnel(device=cip_pki.device_wrong_san)
    security = files_identity(cip_pki, verifyPeer=False)
    del security["ca"]
    adapter = start_tls(tls_plc(st.endpoint, security))
    polled(adapter)
    wait_until(lambda: events(adapter, "warning", "tls-peer-unverified"), 10, "the event")
    context = events(adapter, "warning", "tls-peer-unverified")[0].body["context"]
    assert context["peerCertificate"]["subject"] == "CN=device-wrong-san"


def test_a_wrong_name_is_refused_and_server_name_fixes_it(start_tls, tunnel, cip_pki) -> None:
    st = tunnel(device=cip_pki.device_wrong_san)
    adapter = start_tls(tls_plc(st.endpoint, files_identity(cip_pki)))
    error = failing_with(adapter, "not valid for name")
    assert "127.0.0.1" in error
    document = copy.deepcopy(adapter.document)
    document["component"]["instances"][0]["connection"]["security"]["serverName"] = "plc.example"
    adapter.reload(document)
    polled(adapter)


def test_an_expired_client_certificate_is_refused_at_connect(start_tls, tunnel, cip_pki) -> None:
    st = tunnel()
    adapter = start_tls(tls_plc(st.endpoint, files_identity(cip_pki, cip_pki.client_expired)))
    failing_with(adapter, "refused at connect (checkExpiration)")
    wait_until(lambda: events(adapter, "error", "cert-expired"), 10, "cert-expired")
    assert "Temp" not in st.log(), "nothing reached the device"


def test_a_not_yet_valid_client_certificate_is_refused(start_tls, tunnel, cip_pki) -> None:
    st = tunnel()
    adapter = start_tls(tls_plc(st.endpoint, files_identity(cip_pki, cip_pki.client_not_yet_valid)))
    failing_with(adapter, "is not valid before")


def test_an_expired_device_certificate_with_and_without_check_expiration(
    start_tls, tunnel, cip_pki
) -> None:
    st = tunnel(device=cip_pki.device_expired)
    adapter = start_tls(
        tls_plc(st.endpoint, files_identity(cip_pki), "strict"),
        tls_plc(st.endpoint, files_identity(cip_pki, checkExpiration=False), "lenient"),
    )
    polled(adapter, "lenient")
    failing_with(adapter, "expired", "strict")


@pytest.mark.parametrize(
    "server",
    [
        {"tls12_only": True, "cipher": "ECDHE-ECDSA-AES256-GCM-SHA384"},
        {"ciphersuites": "TLS_AES_256_GCM_SHA384"},
        {"tls12_only": True, "cipher": "ECDHE-ECDSA-AES128-SHA:@SECLEVEL=0"},
    ],
    ids=["tls12-outside-allow-list", "tls13-outside-allow-list", "no-aead-at-all"],
)
def test_no_common_cipher_fails_clearly(start_tls, tmp_path, cip_pki, server) -> None:
    device = OpenSslServer(
        tmp_path / "s_server", cip_pki.device.chain, cip_pki.device.key, **server
    )
    device.start()
    try:
        allow = ["TLS_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]
        if "SHA:" in str(server.get("cipher")):
            allow = ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]
        adapter = start_tls(tls_plc(device.endpoint, files_identity(cip_pki, cipherSuites=allow)))
        failing_with(adapter, "handshake_failure")
    finally:
        device.stop()


# -- credentials ----------------------------------------------------------------------------------


def _bundle(issued: Issued, ca: Path | None = None) -> dict[str, str]:
    bundle = {"certPem": issued.chain.read_text(), "keyPem": issued.key.read_text()}
    if ca is not None:
        bundle["caPem"] = ca.read_text()
    return bundle


def test_vault_bundle_and_inline_secrets(start_tls, tunnel, cip_pki, vault) -> None:
    st = tunnel()
    store = vault[0]
    store.put("plc-identity", _bundle(cip_pki.client, cip_pki.root))
    store.put("client-cert", cip_pki.client.chain.read_text())
    store.put("client-key", cip_pki.client.key.read_text())
    store.put("plc-root", cip_pki.root.read_text())
    inline = {
        "mode": "tls",
        "client": {"cert": {"$secret": "client-cert"}, "key": {"$secret": "client-key"}},
        "ca": {"list": [{"$secret": "plc-root"}]},
    }
    adapter = start_tls(
        tls_plc(st.endpoint, {"mode": "tls", "client": {"certSecret": "plc-identity"}}, "bundle"),
        tls_plc(st.endpoint, inline, "inline"),
    )
    polled(adapter, "bundle")
    polled(adapter, "inline")
    assert status(adapter, "bundle")["security"]["tls"]["clientSource"] == "vault"


def test_trust_store_rollover_accepts_old_and_new_root_then_retires_the_old(
    start_tls, tunnel, cip_pki, vault
) -> None:
    old = tunnel()
    new = tunnel(device=cip_pki.device_new_root)
    store = vault[0]
    store.put("plc-identity", _bundle(cip_pki.client))
    store.put("plc-trust", {"caPem": cip_pki.root.read_text()})
    store.put("plc-trust", {"caPem": cip_pki.new_root.read_text()}, keep_versions=1)
    security = {
        "mode": "tls",
        "client": {"certSecret": "plc-identity"},
        "ca": {"trustStore": "plc-trust"},
        "reloadIntervalSecs": 1,
    }
    adapter = start_tls(
        tls_plc(old.endpoint, copy.deepcopy(security), "old-root"),
        tls_plc(new.endpoint, copy.deepcopy(security), "new-root"),
    )
    polled(adapter, "old-root")
    polled(adapter, "new-root")
    assert status(adapter, "old-root")["security"]["tls"]["trustAnchors"] == 2
    assert store.retire_versions("plc-trust") == 1
    # The reload sees the change, reconnects, and the old root's device is refused.
    failing_with(adapter, "UnknownIssuer", "old-root")

    def reloaded() -> bool:  # each instance reloads on its own period
        return bool(status(adapter, "new-root")["security"]["tls"]["trustAnchors"] == 1)

    wait_until(reloaded, 20, "new-root on the retired store")
    before = reads(adapter, "new-root")
    polled(adapter, "new-root", before)
    assert status(adapter, "new-root")["connected"] is True


def test_corrupt_pem_and_a_mismatched_key_keep_polling_on_the_previous_credentials(
    start_tls, tunnel, cip_pki, vault, capfd
) -> None:
    st = tunnel()
    store = vault[0]
    store.put("plc-identity", _bundle(cip_pki.client, cip_pki.root))
    security = {"mode": "tls", "client": {"certSecret": "plc-identity"}, "reloadIntervalSecs": 1}
    adapter = start_tls(tls_plc(st.endpoint, security))
    polled(adapter)
    corrupt = _bundle(cip_pki.client, cip_pki.root)
    corrupt["certPem"] = corrupt["certPem"].replace("M", "*", 5)
    store.put("plc-identity", corrupt)
    wait_until(lambda: events(adapter, "error", "tls-credential-rejected"), 20, "a rejection")
    context = events(adapter, "error", "tls-credential-rejected")[0].body["context"]
    assert "corrupt PEM" in context["error"]
    assert context["keptPrevious"] is True
    mismatched = _bundle(cip_pki.client, cip_pki.root)
    mismatched["keyPem"] = cip_pki.device.key.read_text()
    store.put("plc-identity", mismatched)
    wait_until(lambda: len(events(adapter, "error", "tls-credential-rejected")) >= 2, 20, "2nd")
    context = events(adapter, "error", "tls-credential-rejected")[1].body["context"]
    assert context["error"] == "the client key does not match the client certificate"
    before = reads(adapter)
    polled(adapter, more_than=before + 3)
    assert status(adapter)["connected"] is True
    for message in events(adapter, "error", "tls-credential-rejected"):
        no_pem_in(json.dumps(message.body))
    no_pem_in(json.dumps(status(adapter)))  # describe() is its `device` part
    logged = capfd.readouterr().err  # the runtime logs to stderr
    assert "credentials rejected" in logged
    no_pem_in(logged)


def test_a_vault_change_reconnects_with_the_new_identity(start_tls, tunnel, cip_pki, vault) -> None:
    st = tunnel()
    store = vault[0]
    store.put("plc-identity", _bundle(cip_pki.client, cip_pki.root))
    security = {"mode": "tls", "client": {"certSecret": "plc-identity"}, "reloadIntervalSecs": 1}
    adapter = start_tls(tls_plc(st.endpoint, security))
    polled(adapter)
    store.put("plc-identity", _bundle(cip_pki.client_soon_expiring, cip_pki.root))

    def renewed() -> bool:
        cert = status(adapter)["security"]["tls"]["clientCertificate"]
        return bool(cert and cert["subject"] == "CN=edge-client-soon")

    wait_until(renewed, 20, "the new identity in use")
    before = reads(adapter)
    polled(adapter, more_than=before)


def test_cert_expiring_fires_once_per_certificate(start_tls, tunnel, cip_pki) -> None:
    st = tunnel()
    security = files_identity(cip_pki, cip_pki.client_soon_expiring)
    security["client"]["renewBeforeDays"] = 30
    adapter = start_tls(tls_plc(st.endpoint, security))
    polled(adapter, more_than=10)
    expiring = events(adapter, "warning", "cert-expiring")
    assert len(expiring) == 1, "once per certificate per day, not per poll"
    context = expiring[0].body["context"]
    assert context["certificate"]["subject"] == "CN=edge-client-soon"
    assert 9 < context["daysLeft"] <= 10
    assert context["renewBeforeDays"] == 30
    no_pem_in(json.dumps(context))


def test_the_est_seam_swaps_credentials_and_reconnects(start_tls, tunnel, cip_pki) -> None:
    st = tunnel()
    adapter = start_tls(tls_plc(st.endpoint, files_identity(cip_pki)))
    polled(adapter)
    driver = adapter.app.service.runner("plc-tls").driver  # type: ignore[union-attr]
    summary = driver.swap_client_credentials(
        cip_pki.client_soon_expiring.chain.read_bytes(),
        cip_pki.client_soon_expiring.key.read_bytes(),
    )
    assert summary.subject == "CN=edge-client-soon"

    def swapped() -> bool:
        cert = status(adapter)["security"]["tls"]["clientCertificate"]
        return bool(cert and cert["subject"] == "CN=edge-client-soon")

    wait_until(swapped, 20, "the swapped identity in use")
    polled(adapter, more_than=reads(adapter))
    from unskit.errors import CredentialError

    with pytest.raises(CredentialError, match="does not match") as refused:
        driver.swap_client_credentials(
            cip_pki.client.chain.read_bytes(), cip_pki.device.key.read_bytes()
        )
    no_pem_in(str(refused.value))


# -- the target's posture --------------------------------------------------------------------


def test_a_target_with_cip_security_objects_reports_its_posture(
    start_tls, tunnel, cip_pki, tmp_path
) -> None:
    secure = LogixSimulator(
        ("Temp=REAL", "Count=DINT"), tmp_path / "secure", module="tests.cip.secure_logix"
    )
    secure.start()
    st = Stunnel(
        tmp_path / "st-secure", secure.port, cip_pki.device.chain, cip_pki.device.key, cip_pki.root
    )
    st.start()
    try:
        adapter = start_tls(
            tls_plc(st.endpoint, files_identity(cip_pki)),
            plc_instance("plain", secure.endpoint, plc_signal("Temp", "REAL")),
        )
        polled(adapter)
        polled(adapter, "plain")
        for instance in ("plc-tls", "plain"):
            security = status(adapter, instance)["security"]
            assert security["targetSupportsCipSecurity"] is True
            target = security["target"]
            assert target["state"] == "configured"
            assert target["profiles"] == ["ethernetIpIntegrity", "ethernetIpConfidentiality"]
            assert target["allowedCipherSuites"] == ["TLS_AES_128_GCM_SHA256"]
            assert len(target["availableCipherSuites"]) == 3
            assert (target["verifyClientCertificate"], target["checkExpiration"]) == (True, True)
        assert status(adapter, "plain")["security"]["mode"] == "plaintext"
    finally:
        st.stop()
        secure.stop()
