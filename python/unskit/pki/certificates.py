"""X.509 certificates and private keys read from PEM (or DER) bytes, and what may be shown
of a certificate (`CertificateSummary`, the one summary format of status and events).

Every failure is a `CredentialError` that names what was being read, never its content."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from unskit.errors import CredentialError

__all__ = [
    "PEM_CERTIFICATE",
    "CertificateSummary",
    "key_matches",
    "load_certificates",
    "load_private_key",
    "read_file",
    "rfc3339",
    "san_uris",
    "split_der_chain",
]

PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PEM_MARK = b"-----BEGIN"


@dataclass(frozen=True)
class CertificateSummary:
    """What may be shown of a certificate: names, serial, validity, fingerprint, SAN URIs."""

    subject: str
    issuer: str
    serial: str
    not_before: datetime.datetime
    not_after: datetime.datetime
    sha256: str
    san_uris: tuple[str, ...] = ()

    @staticmethod
    def of(cert: x509.Certificate) -> CertificateSummary:
        """The summary of a parsed certificate."""
        return CertificateSummary(
            subject=cert.subject.rfc4514_string(),
            issuer=cert.issuer.rfc4514_string(),
            serial=format(cert.serial_number, "x"),
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
            sha256=cert.fingerprint(hashes.SHA256()).hex(),
            san_uris=tuple(san_uris(cert)),
        )

    @staticmethod
    def of_der(der: bytes) -> CertificateSummary:
        """The summary of one DER certificate."""
        return CertificateSummary.of(x509.load_der_x509_certificate(der))

    def to_json(self) -> dict[str, Any]:
        """The JSON object of sb/status and events (RFC 3339 times, hex serial and digest)."""
        return {
            "subject": self.subject,
            "issuer": self.issuer,
            "serial": self.serial,
            "notBefore": rfc3339(self.not_before),
            "notAfter": rfc3339(self.not_after),
            "sha256": self.sha256,
            "sanUris": list(self.san_uris),
        }


def load_certificates(data: bytes, what: str, *, der: bool = False) -> list[x509.Certificate]:
    """The certificates of PEM bytes (or, with `der`, concatenated DER: how OPC UA sends a
    chain), leaf first; `CredentialError` names `what` when there is none or it is corrupt."""
    if PEM_CERTIFICATE in data:
        try:
            return x509.load_pem_x509_certificates(data)
        except ValueError:
            raise CredentialError(f"the {what} is corrupt PEM (it does not parse)") from None
    if der and data[:1] == b"\x30":
        try:
            return [cert for cert, _ in split_der_chain(data)]
        except ValueError:
            raise CredentialError(f"the {what} is corrupt DER (it does not parse)") from None
    expected = "PEM or DER" if der else "PEM"
    raise CredentialError(f"the {what} is not {expected} (no CERTIFICATE block)")


def load_private_key(data: bytes, what: str, *, der: bool = False) -> PrivateKeyTypes:
    """An unencrypted private key from PEM (or, with `der`, DER) bytes; `CredentialError`."""
    try:
        if _PEM_MARK in data or not der:
            return serialization.load_pem_private_key(data, password=None)
        return serialization.load_der_private_key(data, password=None)
    except TypeError:
        # There is no passphrase setting anywhere: an encrypted key cannot be opened.
        raise CredentialError(
            f"the {what} is an encrypted private key; store it unencrypted"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        expected = "a PEM or DER" if der else "an unencrypted PEM"
        raise CredentialError(
            f"the {what} is not {expected} private key (or it is corrupt)"
        ) from None
    except Exception:
        # cryptography raises its own errors for some key types; none may quote the key.
        raise CredentialError(f"the {what} cannot be loaded") from None


def key_matches(key: PrivateKeyTypes, cert: x509.Certificate) -> bool:
    """Whether `key` is the private half of the certificate's public key."""
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    ours = key.public_key().public_bytes(serialization.Encoding.DER, spki)
    return ours == cert.public_key().public_bytes(serialization.Encoding.DER, spki)


def read_file(path: str, what: str) -> bytes:
    """A file of PEM or DER material; `CredentialError` naming `what` and the path."""
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise CredentialError(f"{what} {path} cannot be read: {error.strerror or error}") from None


def san_uris(cert: x509.Certificate) -> list[str]:
    """The URIs of the subject alternative name (an OPC UA application URI is one)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (x509.ExtensionNotFound, ValueError):
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def split_der_chain(data: bytes) -> list[tuple[x509.Certificate, bytes]]:
    """Concatenated DER certificates, each with its bytes; ValueError when one is not."""
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


def rfc3339(moment: datetime.datetime) -> str:
    """A UTC time as RFC 3339 to the second, with `Z`."""
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
