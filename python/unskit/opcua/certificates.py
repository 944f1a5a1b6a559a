"""X.509 certificates and RSA keys read from PEM or DER bytes, and their facts
(thumbprint, SAN URIs, the sb/status summary); plain `cryptography`."""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from unskit.errors import ConfigError, ConfigIssue

__all__ = ["certificate_summary", "sha1_thumbprint"]

_PEM_MARK = b"-----BEGIN"


def certificate_summary(cert: x509.Certificate) -> dict[str, Any]:
    """JSON-ready facts of a certificate for sb/status (no key material)."""
    return {
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serialNumber": format(cert.serial_number, "x"),
        "notBefore": _iso(cert.not_valid_before_utc),
        "notAfter": _iso(cert.not_valid_after_utc),
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
        "sanUris": _san_uris(cert),
    }


def sha1_thumbprint(der: bytes) -> str:
    """The OPC UA certificate thumbprint: SHA-1 of the DER, lower-case hex."""
    return hashlib.sha1(der, usedforsecurity=False).hexdigest()


def _read(path: str, where: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise _error(where, f"{path} cannot be read: {exc.strerror}") from None


def _certificates(data: bytes, where: str, what: str) -> list[x509.Certificate]:
    try:
        certs = _parse_certificates(data)
    except ValueError:
        raise _error(where, f"{what} is not a PEM or DER X.509 certificate") from None
    if not certs:
        raise _error(where, f"{what} holds no certificate")
    return certs


def _parse_certificates(data: bytes) -> list[x509.Certificate]:
    if _PEM_MARK in data:
        return x509.load_pem_x509_certificates(data)
    return [cert for cert, _ in _split_der_chain(data)]


def _private_key(data: bytes, where: str, what: str) -> rsa.RSAPrivateKey:
    try:
        if _PEM_MARK in data:
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_der_private_key(data, password=None)
    except TypeError:
        # There is no passphrase setting: an encrypted key file cannot be opened.
        raise _error(where, f"{what} is an encrypted private key; store it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm):
        raise _error(where, f"{what} is not a PEM or DER private key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise _error(where, f"{what} is not an RSA private key, which OPC UA policies need")
    return key


def _san_uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (x509.ExtensionNotFound, ValueError):
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def _split_der_chain(data: bytes) -> list[tuple[x509.Certificate, bytes]]:
    """Concatenated DER certificates (how OPC UA sends a chain), each with its bytes."""
    out: list[tuple[x509.Certificate, bytes]] = []
    offset = 0
    while offset < len(data):
        end = offset + _der_length(data, offset)
        item = bytes(data[offset:end])
        out.append((x509.load_der_x509_certificate(item), item))
        offset = end
    if not out:
        raise ValueError("no certificate")
    return out


def _der_length(data: bytes, offset: int) -> int:
    # One DER SEQUENCE: tag 0x30, then a short or long form length.
    if len(data) < offset + 2 or data[offset] != 0x30:
        raise ValueError("not a DER SEQUENCE")
    first = data[offset + 1]
    if first < 0x80:
        return 2 + first
    count = first & 0x7F
    if count == 0 or count > 4 or len(data) < offset + 2 + count:
        raise ValueError("bad DER length")
    length = int.from_bytes(data[offset + 2 : offset + 2 + count], "big")
    total = 2 + count + length
    if len(data) < offset + total:
        raise ValueError("truncated DER")
    return total


def _iso(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _error(path: str, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(path, message)])
