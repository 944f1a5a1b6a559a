"""CIP Security without a device: malformed security blocks refused with their JSON path,
credential loading and its errors (never quoting PEM), the expiry events' once-a-day rule,
and the posture decoder."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cip.test_config import poll_instance
from tests.support.pki import CipPki, make_cip_pki
from unskit.cip.component import EthernetIpAdapter
from unskit.cip.config import parse_component
from unskit.cip.posture import decode_suites, read_posture
from unskit.cip.security import (
    CERT_EXPIRED,
    CERT_EXPIRING,
    ExpiryWatch,
    SecurityPolicy,
    load_credentials,
    parse_credentials,
)
from unskit.config.loader import resolve_config
from unskit.config.platform import Platform
from unskit.config.vault import Vault, VaultKey, VaultSecrets
from unskit.errors import CredentialError
from unskit.pki.certificates import CertificateSummary

pytestmark = pytest.mark.unit

SEC = "$.component.instances[0].connection.security"


def config(*instances: dict[str, Any]) -> Any:
    document = {
        "component": {"instances": list(instances)},
        "messaging": {"local": {"host": "127.0.0.1", "port": 1883}},
        # $secret references need a vault section; nothing opens it while parsing.
        "credentials": {"vaultPath": "/nonexistent/vault.json"},
    }
    return resolve_config(
        document,
        thing="gw",
        platform=Platform.HOST,
        component_schema=EthernetIpAdapter.schema,
        default_component=EthernetIpAdapter.token,
    )


def secured(security: dict[str, Any]) -> dict[str, Any]:
    return poll_instance("p", connection={"endpoint": "h", "security": security})


TLS_FILES = {"mode": "tls", "client": {"certFile": "/c", "keyFile": "/k"}, "ca": {"file": "/ca"}}

MALFORMED = [
    ("unknown mode", {"mode": "dtls"}, f"{SEC}.mode"),
    ("unknown key", {"mode": "tls", "colour": 1}, f"{SEC}.colour"),
    ("unknown client key", {**TLS_FILES, "client": {"certPath": "/c"}}, f"{SEC}.client.certPath"),
    ("verifyPeer not boolean", {**TLS_FILES, "verifyPeer": "no"}, f"{SEC}.verifyPeer"),
    ("empty serverName", {**TLS_FILES, "serverName": ""}, f"{SEC}.serverName"),
    (
        "cipherSuites not a list",
        {**TLS_FILES, "cipherSuites": "TLS_AES_128_GCM_SHA256"},
        f"{SEC}.cipherSuites",
    ),
    ("empty cipherSuites", {**TLS_FILES, "cipherSuites": []}, f"{SEC}.cipherSuites"),
    (
        "a CBC suite",
        {**TLS_FILES, "cipherSuites": ["TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256"]},
        f"{SEC}.cipherSuites[0]",
    ),
    (
        "a made-up suite",
        {**TLS_FILES, "cipherSuites": ["TLS13_AES_128_GCM_SHA256", "FAST"]},
        f"{SEC}.cipherSuites[1]",
    ),
    ("negative reload", {**TLS_FILES, "reloadIntervalSecs": -1}, f"{SEC}.reloadIntervalSecs"),
    (
        "negative renewBeforeDays",
        {**TLS_FILES, "client": {**TLS_FILES["client"], "renewBeforeDays": -2}},
        f"{SEC}.client.renewBeforeDays",
    ),
    (
        "vault and files mixed",
        {**TLS_FILES, "client": {"certSecret": "id", "certFile": "/c", "keyFile": "/k"}},
        f"{SEC}.client",
    ),
    (
        "inline and vault mixed",
        {
            **TLS_FILES,
            "client": {"certSecret": "id", "cert": {"$secret": "c"}, "key": {"$secret": "k"}},
        },
        f"{SEC}.client",
    ),
    ("certFile without keyFile", {**TLS_FILES, "client": {"certFile": "/c"}}, f"{SEC}.client"),
    (
        "inline cert without key",
        {**TLS_FILES, "client": {"cert": {"$secret": "c"}}},
        f"{SEC}.client",
    ),
    (
        "inline cert not a $secret",
        {**TLS_FILES, "client": {"cert": "PEM", "key": {"$secret": "k"}}},
        f"{SEC}.client.cert",
    ),
    ("CA styles mixed", {**TLS_FILES, "ca": {"file": "/ca", "trustStore": "t"}}, f"{SEC}.ca"),
    ("empty ca.list", {**TLS_FILES, "ca": {"list": []}}, f"{SEC}.ca.list"),
    ("ca.list of strings", {**TLS_FILES, "ca": {"list": ["PEM"]}}, f"{SEC}.ca.list[0]"),
    ("tls without identity", {"mode": "tls", "ca": {"file": "/ca"}}, f"{SEC}.client"),
    (
        "verifyPeer without anchors",
        {"mode": "tls", "client": {"certFile": "/c", "keyFile": "/k"}},
        f"{SEC}.ca",
    ),
]


@pytest.mark.parametrize(
    ("security", "path"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_a_malformed_security_block_is_refused_with_its_path(
    security: dict[str, Any], path: str
) -> None:
    candidate = parse_component(config(secured(security)))
    assert candidate.specs == []
    (skipped,) = candidate.skipped
    paths = [issue.path for issue in skipped.issues]
    assert path in paths, skipped.reason


def test_verify_peer_false_needs_no_anchors_and_suites_take_either_name() -> None:
    security = {
        "mode": "tls",
        "client": {"certSecret": "id"},
        "verifyPeer": False,
        "cipherSuites": ["TLS13_AES_128_GCM_SHA256", "tls_aes_256_gcm_sha384"],
    }
    (spec,) = parse_component(config(secured(security))).specs
    assert spec.endpoint == "h:2221"
    policy = SecurityPolicy.from_block(security)
    assert (policy.tls, policy.verify_peer, policy.client_source) == (True, False, "vault")
    assert (policy.renew_before_days, policy.reload_interval_secs) == (30, 300)


# -- credentials -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> CipPki:
    return make_cip_pki(tmp_path_factory.mktemp("pki"))


def no_pem(text: str) -> None:
    assert "BEGIN" not in text, text
    assert "MII" not in text, text


def test_files_load_and_the_repr_shows_no_pem(pki: CipPki) -> None:
    policy = SecurityPolicy.from_block(
        {
            "mode": "tls",
            "client": {"certFile": str(pki.client.chain), "keyFile": str(pki.client.key)},
            "ca": {"file": str(pki.root)},
        }
    )
    credentials = load_credentials(policy, None)
    assert credentials.client.subject == "CN=edge-client"
    assert [root.subject for root in credentials.roots] == ["CN=unskit test root"]
    no_pem(repr(credentials))
    no_pem(str(credentials.client.to_json()))


@pytest.mark.parametrize(
    ("breaks", "words"),
    [
        (lambda cert, key: (cert.replace(b"M", b"*", 4), key), "corrupt PEM"),
        (lambda cert, key: (b"hello", key), "not PEM"),
        (
            lambda cert, key: (
                cert,
                b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            ),
            "client key",
        ),
        (lambda cert, key: (cert, key.replace(b"M", b"Q", 3)), "client key"),
    ],
    ids=["corrupt-cert", "not-pem", "corrupt-key", "altered-key"],
)
def test_broken_material_is_a_clear_error_without_the_pem(
    pki: CipPki, breaks: Any, words: str
) -> None:
    cert, key = breaks(pki.client.chain.read_bytes(), pki.client.key.read_bytes())
    with pytest.raises(CredentialError, match=words) as raised:
        parse_credentials(cert, key, [pki.root.read_bytes()], source="file")
    no_pem(str(raised.value))


def test_a_key_that_does_not_match_its_certificate(pki: CipPki) -> None:
    with pytest.raises(CredentialError, match="does not match"):
        parse_credentials(
            pki.client.chain.read_bytes(), pki.device.key.read_bytes(), [], source="file"
        )


def test_vault_sources_and_their_errors(pki: CipPki, tmp_path: Path) -> None:
    key = VaultKey.generate()
    (tmp_path / "k").write_text(key.to_text())
    vault = Vault(tmp_path / "v.json", key)
    secrets = VaultSecrets(tmp_path / "v.json", key_file=tmp_path / "k")
    vault.put(
        "id",
        {
            "certPem": pki.client.chain.read_text(),
            "keyPem": pki.client.key.read_text(),
            "caPem": pki.root.read_text(),
        },
    )
    vault.put("plain", "not a bundle")
    vault.put("half", {"certPem": pki.client.chain.read_text()})
    vault.put("trust", pki.root.read_text())
    vault.put("trust", {"caPem": pki.new_root.read_text()}, keep_versions=3)

    def policy(client: dict[str, Any], ca: dict[str, Any] | None = None) -> SecurityPolicy:
        return SecurityPolicy.from_block(
            {"mode": "tls", "client": client, **({"ca": ca} if ca else {})}
        )

    bundle = load_credentials(policy({"certSecret": "id"}), secrets)
    assert len(bundle.roots) == 1, "the bundle's caPem"
    store = load_credentials(policy({"certSecret": "id"}, {"trustStore": "trust"}), secrets)
    assert {r.subject for r in store.roots} == {"CN=unskit test root", "CN=unskit test root 2"}
    for client, words in (
        ({"certSecret": "plain"}, "plain value"),
        ({"certSecret": "half"}, "no keyPem"),
        ({"certSecret": "absent"}, "no secret named 'absent'"),
    ):
        with pytest.raises(CredentialError, match=words):
            load_credentials(policy(client), secrets)
    with pytest.raises(CredentialError, match="needs the vault"):
        load_credentials(policy({"certSecret": "id"}), None)
    with pytest.raises(CredentialError, match=r"client\.certFile /nope"):
        load_credentials(policy({"certFile": "/nope", "keyFile": "/nope"}, {"file": "/x"}), None)


# -- expiry events ----------------------------------------------------------------------------


def test_expiry_events_fire_once_per_certificate_per_day() -> None:
    now = [datetime.datetime(2026, 11, 27, 8, tzinfo=datetime.timezone.utc)]
    sent: list[tuple[str, str, Any]] = []
    watch = ExpiryWatch(lambda *event: sent.append(event), 30, clock=lambda: now[0])
    cert = CertificateSummary(
        "CN=c",
        "CN=i",
        "1",
        now[0] - datetime.timedelta(days=300),
        now[0] + datetime.timedelta(days=10),
        "aa",
    )
    far = CertificateSummary(
        "CN=f", "CN=i", "2", cert.not_before, now[0] + datetime.timedelta(days=90), "bb"
    )
    assert watch.check(far) is None
    assert watch.check(cert) == CERT_EXPIRING
    for _ in range(100):
        assert watch.check(cert) is None, "not per poll"
    now[0] += datetime.timedelta(hours=17)  # the next UTC day
    assert watch.check(cert) == CERT_EXPIRING
    now[0] += datetime.timedelta(days=10)
    assert watch.check(cert) == CERT_EXPIRED
    assert watch.check(cert) is None
    assert [(severity, kind) for severity, kind, _ in sent] == [
        ("warning", CERT_EXPIRING),
        ("warning", CERT_EXPIRING),
        ("error", CERT_EXPIRED),
    ]
    assert sent[0][2]["daysLeft"] == 10.0
    assert sent[0][2]["certificate"]["notAfter"] == "2026-12-07T08:00:00Z"


# -- posture --------------------------------------------------------------------------------


def test_posture_decodes_the_security_objects() -> None:
    attributes = {
        (0x5D, 1): b"\x02",
        (0x5D, 2): (0b110).to_bytes(2, "little"),
        (0x5D, 3): (0b010).to_bytes(2, "little"),
        (0x5E, 1): b"\x02",
        (0x5E, 3): bytes([2, 0x13, 0x01, 0xC0, 0x2B]),
        (0x5E, 4): bytes([1, 0x13, 0x01]),
        (0x5E, 6): b"\x01",
        (0x5E, 9): b"\x01",
        (0x5E, 11): b"\x00",
    }
    posture = read_posture(lambda cls, attr: attributes.get((cls, attr)))
    assert posture == {
        "state": "configured",
        "profiles": ["ethernetIpIntegrity", "ethernetIpConfidentiality"],
        "profilesConfigured": ["ethernetIpIntegrity"],
        "ethernetIpState": "configured",
        "availableCipherSuites": [
            "TLS_AES_128_GCM_SHA256",
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        ],
        "allowedCipherSuites": ["TLS_AES_128_GCM_SHA256"],
        "verifyClientCertificate": True,
        "checkExpiration": False,
        "activeDeviceCertificates": 1,
    }
    assert read_posture(lambda cls, attr: None) is None
    assert decode_suites(bytes([2, 0x13])) is None, "truncated"
    assert decode_suites(bytes([1, 0xAB, 0xCD])) == ["0xABCD"]
