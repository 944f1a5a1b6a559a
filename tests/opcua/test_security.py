"""OPC UA security material: client identity (file, vault), server trust list and pin,
the UserName token; secrets never shown."""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from unskit.config import SecretRef, Vault, VaultKey, VaultSecrets
from unskit.errors import ConfigError, DeviceError
from unskit.opcua.config import (
    ClientCertificate,
    OpcUaConnection,
    ServerCertificatePin,
    TrustSettings,
    UserToken,
)
from unskit.opcua.security import (
    TrustStore,
    UserCredentials,
    load_client_identity,
    load_server_pin,
    resolve_user,
    sha1_thumbprint,
)
from unskit.pki.certificates import CertificateSummary
from unskit.pki.identity import ClientIdentity

CLIENT_URI = "urn:unskit:test:opcua:client"
PASSWORD = "pa55-w0rd-never-shown"
NOW = datetime.datetime.now(datetime.timezone.utc)
DAY = datetime.timedelta(days=1)
PEM = serialization.Encoding.PEM
DER = serialization.Encoding.DER


@dataclass(frozen=True)
class Issued:
    key: rsa.RSAPrivateKey
    cert: x509.Certificate

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(DER)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def _key() -> rsa.RSAPrivateKey:
    # RSA generation is the slow part: a small pool, each key used by one certificate a test.
    return rsa.generate_private_key(65537, 2048)


def issue(
    cn: str,
    *,
    issuer: Issued | None = None,
    ca: bool = False,
    uris: tuple[str, ...] = (),
    not_before: datetime.datetime = NOW - DAY,
    not_after: datetime.datetime = NOW + DAY,
    key: rsa.RSAPrivateKey | None = None,
    issuer_name: x509.Name | None = None,
) -> Issued:
    """A certificate for `cn`, self-signed unless `issuer` signs it."""
    key = key or _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name or (issuer.cert.subject if issuer else name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
    if uris:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
            critical=False,
        )
    signer = issuer.key if issuer else key
    return Issued(key, builder.sign(signer, hashes.SHA256()))


@pytest.fixture(scope="module")
def root() -> Issued:
    return issue("unskit test root", ca=True)


@pytest.fixture(scope="module")
def intermediate(root: Issued) -> Issued:
    return issue("unskit test intermediate", issuer=root, ca=True)


@pytest.fixture(scope="module")
def leaf(intermediate: Issued) -> Issued:
    return issue("opcua server", issuer=intermediate, uris=("urn:test:server",))


@pytest.fixture(scope="module")
def client() -> Issued:
    return issue("opcua client", uris=(CLIENT_URI,))


@pytest.fixture
def store(tmp_path: Path) -> TrustStore:
    return TrustStore(tmp_path / "pki" / "opc-1")


def secure(**overrides: object) -> OpcUaConnection:
    values: dict[str, object] = {
        "endpoint": "opc.tcp://127.0.0.1:4840",
        "security_policy": "Basic256Sha256",
        "message_mode": "SignAndEncrypt",
    }
    values.update(overrides)
    return OpcUaConnection(**values)  # type: ignore[arg-type]


def file_source(tmp_path: Path, cert: bytes, key: bytes) -> ClientCertificate:
    (tmp_path / "client.crt").write_bytes(cert)
    (tmp_path / "client.key").write_bytes(key)
    return ClientCertificate(
        "file", cert_path=str(tmp_path / "client.crt"), key_path=str(tmp_path / "client.key")
    )


def only_issue(error: ConfigError) -> tuple[str, str]:
    assert len(error.issues) == 1
    return error.issues[0].path, error.issues[0].message


# -- trust store ---------------------------------------------------------------------------


def test_directories_are_created_0700_at_first_use(store: TrustStore, leaf: Issued) -> None:
    assert not store.pki_dir.exists()
    with pytest.raises(DeviceError):
        store.check_server_certificate(leaf.der)
    for directory in (store.pki_dir, store.trusted, store.rejected, store.issuers):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.parametrize("form", ["der", "pem"])
