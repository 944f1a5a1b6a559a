"""EST enrollment (RFC 7030) against the tests' own EST server, through the real vault: first
enrollment (bootstrap identity, HTTP Basic), renewal with the current certificate, label,
cacerts, 202 + Retry-After, backoff, garbage replies, an unreachable server, and the key
never leaving the process. The last test runs it inside the adapter beside real polling."""

from __future__ import annotations

import base64
import datetime
import json
import logging
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.cip.conftest import FAST_TIMING, plc_instance, plc_signal
from tests.support.adapter import Adapter, AdapterHarness
from tests.support.cpppo import LogixSimulator
from tests.support.est_server import EstServer
from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki
from tests.support.servers import free_port, require_binary, wait_until
from tests.support.tiers import server_fixture
from unskit.cip.component import EthernetIpAdapter
from unskit.cip.config import parse_component
from unskit.cip.enrollment import (
    CERT_ENROLL_FAILED,
    CERT_ENROLLED,
    EnrolledIdentity,
    EnrollmentManager,
)
from unskit.config.loader import resolve_config
from unskit.config.platform import Platform
from unskit.config.vault import Vault, VaultKey, VaultSecrets
from unskit.errors import EstError
from unskit.runtime.metrics import MetricsRegistry

pytestmark = pytest.mark.integration

PEM = serialization.Encoding.PEM
BASIC = ("enroller", "s3cret-pass")
NOW = datetime.datetime.now(datetime.timezone.utc)


