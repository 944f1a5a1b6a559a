"""The OPC UA driver's security against the asyncua sim (a real server in a subprocess):
client identities from file, vault and a SoftHSM2 token, the server trust list and pin,
UserName tokens inline and from the vault, and what sb/status shows of it."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from tests.support.opcua import (
    AppCertificate,
    CollectingSink,
    OpcUaSim,
    file_identity,
    good,
    instance,
    matcher,
    secure_connection,
    sim_options,
    subscription,
    trust,
)
from tests.support.softhsm import SoftHsmToken, make_softhsm_token
from unskit.config import SecretRef, Vault, VaultKey, VaultSecrets
from unskit.errors import DeviceError
from unskit.opcua.config import (
    ClientCertificate,
    OpcUaConnection,
    ServerCertificatePin,
    TrustSettings,
    UserToken,
)
from unskit.opcua.security import sha1_thumbprint

pytestmark = pytest.mark.integration

COUNTER = "ns=2;s=Counter"
PASSWORD = "s3cret-Pa55"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def counting(make_driver: Any, connection: OpcUaConnection, **kwargs: Any) -> Any:
    """A driver subscribed to the sim's Counter once connected."""
    spec = instance(connection.endpoint, [subscription(matcher("Counter"))], connection=connection)
    return make_driver(spec, **kwargs)


def receives_values(driver: Any) -> CollectingSink:
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    sink.wait_for(lambda: len(good(sink, COUNTER)) >= 2, 15, "Counter values")
    return sink


@pytest.fixture(scope="module")
def secure_sim(
    tmp_path_factory: pytest.TempPathFactory, opcua_certs: dict[str, AppCertificate]
) -> Iterator[OpcUaSim]:
    """One secure sim for the module's tests (none of them stops or changes it)."""
    options = sim_options(opcua_certs["server"], "--users", f"bob:{PASSWORD}")
    sim = OpcUaSim(tmp_path_factory.mktemp("secure-sim"), options).start()
    yield sim
    sim.stop()


# -- (a) a file identity, the server certificate in trusted/ ------------------------------


@pytest.mark.parametrize(
    "policy", ["Basic256Sha256", "Aes128_Sha256_RsaOaep", "Aes256_Sha256_RsaPss"]
)
def test_a_trusted_server_and_a_file_identity_deliver_values(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    tmp_path: Path,
    policy: str,
) -> None:
    pki = tmp_path / "pki"
    trust(pki, opcua_certs["server"])
    client = opcua_certs["client"]
    connection = secure_connection(
        secure_sim.endpoint,
        pki,
        file_identity(client),
        policy=policy,
        user=UserToken("bob", PASSWORD),
    )
    driver = counting(make_driver, connection)
    receives_values(driver)
    described = driver.describe()
    assert (described["securityPolicy"], described["messageMode"]) == (policy, "SignAndEncrypt")
    assert described["serverCertificate"]["sha256"] == sha256(opcua_certs["server"].der)
    assert described["serverCertificate"]["sanUris"] == ["urn:unskit:sim:server"]
    security = described["security"]
    assert security["pkiDir"] == str(pki)
    assert security["serverCertificatePinned"] is False
    assert security["clientCertificate"]["source"] == "file"
    assert security["clientCertificate"]["sha256"] == sha256(client.der)
    assert security["applicationUri"] == "urn:unskit:test:client"
    assert security["user"] == "bob"
    text = json.dumps(described)
    assert PASSWORD not in text
    assert "PRIVATE KEY" not in text
    assert not any((pki / "rejected").iterdir())


def test_policy_none_runs_no_trust_list(
    opcua_server: Callable[..., OpcUaSim], make_driver: Any, tmp_path: Path
) -> None:
    sim = opcua_server()
    pki = tmp_path / "pki-none"
    connection = OpcUaConnection(sim.endpoint, trust=TrustSettings(str(pki)))
    driver = counting(make_driver, connection)
    receives_values(driver)
    assert not pki.exists(), "no pkiDir is created under policy None"
    described = driver.describe()
    assert described["serverCertificate"] is None
    assert described["security"]["pkiDir"] is None
    assert described["security"]["clientCertificate"] is None


def test_an_application_uri_unlike_the_certificate_san_is_refused(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    tmp_path: Path,
) -> None:
    connection = secure_connection(
        secure_sim.endpoint,
        tmp_path / "pki",
        file_identity(opcua_certs["client"]),
        application_uri="urn:someone:else",
    )
    driver = counting(make_driver, connection)
    with pytest.raises(
        DeviceError, match=r"connection\.applicationUri: 'urn:someone:else' differs"
    ) as refused:
        driver.connect(10)
    assert refused.value.code == "BadConfigurationError"