def test_a_certificate_in_trusted_is_accepted(store: TrustStore, client: Issued, form: str) -> None:
    store.ensure()
    data = client.der if form == "der" else client.pem
    (store.trusted / f"peer.{form}").write_bytes(data)
    assert store.check_server_certificate(client.der) == client.cert
    assert list(store.rejected.iterdir()) == []


def test_a_certificate_chaining_to_a_trusted_ca_is_accepted(
    store: TrustStore, root: Issued, intermediate: Issued, leaf: Issued
) -> None:
    store.ensure()
    (store.trusted / "root.der").write_bytes(root.der)
    (store.issuers / "intermediate.pem").write_bytes(intermediate.pem)
    assert store.check_server_certificate(leaf.der) == leaf.cert


def test_the_servers_own_chain_supplies_the_intermediate(
    store: TrustStore, root: Issued, intermediate: Issued, leaf: Issued
) -> None:
    store.ensure()
    (store.trusted / "root.pem").write_bytes(root.pem)
    # Without the intermediate there is no path to the root.
    with pytest.raises(DeviceError):
        store.check_server_certificate(leaf.der)
    assert store.check_server_certificate(leaf.der + intermediate.der) == leaf.cert


def test_a_ca_in_issuers_alone_does_not_make_a_certificate_trusted(
    store: TrustStore, root: Issued, intermediate: Issued, leaf: Issued
) -> None:
    store.ensure()
    (store.issuers / "root.der").write_bytes(root.der)
    (store.issuers / "intermediate.der").write_bytes(intermediate.der)
    with pytest.raises(DeviceError, match="does not chain") as caught:
        store.check_server_certificate(leaf.der)
    assert caught.value.code == "BadCertificateUntrusted"


def test_an_untrusted_certificate_is_written_to_rejected_and_named(
    store: TrustStore, leaf: Issued
) -> None:
    with pytest.raises(DeviceError) as caught:
        store.check_server_certificate(leaf.der)
    thumbprint = sha1_thumbprint(leaf.der)
    rejected = store.rejected / f"{thumbprint}.der"
    assert caught.value.code == "BadCertificateUntrusted"
    assert thumbprint in str(caught.value)
    assert str(rejected) in str(caught.value)
    assert rejected.read_bytes() == leaf.der
    assert [p.name for p in store.rejected.iterdir()] == [rejected.name]
    # The operator's move from rejected/ to trusted/ is what trusts it; nothing else does.
    with pytest.raises(DeviceError):
        store.check_server_certificate(leaf.der)
    shutil.move(rejected, store.trusted / rejected.name)
    assert store.check_server_certificate(leaf.der) == leaf.cert


def test_the_pin_overrides_the_trust_list(
    store: TrustStore, client: Issued, leaf: Issued, root: Issued, intermediate: Issued
) -> None:
    store.ensure()
    for item in (client, root, intermediate):
        (store.trusted / f"{item.cert.serial_number}.der").write_bytes(item.der)
    # Trusted by the list, but not the pinned one: refused.
    with pytest.raises(DeviceError, match="pinned") as caught:
        store.check_server_certificate(client.der, pin=leaf.der)
    assert caught.value.code == "BadCertificateUntrusted"
    assert (store.rejected / f"{sha1_thumbprint(client.der)}.der").exists()
    # The pinned one is accepted whatever the list says.
    shutil.rmtree(store.trusted)
    store.trusted.mkdir()
    assert store.check_server_certificate(leaf.der, pin=leaf.der) == leaf.cert


@pytest.mark.parametrize(
    ("not_before", "not_after"),
    [(NOW - 3 * DAY, NOW - DAY), (NOW + DAY, NOW + 3 * DAY)],
    ids=["expired", "not-yet-valid"],
)
def test_a_trusted_certificate_outside_its_validity_is_rejected(
    store: TrustStore, not_before: datetime.datetime, not_after: datetime.datetime
) -> None:
    stale = issue("stale server", not_before=not_before, not_after=not_after)
    store.ensure()
    (store.trusted / "stale.der").write_bytes(stale.der)
    with pytest.raises(DeviceError, match="validity") as caught:
        store.check_server_certificate(stale.der)
    assert caught.value.code == "BadCertificateTimeInvalid"
    assert (store.rejected / f"{sha1_thumbprint(stale.der)}.der").exists()
    # The same pinned: still outside its validity.
    with pytest.raises(DeviceError, match="validity"):
        store.check_server_certificate(stale.der, pin=stale.der)


