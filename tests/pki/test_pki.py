"""unskit.pki on its own: the loaders, the one summary format, the identity and the sources
of identities and trust anchors (the protocols' use of them is tested in cip/ and opcua/)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.pki import CipPki, make_cip_pki
from unskit.config.vault import Vault, VaultKey, VaultSecrets
from unskit.errors import CredentialError
from unskit.pki import (
    CertificateSummary,
    ClientIdentity,
    chain_to_anchor,
    identity_material,
    load_certificates,
    load_private_key,
    parse_identity,
    trust_anchors,
)
from unskit.pki.certificates import split_der_chain

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> CipPki:
    return make_cip_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secrets(tmp_path: Path) -> VaultSecrets:
    key = VaultKey.generate()
    (tmp_path / "vault.key").write_text(key.to_text())
    Vault(tmp_path / "vault.json", key).put("placeholder", "x")
    return VaultSecrets(tmp_path / "vault.json", key_file=tmp_path / "vault.key")


def der_of(pem: bytes) -> bytes:
    return b"".join(
        cert.public_bytes(serialization.Encoding.DER)
        for cert in x509.load_pem_x509_certificates(pem)
    )


def no_pem(text: str) -> None:
    assert "-----BEGIN" not in text, text
    assert "MII" not in text, text


# -- loaders ---------------------------------------------------------------------------------


def test_a_pem_chain_and_its_der_form_load_the_same_certificates(pki: CipPki) -> None:
    pem = pki.client.chain.read_bytes()
    from_pem = load_certificates(pem, "chain")
    from_der = load_certificates(der_of(pem), "chain", der=True)
    assert len(from_pem) == 2
    assert from_pem == from_der
    assert [item for _, item in split_der_chain(der_of(pem))] == [
        cert.public_bytes(serialization.Encoding.DER) for cert in from_pem
    ]


@pytest.mark.parametrize(
    ("data", "der", "words"),
    [
        (b"hello", False, r"the thing is not PEM \(no CERTIFICATE block\)"),
        (b"hello", True, "the thing is not PEM or DER"),
        (b"\x30\x82\x01", True, "the thing is corrupt DER"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", False, "corrupt PEM"),
    ],
    ids=["text", "text-der-allowed", "truncated-der", "corrupt-pem"],
)
def test_what_is_not_a_certificate_is_a_credential_error(
    data: bytes, der: bool, words: str
) -> None:
    with pytest.raises(CredentialError, match=words):
        load_certificates(data, "thing", der=der)


def test_der_is_refused_where_only_pem_is_accepted(pki: CipPki) -> None:
    with pytest.raises(CredentialError, match="not PEM"):
        load_certificates(der_of(pki.client.cert.read_bytes()), "client certificate")


def test_an_encrypted_key_is_refused_without_quoting_it() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    with pytest.raises(CredentialError, match="encrypted private key") as raised:
        load_private_key(pem, "client key")
    no_pem(str(raised.value))


def test_a_der_key_loads_only_where_der_is_allowed() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    der = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    assert load_private_key(der, "key", der=True).public_key() == key.public_key()
    with pytest.raises(CredentialError, match="not an unencrypted PEM private key"):
        load_private_key(der, "key")


# -- the summary -----------------------------------------------------------------------------


def test_the_summary_is_one_format(pki: CipPki) -> None:
    cert = x509.load_pem_x509_certificate(pki.client.cert.read_bytes())
    summary = CertificateSummary.of(cert)
    assert summary == CertificateSummary.of_der(cert.public_bytes(serialization.Encoding.DER))
    assert summary.to_json() == {
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serial": format(cert.serial_number, "x"),
        "notBefore": cert.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "notAfter": cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
        "sanUris": [],
    }
    assert summary.subject == "CN=edge-client"


# -- the identity ----------------------------------------------------------------------------


def test_an_identity_gives_back_equivalent_pem(pki: CipPki) -> None:
    identity = parse_identity(pki.client.chain.read_bytes(), pki.client.key.read_bytes())
    assert identity.summary().subject == "CN=edge-client"
    assert len(identity.chain) == 1, "the intermediate travels with the leaf"
    again = parse_identity(identity.cert_chain_pem(), identity.key_pem().reveal().encode())
    assert again.certificate == identity.certificate
    assert again.chain == identity.chain
    assert again.certificate_der == identity.certificate_der
    no_pem(repr(identity))


def test_a_key_that_is_not_the_leafs_is_refused(pki: CipPki) -> None:
    with pytest.raises(CredentialError, match="the client key does not match the client"):
        parse_identity(pki.client.cert.read_bytes(), pki.device.key.read_bytes())


class _Token:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_a_tokens_key_never_leaves_it_and_close_ends_the_session(pki: CipPki) -> None:
    plain = parse_identity(pki.client.cert.read_bytes(), pki.client.key.read_bytes())
    token = _Token()
    with ClientIdentity(plain.certificate, plain.private_key, token=token) as identity:
        assert "key=token" in repr(identity)
        with pytest.raises(CredentialError, match="in a token"):
            identity.key_pem()
    assert token.closed == 1


# -- sources ---------------------------------------------------------------------------------


def test_identity_material_from_files_and_from_a_vault_bundle(
    pki: CipPki, secrets: VaultSecrets
) -> None:
    cert, key, root = (p.read_bytes() for p in (pki.client.chain, pki.client.key, pki.root))
    files = identity_material(
        {"certFile": str(pki.client.chain), "keyFile": str(pki.client.key)}, secrets, "client"
    )
    assert (files.cert_pem, files.key_pem, files.ca_pem) == (cert, key, None)
    secrets.vault().put(
        "id", {"certPem": cert.decode(), "keyPem": key.decode(), "caPem": root.decode()}
    )
    bundle = identity_material({"certSecret": "id"}, secrets, "client")
    assert (bundle.cert_pem, bundle.key_pem, bundle.ca_pem) == (cert, key, root)
    no_pem(repr(bundle))
    inline = identity_material(
        {
            "cert": {"$secret": "id", "field": "certPem"},
            "key": {"$secret": "id", "field": "keyPem"},
        },
        secrets,
        "client",
    )
    assert (inline.cert_pem, inline.key_pem) == (cert, key)


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ({}, r"client names no client identity"),
        ({"certFile": "/nope/c.pem", "keyFile": "/nope/k.pem"}, r"client\.certFile /nope/c\.pem"),
        ({"certSecret": "plain"}, "is a plain value, not a certPem/keyPem bundle"),
        ({"certSecret": "half"}, "'half' has no keyPem field"),
        ({"cert": {"not": "a ref"}, "key": {"$secret": "x"}}, r"client\.cert is not a \$secret"),
        ({"certSecret": "missing"}, "has no secret named 'missing'"),
    ],
    ids=["empty", "missing-file", "plain", "half-bundle", "not-a-ref", "absent"],
)
def test_an_unusable_identity_block_names_its_key(
    secrets: VaultSecrets, block: dict[str, Any], words: str
) -> None:
    secrets.vault().put("plain", "x")
    secrets.vault().put("half", {"certPem": "c"})
    with pytest.raises(CredentialError, match=words):
        identity_material(block, secrets, "client")


def test_without_a_vault_a_vault_block_is_a_clear_error() -> None:
    with pytest.raises(CredentialError, match=r"client\.certSecret needs the vault"):
        identity_material({"certSecret": "id"}, None, "client")


def test_trust_anchors_of_every_block_kind(pki: CipPki, secrets: VaultSecrets) -> None:
    root, new_root = pki.root.read_bytes(), pki.new_root.read_bytes()
    vault = secrets.vault()
    vault.put("root", root.decode())
    vault.put("bundle", {"caPem": root.decode(), "note": "not a certificate"})
    vault.put("store", root.decode())
    vault.put("store", new_root.decode(), keep_versions=1)
    assert trust_anchors({}, secrets, "ca") == []
    assert trust_anchors({"file": str(pki.root)}, secrets, "ca") == [root]
    assert trust_anchors({"secret": "root"}, secrets, "ca") == [root]
    assert trust_anchors({"secret": "bundle"}, secrets, "ca") == [root]
    assert trust_anchors({"bundle": "bundle"}, secrets, "ca") == [root]
    assert trust_anchors({"cert": {"$secret": "root"}}, secrets, "ca") == [root]
    assert trust_anchors({"list": [{"$secret": "root"}]}, secrets, "ca") == [root]
    assert sorted(trust_anchors({"trustStore": "store"}, secrets, "ca")) == sorted(
        [root, new_root]
    ), "every retained version is trusted during a rollover"


def test_a_trust_secret_without_a_certificate_is_refused(secrets: VaultSecrets) -> None:
    secrets.vault().put("nothing", {"note": "no certificate here"})
    with pytest.raises(CredentialError, match=r"ca\.secret 'nothing' holds no PEM certificate"):
        trust_anchors({"secret": "nothing"}, secrets, "ca")


# -- the path to an anchor -------------------------------------------------------------------


def test_a_leaf_chains_through_its_intermediate_to_the_root(pki: CipPki) -> None:
    def load(path: Path) -> tuple[x509.Certificate, bytes]:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        return cert, cert.public_bytes(serialization.Encoding.DER)

    leaf, _ = load(pki.client.cert)
    intermediate, root = load(pki.intermediate), load(pki.root)
    path = chain_to_anchor(leaf, [intermediate, root], {root[1]})
    assert path == [leaf, intermediate[0], root[0]]
    assert chain_to_anchor(leaf, [root], {root[1]}) is None, "the intermediate is missing"
    other = load(pki.other_ca)
    assert chain_to_anchor(leaf, [intermediate, other], {other[1]}) is None


def test_an_expired_leaf_still_summarises(pki: CipPki) -> None:
    cert = x509.load_pem_x509_certificate(pki.client_expired.cert.read_bytes())
    summary = CertificateSummary.of(cert)
    assert summary.not_after < datetime.datetime.now(datetime.timezone.utc)