class Recorder:
    """Events as `Events.emit` receives them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any], str | None]] = []

    def emit(
        self,
        severity: Any,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> None:
        self.events.append((str(severity), event_type, dict(context or {}), instance))

    def of(self, event_type: str) -> list[tuple[str, str, dict[str, Any], str | None]]:
        return [event for event in self.events if event[1] == event_type]


@pytest.fixture
def est(tmp_path: Path, pki: Pki) -> Iterator[EstServer]:
    server = EstServer(
        tmp_path / "est",
        client_cas=[pki.ca.read_text()],
        basic=BASIC,
        labels=frozenset({"line-2"}),
    ).start()
    yield server
    server.stop()


@server_fixture
def vault_files(tmp_path: Path) -> VaultSecrets:
    key = VaultKey.generate()
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    return VaultSecrets(tmp_path / "vault.json", key_file=key_file)


@pytest.fixture
def run(
    vault_files: VaultSecrets,
) -> Iterator[Callable[..., tuple[EnrollmentManager, Recorder, MetricsRegistry, list[Any]]]]:
    managers: list[EnrollmentManager] = []

    def start(security: Mapping[str, Any], **kwargs: Any):
        recorder, metrics, enrolled = Recorder(), MetricsRegistry(), []
        manager = EnrollmentManager(
            "plc-1",
            security,
            secrets=vault_files,
            events=recorder,
            metrics=metrics,
            on_enrolled=enrolled.append,
            **kwargs,
        )
        managers.append(manager)
        return manager.start(), recorder, metrics, enrolled

    yield start
    for manager in managers:
        manager.stop()


def security(est: EstServer, tmp_path: Path, **settings: Any) -> dict[str, Any]:
    ca = tmp_path / "est-ca.pem"
    ca.write_text(est.ca_pem)
    return {
        "mode": "tls",
        "client": {"certSecret": "plc-id"},
        "ca": {"file": str(ca)},
        "est": {"enabled": True, "server": est.url, **settings},
    }


def settled(manager: EnrollmentManager, *outcomes: str, timeout: float = 15) -> dict[str, Any]:
    wait_until(lambda: manager.status()["outcome"] in outcomes, timeout, f"outcome {outcomes}")
    return manager.status()


def bundle(vault_files: VaultSecrets, name: str = "plc-id") -> Mapping[str, str]:
    value = vault_files.vault().get(name)
    assert not isinstance(value, str)
    return value


def leaf(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def spki(public_key: Any) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def seed(est: EstServer, vault_files: VaultSecrets, *, days_left: float, lifetime: float) -> str:
    """Puts a certificate from the EST CA (and its key) into the plc-id bundle."""
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = NOW + datetime.timedelta(days=days_left)
    cert = est.issue(
        key.public_key(),
        "plc-originator-7",
        not_before=not_after - datetime.timedelta(days=lifetime),
        not_after=not_after,
    )
    cert_pem = cert.public_bytes(PEM).decode()
    key_pem = key.private_bytes(
        PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    vault_files.vault().put("plc-id", {"certPem": cert_pem, "keyPem": key_pem})
    return cert_pem


def assert_key_stayed_home(est: EstServer, key_pem: str, *texts: str) -> None:
    """The private key is in no request body, no status or event text given, and each CSR
    the server received carried the public key of the stored private key."""
    key = serialization.load_pem_private_key(key_pem.encode(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    der = key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for request in est.requests:
        assert scalar not in request.body
        assert der not in request.body
        body = request.body.decode("ascii")
        assert "PRIVATE KEY" not in body
    issued = [r for r in est.requests if r.csr is not None and r.status == 200]
    assert issued
    assert spki(issued[-1].csr.public_key()) == spki(key.public_key())
    body_lines = key_pem.strip().splitlines()[1:-1]
    for text in texts:
        assert "PRIVATE KEY" not in text
        assert not any(line in text for line in body_lines)


# -- first enrollment -------------------------------------------------------------------------


def test_first_enrollment_with_a_bootstrap_identity(
    est: EstServer, run, vault_files: VaultSecrets, pki: Pki, tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, recorder, metrics, enrolled = run(
        security(est, tmp_path, auth={"bootstrap": bootstrap}, subject="line-1-originator")
    )
    status = settled(manager, "enrolled", "failed")
    assert status["outcome"] == "enrolled", status["lastError"]
    assert est.operations() == ["simpleenroll"]
    (request,) = est.requests
    assert (request.client_cn, request.user) == ("edge-device-1", None), "bootstrap cert only"
    stored = bundle(vault_files)
    cert = leaf(stored["certPem"])
    assert cn(cert) == "line-1-originator"
    assert cert.issuer == est.ca_cert.subject
    key = serialization.load_pem_private_key(stored["keyPem"].encode(), None)
    assert spki(key.public_key()) == spki(cert.public_key()), "the stored key fits"
    (identity,) = enrolled
    assert isinstance(identity, EnrolledIdentity)
    assert identity.cert_pem == stored["certPem"]
    assert identity.key_pem.reveal() == stored["keyPem"]
    assert status["certificate"]["serial"] == format(cert.serial_number, "x")
    assert status["nextRenewal"] is not None
    assert status["lastAttempt"] is not None
    (event,) = recorder.of(CERT_ENROLLED)
    assert event[0] == "info"
    assert event[3] == "plc-1"
    assert event[2]["operation"] == "simpleenroll"
    assert event[2]["serial"] == format(cert.serial_number, "x")
    assert event[2]["into"] == "vault:plc-id"
    counter = metrics.counter("southbound_health", "estEnrollments", {"instance": "plc-1"})
    assert counter.total == 1
    assert_key_stayed_home(
        est, stored["keyPem"], json.dumps(status), json.dumps(recorder.events), caplog.text
    )


def test_the_csr_on_the_wire_verifies_with_openssl(
    est: EstServer, run, tmp_path: Path, pki: Pki
) -> None:
    """An independent decoder: openssl reads the base64 DER body the server received as a
    PKCS#10 request, checks its self-signature, and finds a public key and the subject."""
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, _, _, _ = run(security(est, tmp_path, auth={"bootstrap": bootstrap}, subject="x-1"))
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    (request,) = est.requests
    der = tmp_path / "csr.der"
    der.write_bytes(base64.b64decode(b"".join(request.body.split()), validate=True))
    openssl = require_binary("openssl")
    out = subprocess.run(
        [openssl, "req", "-inform", "DER", "-in", str(der), "-verify", "-noout", "-text"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    text = out.stdout + out.stderr
    assert "verify OK" in text
    assert "CN = x-1" in text
    assert "Public Key Algorithm: id-ecPublicKey" in text
    assert "priv:" not in text
    assert "PRIVATE" not in text


def test_first_enrollment_with_basic_auth_from_the_vault(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path
) -> None:
    vault_files.vault().put("est-login", {"username": BASIC[0], "password": BASIC[1]})
    manager, _, _, _ = run(security(est, tmp_path, auth={"basic": {"$secret": "est-login"}}))
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    (request,) = est.requests
    assert (request.user, request.client_cn) == (BASIC[0], None)
    assert cn(leaf(bundle(vault_files)["certPem"])) == "eip-originator", "the default subject"
    assert_key_stayed_home(est, bundle(vault_files)["keyPem"])


def test_a_wrong_basic_password_is_a_clear_failure(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path
) -> None:
    vault_files.vault().put("est-login", {"username": BASIC[0], "password": "nope"})
    manager, recorder, metrics, enrolled = run(
        security(est, tmp_path, auth={"basic": {"$secret": "est-login"}})
    )
    status = settled(manager, "failed")
    assert "HTTP 401" in status["lastError"]
    assert "authentication refused" in status["lastError"]
    (event,) = recorder.of(CERT_ENROLL_FAILED)
    assert event[0] == "error", "no usable certificate to fall back on"
    assert event[2]["currentValidUntil"] is None
    assert "nope" not in json.dumps(recorder.events) + json.dumps(status)
    assert metrics.counter("southbound_health", "estFailures", {"instance": "plc-1"}).total == 1
    assert enrolled == []
    assert vault_files.vault().names() == ["est-login"], "nothing written"


# -- renewal ----------------------------------------------------------------------------------


def test_renewal_within_renew_before_days_uses_the_current_certificate(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path
) -> None:
    old = leaf(seed(est, vault_files, days_left=5, lifetime=90))
    manager, recorder, _metrics, _ = run(security(est, tmp_path, subject="ignored-on-renewal"))
    assert settled(manager, "renewed", "failed")["outcome"] == "renewed"
    (request,) = est.requests
    assert request.operation == "simplereenroll"
    assert request.client_cn == "plc-originator-7", "authenticated by the current certificate"
    new = leaf(bundle(vault_files)["certPem"])
    assert cn(new) == "plc-originator-7", "a renewal keeps the subject (RFC 7030 4.2.2)"
    assert new.serial_number != old.serial_number
    assert new.not_valid_after_utc > old.not_valid_after_utc
    assert spki(new.public_key()) != spki(old.public_key()), "a fresh key"
    assert recorder.of(CERT_ENROLLED)[0][2]["operation"] == "simplereenroll"
    assert_key_stayed_home(est, bundle(vault_files)["keyPem"])


def test_a_certificate_far_from_expiry_is_left_alone(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path
) -> None:
    cert = leaf(seed(est, vault_files, days_left=200, lifetime=365))
    manager, recorder, _, _ = run(security(est, tmp_path, renewBeforeDays=20))
    assert manager.wait_passes(1, 10)
    status = manager.status()
    assert est.requests == []
    assert recorder.events == []
    renew_at = cert.not_valid_after_utc - datetime.timedelta(days=20)
    assert status["nextRenewal"] == renew_at.isoformat(timespec="seconds").replace("+00:00", "Z")
    assert status["outcome"] is None
    assert status["certificate"]["subject"] == "CN=plc-originator-7"


def test_a_certificate_removed_outside_is_enrolled_again_on_wake(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path, pki: Pki
) -> None:
    seed(est, vault_files, days_left=200, lifetime=365)
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, _, _, _ = run(security(est, tmp_path, auth={"bootstrap": bootstrap}))
    assert manager.wait_passes(1, 10)
    assert est.requests == []
    assert vault_files.vault().delete("plc-id")
    manager.wake()
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    assert est.operations() == ["simpleenroll"]
    assert cn(leaf(bundle(vault_files)["certPem"])) == "eip-originator"


def test_label_path_segment(est: EstServer, run, tmp_path: Path, pki: Pki) -> None:
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, _, _, _ = run(security(est, tmp_path, label="line-2", auth={"bootstrap": bootstrap}))
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    assert [(r.label, r.operation) for r in est.requests] == [("line-2", "simpleenroll")]


def test_an_unknown_label_is_a_clear_failure(est: EstServer, run, tmp_path: Path, pki: Pki) -> None:
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, _, _, _ = run(security(est, tmp_path, label="line-9", auth={"bootstrap": bootstrap}))
    assert "HTTP 404" in settled(manager, "failed")["lastError"]


def test_fetch_ca_certs_stores_the_ca_bag_in_the_bundle(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path, pki: Pki
) -> None:
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, _, _, enrolled = run(
        security(est, tmp_path, fetchCaCerts=True, auth={"bootstrap": bootstrap})
    )
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    assert est.operations() == ["cacerts", "simpleenroll"]
    assert bundle(vault_files)["caPem"] == est.ca_pem
    assert enrolled[0].ca_pem == est.ca_pem


def test_files_destination_written_atomically_with_a_private_key_file(
    est: EstServer, run, tmp_path: Path, pki: Pki
) -> None:
    folder = tmp_path / "identity"
    into = {"cert": str(folder / "client.crt"), "key": str(folder / "client.key")}
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    settings = security(est, tmp_path, into=into, auth={"bootstrap": bootstrap})
    settings["client"] = {"certFile": into["cert"], "keyFile": into["key"]}
    manager, recorder, _, _ = run(settings)
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    assert sorted(p.name for p in folder.iterdir()) == ["client.crt", "client.key"], "no temps"
    assert stat.S_IMODE((folder / "client.key").stat().st_mode) == 0o600
    cert = leaf((folder / "client.crt").read_text())
    key = serialization.load_pem_private_key((folder / "client.key").read_bytes(), None)
    assert spki(key.public_key()) == spki(cert.public_key())
    assert recorder.of(CERT_ENROLLED)[0][2]["into"] == f"files:{into['cert']}"


# -- 202, backoff, failures -----------------------------------------------------------------


def test_202_is_retried_after_retry_after_with_the_same_csr(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path, pki: Pki
) -> None:
    est.pending, est.retry_after = 1, "1"
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, recorder, metrics, _ = run(security(est, tmp_path, auth={"bootstrap": bootstrap}))
    assert settled(manager, "pending", "enrolled", "failed", timeout=10)["outcome"] != "failed"
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    first, second = est.requests
    assert (first.status, second.status) == (202, 200)
    assert first.body == second.body, "the same CSR is sent again"
    assert second.at - first.at >= 0.9, "Retry-After: 1 was honoured"
    assert recorder.of(CERT_ENROLL_FAILED) == [], "a 202 is not a failure"
    assert metrics.counter("southbound_health", "estFailures", {"instance": "plc-1"}).total == 0
    assert_key_stayed_home(est, bundle(vault_files)["keyPem"])


def test_retry_backoff_between_failures(est: EstServer, run, tmp_path: Path, pki: Pki) -> None:
    clock = [time.time()]
    est.mode = "500"
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, recorder, metrics, _ = run(
        security(est, tmp_path, retryBackoffMins=60, auth={"bootstrap": bootstrap}),
        clock=lambda: clock[0],
    )
    assert manager.wait_passes(1, 15)
    assert len(est.requests) == 1
    assert manager.status()["outcome"] == "failed"
    for minutes in (0, 59):
        clock[0] += minutes * 60
        passes = manager.passes
        manager.wake()
        assert manager.wait_passes(passes + 1, 10)
        assert len(est.requests) == 1, f"no attempt {minutes} min into the backoff"
    clock[0] += 2 * 60
    passes = manager.passes
    manager.wake()
    assert manager.wait_passes(passes + 1, 15)
    assert len(est.requests) == 2, "an attempt once retryBackoffMins passed"
    assert len(recorder.of(CERT_ENROLL_FAILED)) == 2
    assert metrics.counter("southbound_health", "estFailures", {"instance": "plc-1"}).total == 2


def test_a_503_retry_after_longer_than_the_backoff_is_honoured(
    est: EstServer, run, tmp_path: Path, pki: Pki
) -> None:
    clock = [1_900_000_000.0]
    est.mode, est.retry_after = "503", "7200"
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, _, _, _ = run(
        security(est, tmp_path, retryBackoffMins=60, auth={"bootstrap": bootstrap}),
        clock=lambda: clock[0],
    )
    status = settled(manager, "failed")
    assert "HTTP 503" in status["lastError"]
    assert status["nextAttempt"] == "2030-03-17T19:46:40Z", "7200 s, not the 60 min backoff"


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", "not a PKCS#7 certs-only structure"),
        ("html", "an HTML page"),
        ("wrong-type", "'application/json', not application/pkcs7-mime"),
        ("500", "HTTP 500"),
        ("not-http", "the reply is not HTTP"),
    ],
)
def test_a_misbehaving_server_leaves_the_current_credentials(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path, mode: str, message: str
) -> None:
    before = seed(est, vault_files, days_left=5, lifetime=90)
    stored = dict(bundle(vault_files))
    est.mode = mode
    manager, recorder, metrics, enrolled = run(security(est, tmp_path))
    status = settled(manager, "failed", "renewed")
    assert status["outcome"] == "failed", status
    assert message in status["lastError"]
    (event,) = recorder.of(CERT_ENROLL_FAILED)
    severity, _, context, _ = event
    assert severity == "warning", "a still-valid certificate remains"
    assert message in context["error"]
    assert context["operation"] == "simplereenroll"
    assert context["currentValidUntil"] == status["certificate"]["notAfter"]
    assert dict(bundle(vault_files)) == stored
    assert stored["certPem"] == before
    assert enrolled == []
    assert metrics.counter("southbound_health", "estFailures", {"instance": "plc-1"}).total == 1