def test_an_expired_issuer_is_rejected(store: TrustStore) -> None:
    old_root = issue("old root", ca=True, not_before=NOW - 9 * DAY, not_after=NOW - DAY)
    leaf = issue("server", issuer=old_root, not_before=NOW - 5 * DAY)
    store.ensure()
    (store.trusted / "old-root.der").write_bytes(old_root.der)
    with pytest.raises(DeviceError) as caught:
        store.check_server_certificate(leaf.der)
    assert caught.value.code == "BadCertificateIssuerTimeInvalid"
    # The clock the check uses decides: within the root's validity the path is accepted.
    assert store.check_server_certificate(leaf.der, now=NOW - 2 * DAY) == leaf.cert


def test_a_forged_issuer_name_does_not_chain(store: TrustStore, root: Issued) -> None:
    impostor = issue("impostor", ca=True)
    forged = issue("server", issuer=impostor, issuer_name=root.cert.subject)
    store.ensure()
    (store.trusted / "root.der").write_bytes(root.der)
    with pytest.raises(DeviceError, match="does not chain"):
        store.check_server_certificate(forged.der)


def test_a_trusted_certificate_that_is_no_ca_issues_nothing(store: TrustStore) -> None:
    not_a_ca = issue("plain leaf", ca=False)
    child = issue("child", issuer=not_a_ca)
    store.ensure()
    (store.trusted / "leaf.der").write_bytes(not_a_ca.der)
    with pytest.raises(DeviceError, match="does not chain"):
        store.check_server_certificate(child.der)


def test_garbage_is_refused_and_not_written(store: TrustStore) -> None:
    with pytest.raises(DeviceError) as caught:
        store.check_server_certificate(b"\x30\x03abc-not-a-certificate")
    assert caught.value.code == "BadCertificateInvalid"
    assert list(store.rejected.iterdir()) == []


def test_an_unreadable_trust_list_file_is_skipped_with_a_warning(
    store: TrustStore, client: Issued, caplog: pytest.LogCaptureFixture
) -> None:
    store.ensure()
    (store.trusted / "notes.txt").write_text("not a certificate")
    (store.trusted / "peer.der").write_bytes(client.der)
    with caplog.at_level(logging.WARNING, logger="unskit.opcua.security"):
        assert store.check_server_certificate(client.der) == client.cert
    assert "notes.txt" in caplog.text


# -- server pin ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["pem", "der"])
def test_a_pin_from_a_file_is_der(tmp_path: Path, leaf: Issued, form: str) -> None:
    path = tmp_path / f"pin.{form}"
    path.write_bytes(leaf.pem if form == "pem" else leaf.der)
    assert load_server_pin(ServerCertificatePin("file", path=str(path)), None) == leaf.der


def test_a_pin_file_with_two_certificates_is_refused(tmp_path: Path, leaf: Issued) -> None:
    path = tmp_path / "two.pem"
    path.write_bytes(leaf.pem + leaf.pem)
    with pytest.raises(ConfigError) as caught:
        load_server_pin(ServerCertificatePin("file", path=str(path)), None)
    assert only_issue(caught.value)[0] == "connection.trust.serverCertificate.path"


def test_a_missing_pin_file_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read") as caught:
        load_server_pin(ServerCertificatePin("file", path=str(tmp_path / "nope.der")), None)
    assert only_issue(caught.value)[0] == "connection.trust.serverCertificate.path"


@pytest.fixture
def vault(tmp_path: Path) -> tuple[Vault, VaultSecrets]:
    key = VaultKey.generate()
    path = tmp_path / "vault.json"
    return Vault(path, key), VaultSecrets(
        path, key_env="OPCUA_TEST_KEY", environ={"OPCUA_TEST_KEY": key.to_text()}
    )


