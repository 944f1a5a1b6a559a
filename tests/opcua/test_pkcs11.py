"""The client key on a real SoftHSM2 token: sign and decrypt run there, for cryptography and
for what asyncua's three secure policies call; the key cannot be read out."""

from __future__ import annotations

import logging
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from asyncua import ua
from asyncua.crypto import security_policies, uacrypto
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from pkcs11 import Attribute, ObjectClass
from pkcs11.exceptions import AttributeSensitive

from tests.support.softhsm import SoftHsmToken, make_softhsm_token
from unskit.errors import ConfigError, DeviceError
from unskit.opcua.config import ClientCertificate, OpcUaConnection, Pkcs11Key
from unskit.opcua.pkcs11 import Pkcs11PrivateKey, Pkcs11Token
from unskit.opcua.security import load_client_identity

# softhsm2-util runs as a process for every token.
pytestmark = pytest.mark.integration

MESSAGE = b"OpenSecureChannel request bytes to sign" * 20
OAEP_SHA1 = padding.OAEP(padding.MGF1(hashes.SHA1()), hashes.SHA1(), None)
OAEP_SHA256 = padding.OAEP(padding.MGF1(hashes.SHA256()), hashes.SHA256(), None)
PSS_32 = padding.PSS(padding.MGF1(hashes.SHA256()), 32)


@pytest.fixture
def softhsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHsmToken:
    return make_softhsm_token(tmp_path / "softhsm", monkeypatch)


@pytest.fixture
def token(softhsm: SoftHsmToken) -> Iterator[Pkcs11Token]:
    with Pkcs11Token.open(softhsm.settings()) as opened:
        yield opened


@pytest.fixture
def key(token: Pkcs11Token, softhsm: SoftHsmToken) -> Pkcs11PrivateKey:
    return token.private_key(softhsm.key_label)


def public(softhsm: SoftHsmToken) -> rsa.RSAPublicKey:
    key = softhsm.certificate.public_key()
    assert isinstance(key, rsa.RSAPublicKey)
    return key


def secure_connection(settings: Pkcs11Key, **overrides: object) -> OpcUaConnection:
    values: dict[str, object] = {
        "security_policy": "Basic256Sha256",
        "message_mode": "SignAndEncrypt",
        "client_certificate": ClientCertificate("pkcs11", pkcs11=settings),
        **overrides,
    }
    return OpcUaConnection("opc.tcp://127.0.0.1:4840", **values)  # type: ignore[arg-type]


def test_the_key_matches_the_certificate_on_the_token(
    key: Pkcs11PrivateKey, token: Pkcs11Token, softhsm: SoftHsmToken
) -> None:
    assert key.key_size == 2048
    assert key.public_key().public_numbers() == public(softhsm).public_numbers()
    assert token.certificate(softhsm.cert_label) == softhsm.certificate


@pytest.mark.parametrize(
    ("pad", "algorithm"),
    [
        (padding.PKCS1v15(), hashes.SHA256()),
        (PSS_32, hashes.SHA256()),
        (padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.DIGEST_LENGTH), hashes.SHA256()),
        (padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.MAX_LENGTH), hashes.SHA256()),
        (padding.PKCS1v15(), hashes.SHA1()),
    ],
    ids=["pkcs1v15-sha256", "pss-sha256-salt32", "pss-digest-length", "pss-max-length", "sha1"],
)
def test_a_token_signature_verifies_with_the_public_key(
    key: Pkcs11PrivateKey,
    softhsm: SoftHsmToken,
    pad: padding.AsymmetricPadding,
    algorithm: hashes.HashAlgorithm,
) -> None:
    signature = key.sign(MESSAGE, pad, algorithm)
    assert len(signature) == 256
    verify_pad = pad
    if isinstance(pad, padding.PSS):
        # The verifier needs the concrete salt length the signer used, or AUTO.
        verify_pad = padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.AUTO)
    public(softhsm).verify(signature, MESSAGE, verify_pad, algorithm)
    with pytest.raises(InvalidSignature):
        public(softhsm).verify(signature, MESSAGE + b"!", verify_pad, algorithm)