def test_est_trust_from_a_trust_store_trusts_every_retained_version(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path, pki: Pki
) -> None:
    vault = vault_files.vault()
    vault.put("est-roots", est.ca_pem)
    vault.put("est-roots", pki.other_ca.read_text(), keep_versions=1)  # a rollover under way
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    settings = security(est, tmp_path, trust={"trustStore": "est-roots"})
    settings["est"]["auth"] = {"bootstrap": bootstrap}
    manager, _, _, _ = run(settings)
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    assert vault.retire_versions("est-roots") == 1
    vault.delete("plc-id")
    manager.wake()
    status = settled(manager, "failed")
    assert "server certificate not trusted" in status["lastError"], "the retired root is gone"


def test_an_untrusted_est_server_is_refused(est: EstServer, run, tmp_path: Path, pki: Pki) -> None:
    settings = security(est, tmp_path, trust={"file": str(pki.ca)})
    manager, _, _, _ = run(settings)
    assert "server certificate not trusted" in settled(manager, "failed")["lastError"]
    assert est.requests == []


def test_an_unreachable_server_fails_fast_and_stops_promptly(
    run, vault_files: VaultSecrets, tmp_path: Path
) -> None:
    with socket.socket() as hole:
        # Accepts TCP (the backlog) but never answers the TLS handshake.
        hole.bind(("127.0.0.1", 0))
        hole.listen(4)
        ca = tmp_path / "ca.pem"
        ca.write_text(EstServer(tmp_path / "other").ca_pem)
        settings = {
            "client": {"certSecret": "plc-id"},
            "est": {
                "enabled": True,
                "server": f"https://127.0.0.1:{hole.getsockname()[1]}",
                "trust": {"file": str(ca)},
            },
        }
        started = time.monotonic()
        manager, _recorder, _, _ = run(settings, timeout_s=0.5)
        status = settled(manager, "failed", timeout=10)
        assert "no reply within 0.5 s" in status["lastError"]
        assert time.monotonic() - started < 5
        stopping = time.monotonic()
        manager.stop()
        assert time.monotonic() - stopping < 2
    closed = {**settings, "est": {**settings["est"], "server": f"https://127.0.0.1:{free_port()}"}}
    manager, _, _, _ = run(closed, timeout_s=0.5)
    assert "connection failed" in settled(manager, "failed", timeout=10)["lastError"]