def test_a_pin_from_the_vault_defaults_to_ca_pem(
    vault: tuple[Vault, VaultSecrets], leaf: Issued, client: Issued
) -> None:
    store, secrets = vault
    store.put("peer", {"caPem": leaf.pem.decode(), "other": client.pem.decode()})
    assert load_server_pin(ServerCertificatePin("vault", secret=SecretRef("peer")), secrets) == (
        leaf.der
    )
    pin = ServerCertificatePin("vault", secret=SecretRef("peer", "other"))
    assert load_server_pin(pin, secrets) == client.der


# -- client identity -----------------------------------------------------------------------


def test_no_identity_under_policy_none(tmp_path: Path, client: Issued) -> None:
    connection = OpcUaConnection(
        "opc.tcp://127.0.0.1:4840",
        client_certificate=file_source(tmp_path, client.pem, client.key_pem()),
    )
    assert load_client_identity(connection, None) is None


@pytest.mark.parametrize("form", ["pem", "der"])
def test_identity_from_files(tmp_path: Path, client: Issued, form: str) -> None:
    if form == "pem":
        cert, key = client.pem, client.key_pem()
    else:
        cert = client.der
        key = client.key.private_bytes(
            DER, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    identity = load_client_identity(
        secure(client_certificate=file_source(tmp_path, cert, key)), None
    )
    assert isinstance(identity, ClientIdentity)
    assert identity.certificate == client.cert
    assert identity.certificate_der == client.der
    assert identity.application_uri == CLIENT_URI
    assert identity.private_key.private_numbers() == client.key.private_numbers()
    assert identity.chain == ()


def test_the_rest_of_a_pem_file_is_the_chain(
    tmp_path: Path, root: Issued, intermediate: Issued
) -> None:
    leaf = issue("chained client", issuer=intermediate, uris=(CLIENT_URI,))
    source = file_source(tmp_path, leaf.pem + intermediate.pem + root.pem, leaf.key_pem())
    identity = load_client_identity(secure(client_certificate=source), None)
    assert identity is not None
    assert identity.certificate == leaf.cert
    assert identity.chain == (intermediate.cert, root.cert)


def test_identity_from_a_vault_bundle(
    vault: tuple[Vault, VaultSecrets], client: Issued, root: Issued
) -> None:
    store, secrets = vault
    store.put(
        "opcua-client",
        {
            "certPem": client.pem.decode(),
            "keyPem": client.key_pem().decode(),
            "caPem": root.pem.decode(),
        },
    )
    source = ClientCertificate("vault", secret=SecretRef("opcua-client"))
    identity = load_client_identity(secure(client_certificate=source), secrets)
    assert identity is not None
    assert identity.certificate == client.cert
    assert identity.application_uri == CLIENT_URI
    assert identity.private_key.private_numbers() == client.key.private_numbers()
    assert identity.chain == (root.cert,)
    # caPem is optional.
    store.put("no-ca", {"certPem": client.pem.decode(), "keyPem": client.key_pem().decode()})
    source = ClientCertificate("vault", secret=SecretRef("no-ca"))
    identity = load_client_identity(secure(client_certificate=source), secrets)
    assert identity is not None
    assert identity.chain == ()


@pytest.mark.parametrize(
    ("secret", "field"),
    [("absent", "certPem"), ("cert-only", "keyPem")],
)
def test_a_vault_bundle_that_cannot_be_resolved_names_its_key(
    vault: tuple[Vault, VaultSecrets], client: Issued, secret: str, field: str
) -> None:
    store, secrets = vault
    store.put("cert-only", {"certPem": client.pem.decode()})
    source = ClientCertificate("vault", secret=SecretRef(secret))
    with pytest.raises(ConfigError) as caught:
        load_client_identity(secure(client_certificate=source), secrets)
    path, message = only_issue(caught.value)
    assert path == "connection.clientCertificate.secret"
    assert secret in message


def test_a_vault_source_without_a_vault_is_an_error(client: Issued) -> None:
    source = ClientCertificate("vault", secret=SecretRef("opcua-client"))
    with pytest.raises(ConfigError, match="no vault"):
        load_client_identity(secure(client_certificate=source), None)


def test_a_configured_application_uri_equal_to_the_san_is_used(
    tmp_path: Path, client: Issued
) -> None:
    source = file_source(tmp_path, client.pem, client.key_pem())
    identity = load_client_identity(
        secure(client_certificate=source, application_uri=CLIENT_URI), None
    )
    assert identity is not None
    assert identity.application_uri == CLIENT_URI


def test_an_application_uri_differing_from_the_san_is_an_error(
    tmp_path: Path, client: Issued
) -> None:
    source = file_source(tmp_path, client.pem, client.key_pem())
    with pytest.raises(ConfigError) as caught:
        load_client_identity(
            secure(client_certificate=source, application_uri="urn:somebody:else"), None
        )
    path, message = only_issue(caught.value)
    assert path == "connection.applicationUri"
    assert "urn:somebody:else" in message
    assert CLIENT_URI in message


def test_the_path_prefix_names_the_instance(tmp_path: Path, client: Issued) -> None:
    source = file_source(tmp_path, client.pem, client.key_pem())
    with pytest.raises(ConfigError) as caught:
        load_client_identity(
            secure(client_certificate=source, application_uri="urn:x"),
            None,
            path="$.component.instances[2].connection",
        )
    assert only_issue(caught.value)[0] == "$.component.instances[2].connection.applicationUri"


def test_a_certificate_without_a_san_uri_is_an_error(tmp_path: Path) -> None:
    bare = issue("no uri client")
    source = file_source(tmp_path, bare.pem, bare.key_pem())
    with pytest.raises(ConfigError, match="no SAN URI") as caught:
        load_client_identity(secure(client_certificate=source), None)
    assert only_issue(caught.value)[0] == "connection.clientCertificate"


def test_a_secure_policy_without_a_client_certificate_is_an_error() -> None:
    with pytest.raises(ConfigError, match="needs a client certificate") as caught:
        load_client_identity(secure(), None)
    assert only_issue(caught.value)[0] == "connection.clientCertificate"


def test_a_key_of_another_certificate_is_an_error(tmp_path: Path, client: Issued) -> None:
    other = issue("other", uris=(CLIENT_URI,))
    source = file_source(tmp_path, client.pem, other.key_pem())
    with pytest.raises(ConfigError, match="does not belong"):
        load_client_identity(secure(client_certificate=source), None)


def test_a_short_key_is_an_error(tmp_path: Path) -> None:
    weak = issue("weak", uris=(CLIENT_URI,), key=rsa.generate_private_key(65537, 1024))
    source = file_source(tmp_path, weak.pem, weak.key_pem())
    with pytest.raises(ConfigError, match="1024 bits"):
        load_client_identity(secure(client_certificate=source), None)


def test_an_ec_key_is_an_error(tmp_path: Path, client: Issued) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    source = file_source(tmp_path, client.pem, pem)
    with pytest.raises(ConfigError, match="not an RSA private key") as caught:
        load_client_identity(secure(client_certificate=source), None)
    assert only_issue(caught.value)[0] == "connection.clientCertificate.keyPath"


def test_an_encrypted_key_is_an_error(tmp_path: Path, client: Issued) -> None:
    pem = client.key.private_bytes(
        PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
    )
    source = file_source(tmp_path, client.pem, pem)
    with pytest.raises(ConfigError, match="encrypted"):
        load_client_identity(secure(client_certificate=source), None)


@pytest.mark.parametrize("which", ["certPath", "keyPath"])
def test_a_missing_file_names_its_key(tmp_path: Path, client: Issued, which: str) -> None:
    source = file_source(tmp_path, client.pem, client.key_pem())
    (tmp_path / ("client.crt" if which == "certPath" else "client.key")).unlink()
    with pytest.raises(ConfigError, match="cannot be read") as caught:
        load_client_identity(secure(client_certificate=source), None)
    assert only_issue(caught.value)[0] == f"connection.clientCertificate.{which}"


def test_key_material_is_never_shown(
    tmp_path: Path,
    vault: tuple[Vault, VaultSecrets],
    client: Issued,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, secrets = vault
    key_pem = client.key_pem().decode()
    key_body = "".join(key_pem.splitlines()[1:-1])
    store.put("opcua-client", {"certPem": client.pem.decode(), "keyPem": key_pem})
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG):
        source = ClientCertificate("vault", secret=SecretRef("opcua-client"))
        identity = load_client_identity(secure(client_certificate=source), secrets)
        shown += [repr(identity), str(identity)]
        for uri in ("urn:wrong", None):
            bad = secure(client_certificate=source, application_uri=uri)
            bad_key = ClientCertificate("vault", secret=SecretRef("broken"))
            store.put("broken", {"certPem": client.pem.decode(), "keyPem": key_pem[:-40]})
            for candidate in (bad, secure(client_certificate=bad_key)):
                try:
                    load_client_identity(candidate, secrets)
                except ConfigError as exc:
                    shown.append(str(exc))
                    logging.getLogger("test").exception("refused")
    shown.append(caplog.text)
    assert len(shown) >= 4
    for text in shown:
        assert key_body[:64] not in text
        assert key_body[-64:] not in text
        assert "PRIVATE KEY" not in text


# -- user ----------------------------------------------------------------------------------


def test_an_inline_user_resolves_and_hides_its_password() -> None:
    credentials = resolve_user(UserToken("operator", PASSWORD), None)
    username, password = credentials
    assert (username, password) == ("operator", PASSWORD)
    assert isinstance(credentials, UserCredentials)
    for text in (repr(credentials), str(credentials), f"{credentials}", repr([credentials])):
        assert PASSWORD not in text
    assert "operator" in repr(credentials)
    assert PASSWORD not in repr(UserToken("operator", PASSWORD))


def test_a_vault_user_resolves(
    vault: tuple[Vault, VaultSecrets], caplog: pytest.LogCaptureFixture
) -> None:
    store, secrets = vault
    store.put("plc-user", {"username": "vault-operator", "password": PASSWORD})
    token = UserToken(SecretRef("plc-user", "username"), SecretRef("plc-user", "password"))
    with caplog.at_level(logging.DEBUG):
        assert tuple(resolve_user(token, secrets)) == ("vault-operator", PASSWORD)
    assert PASSWORD not in caplog.text


def test_an_unresolvable_password_names_its_key_without_a_value(
    vault: tuple[Vault, VaultSecrets],
) -> None:
    store, secrets = vault
    store.put("plc-user", {"username": "vault-operator", "pw": PASSWORD})
    token = UserToken(SecretRef("plc-user", "username"), SecretRef("plc-user", "password"))
    with pytest.raises(ConfigError) as caught:
        resolve_user(token, secrets)
    path, message = only_issue(caught.value)
    assert path == "connection.user.password"
    assert "plc-user" in message
    assert PASSWORD not in message


# -- summary -------------------------------------------------------------------------------


def test_certificate_summary(leaf: Issued, intermediate: Issued) -> None:
    summary = CertificateSummary.of(leaf.cert).to_json()
    assert summary == {
        "subject": "CN=opcua server",
        "issuer": "CN=unskit test intermediate",
        "serial": format(leaf.cert.serial_number, "x"),
        "notBefore": leaf.cert.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "notAfter": leaf.cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sha256": leaf.cert.fingerprint(hashes.SHA256()).hex(),
        "sanUris": ["urn:test:server"],
    }
    assert CertificateSummary.of(intermediate.cert).to_json()["sanUris"] == []


def test_trust_settings_pki_dir_is_what_the_store_uses(tmp_path: Path) -> None:
    settings = TrustSettings(str(tmp_path / "pki" / "line-1"))
    store = TrustStore(settings.pki_dir)
    store.ensure()
    assert sorted(os.listdir(settings.pki_dir)) == ["issuers", "rejected", "trusted"]