def oaep_sha256_on_token(token: Pkcs11Token) -> bool:
    """SoftHSM before 2.7 takes RSA-OAEP with SHA-1 only (CKR_ARGUMENTS_BAD otherwise)."""
    with token.session() as session:
        return session.token.firmware_version >= (2, 7)


@pytest.mark.parametrize("pad", [OAEP_SHA1, OAEP_SHA256], ids=["oaep-sha1", "oaep-sha256"])
def test_the_token_decrypts_what_the_public_key_encrypted(
    key: Pkcs11PrivateKey, token: Pkcs11Token, softhsm: SoftHsmToken, pad: padding.OAEP
) -> None:
    secret = os.urandom(32)
    sealed = public(softhsm).encrypt(secret, pad)
    if pad is OAEP_SHA256 and not oaep_sha256_on_token(token):
        with pytest.raises(DeviceError, match=r"decrypt .* failed: ArgumentsBad"):
            key.decrypt(sealed, pad)
        return
    assert key.decrypt(sealed, pad) == secret
    # The other OAEP hash does not decrypt it: the token really uses the padding asked for.
    other = OAEP_SHA256 if pad is OAEP_SHA1 else OAEP_SHA1
    with pytest.raises(DeviceError, match="decrypt"):
        key.decrypt(sealed, other)


def test_what_asyncua_calls_on_the_key(key: Pkcs11PrivateKey, softhsm: SoftHsmToken) -> None:
    cert = softhsm.certificate
    # Signatures: RSA-PKCS15-SHA256 (Basic256Sha256, Aes128_Sha256_RsaOaep), RSA-PSS-SHA256.
    uacrypto.verify_sha256(cert, MESSAGE, uacrypto.sign_sha256(key, MESSAGE))
    uacrypto.verify_pss_sha256(cert, MESSAGE, uacrypto.sign_pss_sha256(key, MESSAGE))
    # Key exchange: RSA-OAEP (SHA-1).
    nonce = os.urandom(32)
    sealed = uacrypto.encrypt_rsa_oaep(public(softhsm), nonce)
    assert uacrypto.decrypt_rsa_oaep(key, sealed) == nonce


POLICIES = {
    "Basic256Sha256": security_policies.SecurityPolicyBasic256Sha256,
    "Aes128_Sha256_RsaOaep": security_policies.SecurityPolicyAes128Sha256RsaOaep,
    "Aes256_Sha256_RsaPss": security_policies.SecurityPolicyAes256Sha256RsaPss,
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_secure_policy_with_the_token_key(
    softhsm: SoftHsmToken, token: Pkcs11Token, name: str
) -> None:
    connection = secure_connection(softhsm.settings(), security_policy=name)
    if name == "Aes256_Sha256_RsaPss" and not oaep_sha256_on_token(token):
        # Refused when the identity is loaded, naming what the token lacks.
        with pytest.raises(ConfigError, match="cannot decrypt RSA-OAEP with SHA256") as caught:
            load_client_identity(connection, None)
        assert caught.value.issues[0].path == "connection.securityPolicy"
        return
    identity = load_client_identity(connection, None)
    assert identity is not None
    with identity:
        cert = identity.certificate
        # The policy with this key as the host key and the token certificate as the peer (a
        # loop-back): asymmetric sign/verify and encrypt/decrypt round trips through asyncua.
        chosen = POLICIES[name](
            cert, cert, identity.private_key, ua.MessageSecurityMode.SignAndEncrypt
        )
        crypto = chosen.asymmetric_cryptography
        signature = crypto.signature(MESSAGE)
        assert len(signature) == crypto.signature_size()
        crypto.verify(MESSAGE, signature)
        block = os.urandom(crypto.plain_block_size())
        assert crypto.decrypt(crypto.encrypt(block)) == block


def test_unsupported_paddings_are_refused(key: Pkcs11PrivateKey, softhsm: SoftHsmToken) -> None:
    with pytest.raises(UnsupportedAlgorithm):
        key.decrypt(public(softhsm).encrypt(b"x", padding.PKCS1v15()), padding.PKCS1v15())
    with pytest.raises(UnsupportedAlgorithm):
        key.sign(MESSAGE, padding.PSS(padding.MGF1(hashes.SHA1()), 20), hashes.SHA256())
    with pytest.raises(UnsupportedAlgorithm):
        key.sign(
            MESSAGE, padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.AUTO), hashes.SHA256()
        )