@pytest.mark.parametrize("broken", ["corrupt", "mismatched"])
def test_an_unusable_bootstrap_identity_is_a_clear_failure(
    est: EstServer, run, tmp_path: Path, pki: Pki, broken: str
) -> None:
    key = tmp_path / "bootstrap.key"
    if broken == "corrupt":
        key.write_text(
            "-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n"
        )
    else:
        key.write_bytes(pki.server_key.read_bytes())
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(key)}
    manager, recorder, _, _ = run(security(est, tmp_path, auth={"bootstrap": bootstrap}))
    status = settled(manager, "failed")
    assert "the EST client identity is unusable" in status["lastError"]
    assert recorder.of(CERT_ENROLL_FAILED)[0][2]["error"] == status["lastError"]
    assert est.requests == [], "nothing was sent"


def test_a_corrupt_stored_bundle_is_replaced_by_a_first_enrollment(
    est: EstServer, run, vault_files: VaultSecrets, tmp_path: Path, pki: Pki
) -> None:
    vault_files.vault().put("plc-id", {"certPem": "garbage", "keyPem": "more garbage"})
    bootstrap = {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key)}
    manager, _, _, _ = run(security(est, tmp_path, auth={"bootstrap": bootstrap}))
    assert settled(manager, "enrolled", "failed")["outcome"] == "enrolled"
    assert est.operations() == ["simpleenroll"]
    assert cn(leaf(bundle(vault_files)["certPem"])) == "eip-originator"


