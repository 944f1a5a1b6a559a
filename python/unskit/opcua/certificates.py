"""OPC UA's side of certificates: the SHA-1 thumbprint, RSA keys (what every OPC UA policy
needs), and `unskit.pki`'s loaders with their failures as `ConfigError`s at a key's path."""

from __future__ import annotations

import hashlib

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from unskit.errors import ConfigError, ConfigIssue, CredentialError
from unskit.pki.certificates import load_certificates, load_private_key, read_file

__all__ = ["sha1_thumbprint"]


def sha1_thumbprint(der: bytes) -> str:
    """The OPC UA certificate thumbprint: SHA-1 of the DER, lower-case hex."""
    return hashlib.sha1(der, usedforsecurity=False).hexdigest()


def _read(path: str, where: str) -> bytes:
    try:
        return read_file(path, where)
    except CredentialError as exc:
        raise _error(where, str(exc)) from None


def _certificates(data: bytes, where: str, what: str) -> list[x509.Certificate]:
    try:
        return load_certificates(data, what, der=True)
    except CredentialError as exc:
        raise _error(where, str(exc)) from None


def _private_key(data: bytes, where: str, what: str) -> rsa.RSAPrivateKey:
    try:
        key = load_private_key(data, what, der=True)
    except CredentialError as exc:
        raise _error(where, str(exc)) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise _error(where, f"the {what} is not an RSA private key, which OPC UA policies need")
    return key


def _error(path: str, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(path, message)])