# -- (b) an untrusted server, then trusted by the operator --------------------------------


def test_an_untrusted_server_is_refused_until_an_operator_trusts_it(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    server = opcua_certs["server"]
    connection = secure_connection(secure_sim.endpoint, pki, file_identity(opcua_certs["client"]))
    driver = counting(make_driver, connection)
    with pytest.raises(DeviceError) as refused:
        driver.connect(10)
    assert refused.value.code == "BadCertificateUntrusted"
    thumbprint = sha1_thumbprint(server.der.read_bytes())
    rejected = pki / "rejected" / f"{thumbprint}.der"
    assert thumbprint in str(refused.value)
    assert str(rejected) in str(refused.value)
    assert rejected.read_bytes() == server.der.read_bytes()
    assert {p.name for p in pki.iterdir()} == {"trusted", "rejected", "issuers"}
    assert driver.describe()["serverCertificate"] is None
    driver.close()  # what the runtime does before it backs off
    # The operator trusts it: the next connect of the same instance works, no restart.
    shutil.move(rejected, pki / "trusted" / rejected.name)
    receives_values(driver)
    assert driver.describe()["serverCertificate"]["sha256"] == sha256(server.der)


# -- (c) a pin ----------------------------------------------------------------------------


def test_a_pin_equal_to_the_server_certificate_needs_no_trust_list(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    (pki / "trusted").mkdir(parents=True)
    pin = ServerCertificatePin("file", path=str(opcua_certs["server"].pem))
    connection = secure_connection(
        secure_sim.endpoint, pki, file_identity(opcua_certs["client"]), pin=pin
    )
    driver = counting(make_driver, connection)
    receives_values(driver)
    assert not any((pki / "trusted").iterdir())
    assert driver.describe()["security"]["serverCertificatePinned"] is True


def test_a_pin_of_another_certificate_refuses_even_a_trusted_server(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    tmp_path: Path,
) -> None:
    pki = tmp_path / "pki"
    trust(pki, opcua_certs["server"])
    pin = ServerCertificatePin("file", path=str(opcua_certs["client"].der))
    connection = secure_connection(
        secure_sim.endpoint, pki, file_identity(opcua_certs["client"]), pin=pin
    )
    driver = counting(make_driver, connection)
    with pytest.raises(DeviceError, match="pinned server certificate") as refused:
        driver.connect(10)
    assert refused.value.code == "BadCertificateUntrusted"
    thumbprint = sha1_thumbprint(opcua_certs["server"].der.read_bytes())
    assert (pki / "rejected" / f"{thumbprint}.der").exists()


# -- (d) the vault: identity and user -----------------------------------------------------


@pytest.fixture
def vault(tmp_path: Path) -> tuple[Vault, VaultSecrets]:
    key = VaultKey.generate()
    path = tmp_path / "vault.json"
    return Vault(path, key), VaultSecrets(
        path, key_env="OPCUA_TEST_KEY", environ={"OPCUA_TEST_KEY": key.to_text()}
    )


@pytest.mark.slow
def test_a_vault_identity_and_a_vault_user(
    opcua_server: Callable[..., OpcUaSim],
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    vault: tuple[Vault, VaultSecrets],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim = opcua_server(*sim_options(opcua_certs["server"], "--users", f"bob:{PASSWORD}"))
    sim_strict = opcua_server(
        *sim_options(opcua_certs["server"], "--users", f"bob:{PASSWORD}", "--no-anonymous")
    )
    store, secrets = vault
    client = opcua_certs["client"]
    store.put(
        "opcua-client",
        {"certPem": client.pem.read_text(), "keyPem": client.key.read_text()},
    )
    store.put("plc-user", {"username": "bob", "password": PASSWORD})
    pki = tmp_path / "pki"
    trust(pki, opcua_certs["server"])
    user = UserToken(SecretRef("plc-user", "username"), SecretRef("plc-user", "password"))
    identity = ClientCertificate("vault", secret=SecretRef("opcua-client"))
    for endpoint in (sim.endpoint, sim_strict.endpoint):
        connection = secure_connection(endpoint, pki, identity, user=user)
        driver = counting(make_driver, connection, secrets=secrets)
        receives_values(driver)
    security = driver.describe()["security"]
    assert security["clientCertificate"]["source"] == "vault"
    assert security["clientCertificate"]["sha256"] == sha256(client.der)
    assert security["user"] == str(SecretRef("plc-user", "username"))
    assert PASSWORD not in json.dumps(driver.describe())
    assert PASSWORD not in repr(driver.__dict__)
    assert PASSWORD not in caplog.text


def test_a_vault_reference_without_a_vault_fails_the_connect_with_its_path(
    opcua_server: Callable[..., OpcUaSim],
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    tmp_path: Path,
) -> None:
    sim = opcua_server(*sim_options(opcua_certs["server"]))
    identity = ClientCertificate("vault", secret=SecretRef("opcua-client"))
    connection = secure_connection(sim.endpoint, tmp_path / "pki", identity)
    driver = counting(make_driver, connection)
    with pytest.raises(DeviceError, match=r"connection\.clientCertificate.*no vault") as refused:
        driver.connect(10)
    assert refused.value.code == "BadConfigurationError"
    assert not (tmp_path / "pki").exists(), "nothing was tried on the server"


# -- (e) the key on a SoftHSM2 token ------------------------------------------------------


@pytest.fixture
def softhsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHsmToken:
    return make_softhsm_token(tmp_path / "softhsm", monkeypatch)


@pytest.mark.parametrize("policy", ["Basic256Sha256", "Aes128_Sha256_RsaOaep"])
def test_a_session_with_the_key_on_a_softhsm_token(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    softhsm: SoftHsmToken,
    tmp_path: Path,
    policy: str,
) -> None:
    pki = tmp_path / "pki"
    trust(pki, opcua_certs["server"])
    identity = ClientCertificate("pkcs11", pkcs11=softhsm.settings())
    connection = secure_connection(secure_sim.endpoint, pki, identity, policy=policy)
    driver = counting(make_driver, connection)
    receives_values(driver)
    security = driver.describe()["security"]
    assert security["clientCertificate"]["source"] == "pkcs11"
    token_der = softhsm.certificate.public_bytes(serialization.Encoding.DER)
    assert security["clientCertificate"]["sha256"] == hashlib.sha256(token_der).hexdigest()
    assert security["applicationUri"] == softhsm.application_uri
    # The runtime closes and reconnects the same driver: the token serves again.
    driver.close()
    receives_values(driver)


def test_a_token_that_cannot_serve_the_policy_is_refused_once(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    softhsm: SoftHsmToken,
    tmp_path: Path,
) -> None:
    # SoftHSM 2.6 decrypts OAEP with SHA-1 only; Aes256_Sha256_RsaPss needs SHA-256.
    identity = ClientCertificate("pkcs11", pkcs11=softhsm.settings())
    connection = secure_connection(
        secure_sim.endpoint, tmp_path / "pki", identity, policy="Aes256_Sha256_RsaPss"
    )
    driver = counting(make_driver, connection)
    with pytest.raises(DeviceError, match=r"securityPolicy.*cannot decrypt") as refused:
        driver.connect(10)
    assert refused.value.code == "BadConfigurationError"
    driver.close()
    with pytest.raises(DeviceError, match="not tried again") as again:
        driver.connect(10)
    assert again.value.code == "BadConfigurationError"


def test_a_wrong_pin_is_tried_once_per_instance_start(
    secure_sim: OpcUaSim,
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    softhsm: SoftHsmToken,
    tmp_path: Path,
) -> None:
    identity = ClientCertificate("pkcs11", pkcs11=softhsm.settings(pin="0000"))
    connection = secure_connection(secure_sim.endpoint, tmp_path / "pki", identity)
    driver = counting(make_driver, connection)
    with pytest.raises(DeviceError, match="refused the login: PinIncorrect") as refused:
        driver.connect(10)
    assert "0000" not in str(refused.value)
    assert "not tried again" not in str(refused.value)
    driver.close()
    with pytest.raises(DeviceError, match="not tried again"):
        driver.connect(10)


# -- (f) a wrong password -----------------------------------------------------------------


def test_a_wrong_password_on_a_user_name_endpoint_is_a_clear_error(
    opcua_server: Callable[..., OpcUaSim],
    opcua_certs: dict[str, AppCertificate],
    make_driver: Any,
    tmp_path: Path,
) -> None:
    sim = opcua_server(
        *sim_options(opcua_certs["server"], "--users", f"bob:{PASSWORD}", "--no-anonymous")
    )
    pki = tmp_path / "pki"
    trust(pki, opcua_certs["server"])
    connection = secure_connection(
        sim.endpoint,
        pki,
        file_identity(opcua_certs["client"]),
        user=UserToken("bob", "wrong-guess"),
    )
    driver = counting(make_driver, connection)
    with pytest.raises(DeviceError) as refused:
        driver.connect(10)
    assert refused.value.code in ("BadUserAccessDenied", "BadIdentityTokenRejected")
    assert refused.value.code in str(refused.value)
    assert "as user 'bob'" in str(refused.value)
    assert "wrong-guess" not in str(refused.value)