@pytest.mark.parametrize("ca_first", [True, False])
def test_a_certs_only_bag_made_by_openssl_parses(tmp_path: Path, pki: Pki, ca_first: bool) -> None:
    """An independent encoder: openssl's PKCS#7 certs-only, base64 as RFC 8951 says and as
    binary DER (tolerated), with parameters on the content type. openssl keeps the order it
    is given, so one of the two orders is a SET OF that strict DER would sort (BER): it parses
    too, with no warning (warnings are errors here)."""
    import email.message

    from unskit.pki.est import parse_certs_only

    bag = tmp_path / "bag.p7"
    openssl = require_binary("openssl")
    first, second = (pki.ca, pki.client_cert) if ca_first else (pki.client_cert, pki.ca)
    subprocess.run(
        [
            openssl,
            "crl2pkcs7",
            "-nocrl",
            "-certfile",
            str(first),
            "-certfile",
            str(second),
            "-outform",
            "DER",
            "-out",
            str(bag),
        ],
        capture_output=True,
        timeout=30,
        check=True,
    )
    headers = email.message.Message()
    headers["Content-Type"] = "application/pkcs7-mime; smime-type=certs-only"
    for body in (base64.encodebytes(bag.read_bytes()), bag.read_bytes()):
        certs = parse_certs_only("cacerts", headers, body)  # type: ignore[arg-type]
        assert sorted(cn(c) for c in certs) == ["edge-device-1", "unskit test CA"]


def test_random_reply_bodies_are_est_errors_never_crashes() -> None:
    import email.message
    import random

    from unskit.pki.est import parse_certs_only

    headers = email.message.Message()
    headers["Content-Type"] = "application/pkcs7-mime"
    rng = random.Random(7030)
    for _ in range(300):
        body = rng.randbytes(rng.randrange(0, 300))
        if rng.random() < 0.5:
            body = base64.encodebytes(b"\x30" + body)
        with pytest.raises(EstError, match="EST cacerts: "):
            parse_certs_only("cacerts", headers, body)  # type: ignore[arg-type]


def test_client_url_rules() -> None:
    from unskit.pki.est import EstClient

    with pytest.raises(EstError, match="must not carry credentials"):
        EstClient("https://u:p@est.example", trust_pem=None)
    with pytest.raises(EstError, match="one path segment"):
        EstClient("https://est.example", trust_pem=None, label="a/b")
    client = EstClient("https://est.example:8443/pki/", trust_pem=None, label="l")
    assert client.url("cacerts") == "https://est.example:8443/pki/.well-known/est/l/cacerts"


# -- configuration ----------------------------------------------------------------------------


def _config(security: Mapping[str, Any]):
    good = {
        "id": "good",
        "connection": {"endpoint": "127.0.0.1"},
        "pollGroups": [{"signals": [{"name": "t", "tagPath": "T", "type": "REAL"}]}],
    }
    document = {
        "component": {
            "instances": [
                good,
                {
                    **good,
                    "id": "bad",
                    "connection": {"endpoint": "127.0.0.1", "security": security},
                },
            ]
        },
        "messaging": {"local": {"host": "127.0.0.1", "port": 1883}},
    }
    return resolve_config(
        document,
        thing="gw",
        platform=Platform.HOST,
        component_schema=EthernetIpAdapter.schema,
        default_component=EthernetIpAdapter.token,
    )


