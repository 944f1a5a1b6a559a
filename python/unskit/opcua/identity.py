"""The client's identity (certificate, key and application URI from a vault bundle, files
or a PKCS#11 token), the user's credentials and the server pin, as configured."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding as asym_padding
from cryptography.hazmat.primitives.asymmetric import rsa

from unskit.config.secrets import Secret, SecretRef, SecretResolver, resolve_value
from unskit.errors import DeviceError, SecretError
from unskit.opcua.certificates import _certificates, _error, _private_key, _read
from unskit.opcua.config import OpcUaConnection, ServerCertificatePin, UserToken
from unskit.opcua.pkcs11 import Pkcs11Token
from unskit.pki.certificates import san_uris
from unskit.pki.identity import ClientIdentity

__all__ = [
    "UserCredentials",
    "load_client_identity",
    "load_server_pin",
    "resolve_user",
]

#: Asymmetric key lengths every supported secure policy allows (OPC UA Part 7 limits).
MIN_KEY_BITS = 2048
MAX_KEY_BITS = 4096
#: What each secure policy does with the client key: its signature padding (SHA-256) and
#: the OAEP hash of the key exchange the server encrypts to us.
_POLICY_RSA: dict[str, tuple[asym_padding.AsymmetricPadding, hashes.HashAlgorithm]] = {
    "Basic256Sha256": (asym_padding.PKCS1v15(), hashes.SHA1()),
    "Aes128_Sha256_RsaOaep": (asym_padding.PKCS1v15(), hashes.SHA1()),
    "Aes256_Sha256_RsaPss": (
        asym_padding.PSS(asym_padding.MGF1(hashes.SHA256()), 32),
        hashes.SHA256(),
    ),
}


class UserCredentials(NamedTuple):
    """A UserName token's username and password; the password never shows in a repr."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"UserCredentials(username={self.username!r}, password='***')"

    def __str__(self) -> str:
        return repr(self)


def load_client_identity(
    connection: OpcUaConnection,
    secrets: SecretResolver | None,
    *,
    environ: Mapping[str, str] | None = None,
    path: str = "connection",
) -> ClientIdentity | None:
    """The client identity of a secure connection (None under policy None); ConfigError."""
    if not connection.secure:
        return None
    spec = connection.client_certificate
    where = f"{path}.clientCertificate"
    if spec is None:
        policy = connection.security_policy
        raise _error(where, f"securityPolicy {policy} needs a client certificate")
    token: Pkcs11Token | None = None
    chain: list[x509.Certificate] = []
    private_key: rsa.RSAPrivateKey
    if spec.source == "vault":
        if spec.secret is None:
            raise _error(f"{where}.secret", "source vault needs a secret")
        certs = _certificates(
            _resolve(SecretRef(spec.secret.name, "certPem"), secrets, f"{where}.secret")
            .reveal()
            .encode(),
            f"{where}.secret",
            f"the certPem of {spec.secret.name!r}",
        )
        private_key = _private_key(
            _resolve(SecretRef(spec.secret.name, "keyPem"), secrets, f"{where}.secret")
            .reveal()
            .encode(),
            f"{where}.secret",
            f"the keyPem of {spec.secret.name!r}",
        )
        chain = certs[1:]
        ca_pem = _resolve_optional(SecretRef(spec.secret.name, "caPem"), secrets)
        if ca_pem is not None:
            chain += _certificates(
                ca_pem.reveal().encode(), f"{where}.secret", f"the caPem of {spec.secret.name!r}"
            )
        certificate = certs[0]
    elif spec.source == "file":
        if not spec.cert_path or not spec.key_path:
            raise _error(where, "source file needs certPath and keyPath")
        certs = _certificates(
            _read(spec.cert_path, f"{where}.certPath"),
            f"{where}.certPath",
            f"certificate file {spec.cert_path}",
        )
        private_key = _private_key(
            _read(spec.key_path, f"{where}.keyPath"),
            f"{where}.keyPath",
            f"key file {spec.key_path}",
        )
        certificate, chain = certs[0], certs[1:]
    elif spec.source == "pkcs11":
        if spec.pkcs11 is None:
            raise _error(where, "source pkcs11 needs modulePath and keyLabel")
        token = Pkcs11Token.open(spec.pkcs11, environ, path=where)
        try:
            private_key = token.private_key(spec.pkcs11.key_label)
            certificate = token.certificate(spec.pkcs11.cert_label)
        except BaseException:
            token.close()
            raise
    else:
        raise _error(f"{where}.source", f"unknown source {spec.source!r} (vault, file, pkcs11)")
    try:
        uri = _check_identity(connection, certificate, private_key, path)
        if token is not None:
            _probe_token(connection.security_policy, private_key, f"{path}.securityPolicy")
    except BaseException:
        if token is not None:
            token.close()
        raise
    return ClientIdentity(
        certificate=certificate,
        private_key=private_key,
        application_uri=uri,
        chain=tuple(chain),
        token=token,
    )