def test_the_key_cannot_be_extracted(
    key: Pkcs11PrivateKey, token: Pkcs11Token, softhsm: SoftHsmToken
) -> None:
    with pytest.raises(TypeError, match="cannot be exported"):
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    with pytest.raises(TypeError, match="cannot be exported"):
        key.private_numbers()
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(key)
    # On the token: sensitive and not extractable, so the private exponent is refused.
    with token.session() as session:
        (stored,) = session.get_objects(
            {Attribute.CLASS: ObjectClass.PRIVATE_KEY, Attribute.LABEL: softhsm.key_label}
        )
        assert stored[Attribute.SENSITIVE] is True
        assert stored[Attribute.EXTRACTABLE] is False
        with pytest.raises(AttributeSensitive):
            stored[Attribute.PRIVATE_EXPONENT]


def test_a_wrong_pin_is_a_clear_error(softhsm: SoftHsmToken) -> None:
    with pytest.raises(ConfigError, match="refused the login") as caught:
        Pkcs11Token.open(softhsm.settings(pin="0000-wrong"))
    (issue,) = caught.value.issues
    assert issue.path == "connection.clientCertificate.pin"
    assert "PinIncorrect" in issue.message
    assert "0000-wrong" not in str(caught.value)


def test_the_pin_from_pin_env(softhsm: SoftHsmToken, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPCUA_TOKEN_PIN", softhsm.pin)
    with Pkcs11Token.open(softhsm.settings(pin_env="OPCUA_TOKEN_PIN")) as opened:
        assert opened.token_label == softhsm.label
    monkeypatch.setenv("OPCUA_TOKEN_PIN", "9999-wrong")
    with pytest.raises(ConfigError) as caught:
        Pkcs11Token.open(softhsm.settings(pin_env="OPCUA_TOKEN_PIN"))
    assert caught.value.issues[0].path == "connection.clientCertificate.pinEnv"


def test_a_missing_pin_env_variable_names_it(
    softhsm: SoftHsmToken, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPCUA_NO_SUCH_PIN", raising=False)
    with pytest.raises(ConfigError, match="OPCUA_NO_SUCH_PIN") as caught:
        Pkcs11Token.open(softhsm.settings(pin_env="OPCUA_NO_SUCH_PIN"))
    assert caught.value.issues[0].path == "connection.clientCertificate.pinEnv"
    with pytest.raises(ConfigError, match="pin or pinEnv"):
        Pkcs11Token.open(
            Pkcs11Key(softhsm.module_path, 0, key_label="k", cert_label="c"), environ={}
        )


@pytest.mark.parametrize(
    ("change", "path", "text"),
    [
        ({"slot_index": 7}, "slotIndex", "out of range"),
        ({"module_path": "/nonexistent/libpkcs11.so"}, "modulePath", "cannot load"),
        ({"key_label": "no-such-key"}, "keyLabel", "no private key labelled 'no-such-key'"),
        ({"cert_label": "no-such-cert"}, "certLabel", "no certificate labelled"),
    ],
)
def test_token_settings_that_find_nothing_name_their_key(
    softhsm: SoftHsmToken, change: dict[str, object], path: str, text: str
) -> None:
    values = {**softhsm.settings().__dict__, **change}
    connection = secure_connection(Pkcs11Key(**values))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=text) as caught:
        load_client_identity(connection, None)
    assert caught.value.issues[0].path == f"connection.clientCertificate.{path}"


def test_identity_from_the_token(softhsm: SoftHsmToken, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        identity = load_client_identity(secure_connection(softhsm.settings()), None)
    assert identity is not None
    with identity:
        assert isinstance(identity.private_key, Pkcs11PrivateKey)
        assert identity.certificate == softhsm.certificate
        assert identity.application_uri == softhsm.application_uri
        signature = identity.private_key.sign(MESSAGE, padding.PKCS1v15(), hashes.SHA256())
        public(softhsm).verify(signature, MESSAGE, padding.PKCS1v15(), hashes.SHA256())
        shown = [repr(identity), repr(identity.private_key), repr(identity.token), caplog.text]
        shown.append(repr(softhsm.settings()))
        assert all(softhsm.pin not in text for text in shown)
    # Closed with the identity: the token is no longer used.
    with pytest.raises(DeviceError, match="closed"):
        identity.private_key.sign(MESSAGE, padding.PKCS1v15(), hashes.SHA256())


def test_an_application_uri_differing_from_the_token_certificate(
    softhsm: SoftHsmToken,
) -> None:
    connection = secure_connection(softhsm.settings(), application_uri="urn:other")
    with pytest.raises(ConfigError) as caught:
        load_client_identity(connection, None)
    (issue,) = caught.value.issues
    assert issue.path == "connection.applicationUri"
    assert softhsm.application_uri in issue.message
    # The failed load closed its session: a new one opens and the module is not left busy.
    with Pkcs11Token.open(softhsm.settings()) as opened:
        assert opened.private_key(softhsm.key_label).key_size == 2048


def test_signing_from_many_threads_is_serialised(
    key: Pkcs11PrivateKey, softhsm: SoftHsmToken
) -> None:
    results: list[tuple[bytes, bytes]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def sign_many(index: int) -> None:
        try:
            start.wait(timeout=10)
            for round_ in range(10):
                data = f"thread {index} round {round_}".encode()
                results.append((data, key.sign(data, PSS_32, hashes.SHA256())))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sign_many, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(results) == 40
    for data, signature in results:
        public(softhsm).verify(signature, data, PSS_32, hashes.SHA256())


def test_two_users_of_one_token_share_its_login(softhsm: SoftHsmToken) -> None:
    # Two instances with the same token: PKCS#11 login state is the process's, so the
    # second must neither log in again nor log the first out when it closes.
    first = Pkcs11Token.open(softhsm.settings())
    second = Pkcs11Token.open(softhsm.settings())
    try:
        key = first.private_key(softhsm.key_label)
        second.close()
        signature = key.sign(MESSAGE, padding.PKCS1v15(), hashes.SHA256())
        public(softhsm).verify(signature, MESSAGE, padding.PKCS1v15(), hashes.SHA256())
    finally:
        first.close()
    # After the last close the next open logs in afresh.
    with Pkcs11Token.open(softhsm.settings()) as again:
        assert again.private_key(softhsm.key_label).key_size == 2048


def test_a_second_user_with_a_wrong_pin_is_refused_while_the_token_is_open(
    softhsm: SoftHsmToken,
) -> None:
    with Pkcs11Token.open(softhsm.settings()):
        with pytest.raises(ConfigError, match="another PIN") as caught:
            Pkcs11Token.open(softhsm.settings(pin="1111-wrong"))
        assert caught.value.issues[0].path == "connection.clientCertificate.pin"
        assert "1111-wrong" not in str(caught.value)


def test_a_wrong_pin_first_does_not_spoil_the_next_login(softhsm: SoftHsmToken) -> None:
    with pytest.raises(ConfigError, match="PinIncorrect"):
        Pkcs11Token.open(softhsm.settings(pin="2222-wrong"))
    with Pkcs11Token.open(softhsm.settings()) as opened:
        assert opened.certificate(softhsm.cert_label) == softhsm.certificate