EST = {"enabled": True, "server": "https://est.example"}
BAD_EST = [
    ("http server", {"est": {**EST, "server": "http://est.example"}}, "est.server"),
    ("server without host", {"est": {**EST, "server": "https://"}}, "est.server"),
    (
        "server with credentials",
        {"est": {**EST, "server": "https://u:p@est.example"}},
        "est.server",
    ),
    ("server with a query", {"est": {**EST, "server": "https://e/x?y=1"}}, "est.server"),
    ("enabled not boolean", {"est": {**EST, "enabled": "yes"}}, "est.enabled"),
    ("empty subject", {"est": {**EST, "subject": ""}}, "est.subject"),
    ("negative renewBeforeDays", {"est": {**EST, "renewBeforeDays": -1}}, "est.renewBeforeDays"),
    ("fetchCaCerts not boolean", {"est": {**EST, "fetchCaCerts": 1}}, "est.fetchCaCerts"),
    ("unknown est key", {"est": {**EST, "url": "https://x"}}, "est"),
    ("label with a slash", {"est": {**EST, "label": "a/b"}}, "est.label"),
    ("label dot-dot", {"est": {**EST, "label": ".."}}, "est.label"),
    (
        "trust mixing styles",
        {"est": {**EST, "trust": {"file": "/ca", "secret": "ca"}}},
        "est.trust",
    ),
    ("trust unknown key", {"est": {**EST, "trust": {"pem": "x"}}}, "est.trust"),
    ("trust empty", {"est": {**EST, "trust": {}}}, "est.trust"),
    (
        "bootstrap mixing styles",
        {"est": {**EST, "auth": {"bootstrap": {"certSecret": "a", "certFile": "/c"}}}},
        "est.auth.bootstrap",
    ),
    (
        "bootstrap half a file pair",
        {"est": {**EST, "auth": {"bootstrap": {"certFile": "/c"}}}},
        "est.auth.bootstrap",
    ),
    ("basic not a reference", {"est": {**EST, "auth": {"basic": "pw"}}}, "est.auth.basic"),
    (
        "into mixing styles",
        {"est": {**EST, "into": {"certSecret": "a", "cert": "/c", "key": "/k"}}},
        "est.into",
    ),
    ("into cert without key", {"est": {**EST, "into": {"cert": "/c"}}}, "est.into"),
    (
        "file identity without into",
        {"client": {"certFile": "/c", "keyFile": "/k"}, "est": EST},
        "est.into",
    ),
    ("no identity without into", {"est": EST}, "est.into"),
    ("retry backoff zero", {"est": {**EST, "retryBackoffMins": 0}}, "est.retryBackoffMins"),
]


@pytest.mark.parametrize(
    ("block", "path"), [row[1:] for row in BAD_EST], ids=[row[0] for row in BAD_EST]
)
def test_a_malformed_est_block_is_refused_with_its_path(block, path) -> None:
    candidate = parse_component(_config(block))
    assert [spec.id for spec in candidate.specs] == ["good"]
    (skipped,) = candidate.skipped
    issues = [str(issue) for issue in skipped.issues]
    full = f"$.component.instances[1].connection.security.{path}"
    assert any(issue.startswith(full) for issue in issues), issues


def test_a_certsecret_identity_derives_into() -> None:
    block = {"client": {"certSecret": "plc-id"}, "est": EST}
    candidate = parse_component(_config(block))
    assert [spec.id for spec in candidate.specs] == ["good", "bad"], candidate.skipped


# -- inside the adapter -----------------------------------------------------------------------


def _new_vault(tmp_path: Path) -> Vault:
    """A fresh vault in tmp_path, its key in vault.key, as `_start_with_vault` names them."""
    key = VaultKey.generate()
    (tmp_path / "vault.key").write_text(key.to_text())
    return Vault(tmp_path / "vault.json", key)


def _vault_document(
    harness: AdapterHarness, instance: dict[str, Any], tmp_path: Path
) -> dict[str, Any]:
    """An adapter document with one instance, its credentials from the vault in tmp_path."""
    return harness.document(
        {"instances": [instance], "global": {"timing": FAST_TIMING}},
        credentials={
            "vaultPath": str(tmp_path / "vault.json"),
            "keyFile": str(tmp_path / "vault.key"),
        },
    )


def _start_with_vault(harness: AdapterHarness, instance: dict[str, Any], tmp_path: Path) -> Adapter:
    return harness.start(EthernetIpAdapter, _vault_document(harness, instance, tmp_path))


def test_an_unreachable_est_server_never_blocks_polling(
    broker: Mosquitto, logix: LogixSimulator, tmp_path: Path, restore_root_logging: None
) -> None:
    _new_vault(tmp_path).put("plc-id", {"certPem": "x", "keyPem": "y"})
    instance = plc_instance("plc-1", logix.endpoint, plc_signal("Temp", "REAL"))
    instance["connection"]["security"] = {
        "client": {"certSecret": "plc-id"},
        "est": {"enabled": True, "server": f"https://127.0.0.1:{free_port()}"},
    }
    harness = AdapterHarness(broker, tmp_path)
    try:
        adapter = _start_with_vault(harness, instance, tmp_path)
        topic = adapter.runtime.topics
        failed = topic.topic("evt", "error", CERT_ENROLL_FAILED, instance="plc-1")
        wait_until(lambda: adapter.seen.on(failed), 15, "the cert-enroll-failed event")
        (event,) = adapter.seen.on(failed)
        assert "connection failed" in event.body["context"]["error"]
        data = adapter.data_topic("plc-1", "temp")
        wait_until(lambda: len(adapter.seen.on(data)) > 0, 15, "polled data")

        def outcome() -> str:
            status = adapter.client.call("status", instance="plc-1")
            return str(status["security"]["est"]["outcome"])

        # The outcome is set after the event is emitted (whoever sees it can rely on both).
        wait_until(lambda: outcome() == "failed", 10, "the outcome in sb/status")
        status = adapter.client.call("status", instance="plc-1")
        assert status["connected"] is True
        est_status = status["security"]["est"]
        assert est_status["enabled"] is True
        assert est_status["nextAttempt"] is not None
        assert est_status["failures"] == 1
    finally:
        harness.close()