def resolve_user(
    user: UserToken, secrets: SecretResolver | None, *, path: str = "connection.user"
) -> UserCredentials:
    """The UserName token's (username, password), vault references resolved; ConfigError."""
    username = _resolve(user.username, secrets, f"{path}.username")
    password = _resolve(user.password, secrets, f"{path}.password")
    return UserCredentials(username.reveal(), password.reveal())


def load_server_pin(
    pin: ServerCertificatePin,
    secrets: SecretResolver | None,
    *,
    path: str = "connection.trust.serverCertificate",
) -> bytes:
    """The DER of the pinned server certificate (a PEM/DER file or a vault field); ConfigError."""
    if pin.source == "file":
        if not pin.path:
            raise _error(f"{path}.path", "source file needs a path")
        data = _read(pin.path, f"{path}.path")
        what, where = f"pinned certificate file {pin.path}", f"{path}.path"
    elif pin.source == "vault":
        if pin.secret is None:
            raise _error(f"{path}.secret", "source vault needs a secret")
        ref = SecretRef(pin.secret.name, pin.secret.field or "caPem")
        data = _resolve(ref, secrets, f"{path}.secret").reveal().encode()
        what, where = str(ref), f"{path}.secret"
    else:
        raise _error(f"{path}.source", f"unknown source {pin.source!r} (file, vault)")
    certs = _certificates(data, where, what)
    if len(certs) != 1:
        raise _error(where, f"{what} holds {len(certs)} certificates; a pin is exactly one")
    return certs[0].public_bytes(serialization.Encoding.DER)


# -- identity helpers ---------------------------------------------------------------------


def _check_identity(
    connection: OpcUaConnection,
    certificate: x509.Certificate,
    private_key: rsa.RSAPrivateKey,
    path: str,
) -> str:
    where = f"{path}.clientCertificate"
    public = certificate.public_key()
    if not isinstance(public, rsa.RSAPublicKey):
        raise _error(where, "the client certificate's key is not RSA, which OPC UA policies need")
    if public.public_numbers() != private_key.public_key().public_numbers():
        raise _error(where, "the private key does not belong to the client certificate")
    if not MIN_KEY_BITS <= public.key_size <= MAX_KEY_BITS:
        raise _error(
            where,
            f"the client key has {public.key_size} bits; securityPolicy "
            f"{connection.security_policy} needs {MIN_KEY_BITS} to {MAX_KEY_BITS}",
        )
    uris = san_uris(certificate)
    if not uris:
        raise _error(
            where,
            "the client certificate has no SAN URI, which is the application URI a secure "
            "connection needs",
        )
    configured = connection.application_uri
    if configured is None:
        return uris[0]
    if configured not in uris:
        raise _error(
            f"{path}.applicationUri",
            f"{configured!r} differs from the client certificate's SAN URI "
            f"{', '.join(repr(u) for u in uris)}",
        )
    return configured


def _probe_token(policy: str, key: rsa.RSAPrivateKey, where: str) -> None:
    # Tokens differ in the mechanism parameters they take (SoftHSM 2.6 decrypts OAEP with
    # SHA-1 only): one signature and one decryption now, so a token that cannot serve the
    # policy is a clear error at load, not a failed handshake.
    if policy not in _POLICY_RSA:
        raise _error(where, f"unknown securityPolicy {policy!r}")
    sign_padding, oaep_hash = _POLICY_RSA[policy]
    oaep = asym_padding.OAEP(asym_padding.MGF1(oaep_hash), oaep_hash, None)
    probe = os.urandom(32)
    step = f"sign with {sign_padding.name}-SHA256"
    try:
        signature = key.sign(probe, sign_padding, hashes.SHA256())
        key.public_key().verify(signature, probe, sign_padding, hashes.SHA256())
        step = f"decrypt RSA-OAEP with {oaep_hash.name.upper()}"
        if key.decrypt(key.public_key().encrypt(probe, oaep), oaep) != probe:
            raise InvalidSignature
    except (DeviceError, UnsupportedAlgorithm, InvalidSignature) as exc:
        detail = f": {exc}" if str(exc) else ""
        raise _error(
            where, f"the PKCS#11 token cannot {step}, which {policy} needs{detail}"
        ) from None


def _resolve(
    value: str | Secret | SecretRef | None, secrets: SecretResolver | None, path: str
) -> Secret:
    try:
        resolved = resolve_value(value, secrets)
    except SecretError as exc:
        raise _error(path, str(exc)) from None
    if resolved is None:
        raise _error(path, "a value is required")
    return resolved


def _resolve_optional(ref: SecretRef, secrets: SecretResolver | None) -> Secret | None:
    # Only called after certPem and keyPem of the same bundle resolved, so the vault and its
    # key are fine; what is left to fail is the field's absence.
    try:
        return resolve_value(ref, secrets)
    except SecretError:
        return None