def test_one_thread_per_manager_and_none_left_after_drain(
    broker: Mosquitto, logix: LogixSimulator, tmp_path: Path, restore_root_logging: None
) -> None:
    instance = plc_instance("plc-1", logix.endpoint, plc_signal("Temp", "REAL"))
    instance["connection"]["security"] = {
        "est": {
            "enabled": True,
            "server": f"https://127.0.0.1:{free_port()}",
            "into": {"cert": str(tmp_path / "c.pem"), "key": str(tmp_path / "k.pem")},
        }
    }
    harness = AdapterHarness(broker, tmp_path)
    try:
        document = harness.document({"instances": [instance], "global": {"timing": FAST_TIMING}})
        adapter = harness.start(EthernetIpAdapter, document)
        wait_until(
            lambda: (
                adapter.client.call("status", instance="plc-1")["security"]["est"]["outcome"]
                == "failed"
            ),
            15,
            "the first attempt",
        )
        assert [t.name for t in threading.enumerate()].count("est-plc-1") == 1
        del instance["connection"]["security"]
        reply = adapter.reload(document)
        assert reply["started"] == ["plc-1"]
        assert "est-plc-1" not in [t.name for t in threading.enumerate()], "stopped on reload"
        status = adapter.client.call("status", instance="plc-1")
        assert status["security"]["est"] == {"enabled": False}
    finally:
        harness.close()
    assert "est-plc-1" not in [t.name for t in threading.enumerate()]


def test_enrollment_inside_the_adapter_publishes_the_event_and_counts(
    broker: Mosquitto,
    logix: LogixSimulator,
    est: EstServer,
    tmp_path: Path,
    restore_root_logging: None,
) -> None:
    vault = _new_vault(tmp_path)
    vault.put("est-login", {"username": BASIC[0], "password": BASIC[1]})
    (tmp_path / "est-ca.pem").write_text(est.ca_pem)
    instance = plc_instance("plc-1", logix.endpoint, plc_signal("Temp", "REAL"))
    instance["connection"]["security"] = {
        "client": {"certSecret": "plc-1-identity"},
        "est": {
            "enabled": True,
            "server": est.url,
            "trust": {"file": str(tmp_path / "est-ca.pem")},
            "auth": {"basic": {"$secret": "est-login"}},
            "fetchCaCerts": True,
        },
    }
    harness = AdapterHarness(broker, tmp_path)
    try:
        adapter = _start_with_vault(harness, instance, tmp_path)
        topic = adapter.runtime.topics.topic("evt", "info", CERT_ENROLLED, instance="plc-1")
        wait_until(lambda: adapter.seen.on(topic), 15, "the cert-enrolled event")
        (event,) = adapter.seen.on(topic)
        stored = vault.get("plc-1-identity")
        assert not isinstance(stored, str)
        cert = leaf(stored["certPem"])
        assert event.body["context"]["serial"] == format(cert.serial_number, "x")
        assert event.body["context"]["into"] == "vault:plc-1-identity"
        assert stored["caPem"] == est.ca_pem

        def est_status() -> dict[str, Any]:
            return adapter.client.call("status", instance="plc-1")["security"]["est"]

        # The outcome is set after the event is emitted (whoever sees it can rely on both).
        wait_until(lambda: est_status()["outcome"] == "enrolled", 10, "the outcome in sb/status")
        status = est_status()
        assert status["certificate"]["sha256"] == event.body["context"]["sha256"]
        counter = adapter.runtime.metrics.counter(
            "southbound_health", "estEnrollments", {"instance": "plc-1"}
        )
        assert counter.total == 1
        assert stored["keyPem"] not in json.dumps(status)
    finally:
        harness.close()


def test_the_credential_swap_seam(caplog) -> None:
    from unskit.cip.component import CREDENTIAL_SWAP, _credential_swap
    from unskit.config.secrets import Secret

    identity = EnrolledIdentity("CERT", Secret("KEY"), "CA", NOW)
    calls: list[tuple[bytes, bytes, bytes | None]] = []

    class Swapping:
        def swap_client_credentials(self, cert: bytes, key: bytes, ca: bytes | None) -> None:
            calls.append((cert, key, ca))

    assert CREDENTIAL_SWAP == "swap_client_credentials"
    _credential_swap("plc-1", Swapping())(identity)  # type: ignore[arg-type]
    assert calls == [(b"CERT", b"KEY", b"CA")]
    caplog.set_level(logging.INFO)
    _credential_swap("plc-1", object())(identity)  # type: ignore[arg-type]
    assert "reads them at its next connect" in caplog.text


# -- end to end: enrolled, then polled through stunnel with the enrolled certificate ---------


@pytest.fixture
def est_e2e(tmp_path: Path, broker: Mosquitto, restore_root_logging: None) -> Iterator[Any]:
    """cpppo behind stunnel that accepts only client certificates from the EST CA; the EST
    server accepts the CIP PKI's client certificate as a bootstrap identity."""
    from tests.support.pki import make_cip_pki
    from tests.support.stunnel import Stunnel

    cip = make_cip_pki(tmp_path / "cip-pki")
    bootstrap_cas = cip.root.read_text() + cip.intermediate.read_text()
    server = EstServer(tmp_path / "est", client_cas=[bootstrap_cas]).start()
    (tmp_path / "est-ca.pem").write_text(server.ca_pem)
    simulator = LogixSimulator(("Temp=REAL",), tmp_path / "cpppo").start()
    tunnel = Stunnel(
        tmp_path / "stunnel",
        simulator.port,
        cip.device.chain,
        cip.device.key,
        tmp_path / "est-ca.pem",
    ).start()
    vault = _new_vault(tmp_path)
    harness = AdapterHarness(broker, tmp_path)
    try:
        yield cip, server, tunnel, vault, harness
    finally:
        harness.close()
        tunnel.stop()
        simulator.stop()
        server.stop()


def _tls_document(
    tmp_path: Path, harness: AdapterHarness, endpoint: str, est_block: dict[str, Any], ca: Path
):
    instance = plc_instance("plc-1", endpoint, plc_signal("Temp", "REAL"))
    instance["connection"]["security"] = {
        "mode": "tls",
        "client": {"certSecret": "plc-id"},
        "ca": {"file": str(ca)},
        "est": {"enabled": True, "trust": {"file": str(tmp_path / "est-ca.pem")}, **est_block},
    }
    return _vault_document(harness, instance, tmp_path)


def _client_cert(adapter: Any) -> dict[str, Any] | None:
    status = adapter.client.call("status", instance="plc-1")
    if not status["connected"]:
        return None
    return status["security"]["tls"]["clientCertificate"]


def test_enrolled_then_polled_through_stunnel_with_the_enrolled_certificate(
    est_e2e: Any, tmp_path: Path
) -> None:
    cip, server, tunnel, vault, harness = est_e2e
    est_block = {
        "server": server.url,
        "auth": {"bootstrap": {"certFile": str(cip.client.chain), "keyFile": str(cip.client.key)}},
        "subject": "line-1-originator",
    }
    adapter = harness.start(
        EthernetIpAdapter, _tls_document(tmp_path, harness, tunnel.endpoint, est_block, cip.root)
    )
    wait_until(
        lambda: _client_cert(adapter) is not None, 30, "a TLS session with the enrolled cert"
    )
    stored = vault.get("plc-id")
    assert not isinstance(stored, str)
    enrolled = leaf(stored["certPem"])
    in_use = _client_cert(adapter)
    assert in_use is not None
    assert in_use["subject"] == "CN=line-1-originator"
    assert in_use["serial"] == format(enrolled.serial_number, "x")
    (request,) = server.requests
    assert (request.operation, request.client_cn) == ("simpleenroll", "edge-client")
    data = adapter.data_topic("plc-1", "temp")
    # stunnel accepts only EST-CA client certificates: the data came over the enrolled one.
    wait_until(lambda: len(adapter.seen.on(data)) > 0, 20, "data polled through stunnel")


def test_renewed_certificate_is_swapped_in_while_polling_continues(
    est_e2e: Any, tmp_path: Path
) -> None:
    cip, server, tunnel, vault, harness = est_e2e
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = NOW + datetime.timedelta(days=5)
    old = server.issue(
        key.public_key(),
        "plc-originator-7",
        not_before=not_after - datetime.timedelta(days=90),
        not_after=not_after,
    )
    vault.put(
        "plc-id",
        {
            "certPem": old.public_bytes(PEM).decode(),
            "keyPem": key.private_bytes(
                PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ).decode(),
        },
    )
    server.pending = 1  # the renewal answers 202 first: polling goes on with the old cert
    adapter = harness.start(
        EthernetIpAdapter,
        _tls_document(tmp_path, harness, tunnel.endpoint, {"server": server.url}, cip.root),
    )
    data = adapter.data_topic("plc-1", "temp")
    wait_until(lambda: len(adapter.seen.on(data)) > 0, 20, "data polled with the old cert")

    def renewed() -> bool:
        cert = _client_cert(adapter)
        return cert is not None and cert["serial"] != format(old.serial_number, "x")

    wait_until(renewed, 30, "the renewed certificate in use")
    assert [r.status for r in server.requests] == [202, 200]
    assert all(r.client_cn == "plc-originator-7" for r in server.requests)
    seen = len(adapter.seen.on(data))
    reads = adapter.client.call("status", instance="plc-1")["counters"]["reads"]
    wait_until(
        lambda: adapter.client.call("status", instance="plc-1")["counters"]["reads"] > reads + 2,
        20,
        "polling with the renewed cert",
    )
    assert len(adapter.seen.on(data)) >= seen
