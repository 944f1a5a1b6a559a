"""A client's identity: its certificate with the issuer chain it sends and its private key,
in memory or in a token that only signs and decrypts (`parse_identity` checks PEM material)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from unskit.config.secrets import Secret
from unskit.errors import CredentialError
from unskit.pki.certificates import (
    CertificateSummary,
    key_matches,
    load_certificates,
    load_private_key,
)

__all__ = ["ClientIdentity", "KeyToken", "parse_identity"]


class KeyToken(Protocol):
    """The open session of a token that holds a private key (a PKCS#11 one fits)."""

    def close(self) -> None:
        """Ends the session; the key cannot be used after."""
        ...


@dataclass(frozen=True, eq=False)
class ClientIdentity:
    """A client certificate, the issuer chain sent with it and its private key."""

    certificate: x509.Certificate
    private_key: PrivateKeyTypes = field(repr=False)
    #: Issuer certificates sent along (a vault bundle's caPem, the rest of a PEM file).
    chain: tuple[x509.Certificate, ...] = field(default=(), repr=False)
    #: The SAN URI the client presents as its application URI (OPC UA); None elsewhere.
    application_uri: str | None = None
    #: The open token session of a key that never leaves its token; `close` ends it.
    token: KeyToken | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        where = "token" if self.token is not None else "memory"
        uri = f"application_uri={self.application_uri!r}, " if self.application_uri else ""
        return (
            f"ClientIdentity({uri}subject={self.certificate.subject.rfc4514_string()!r}, "
            f"key={where})"
        )

    @property
    def certificate_der(self) -> bytes:
        """The leaf certificate as DER."""
        return self.certificate.public_bytes(serialization.Encoding.DER)

    def summary(self) -> CertificateSummary:
        """What may be shown of the leaf certificate."""
        return CertificateSummary.of(self.certificate)

    def cert_chain_pem(self) -> bytes:
        """The leaf and its chain as PEM, leaf first."""
        certs = (self.certificate, *self.chain)
        return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certs)

    def key_pem(self) -> Secret:
        """The private key as unencrypted PKCS#8 PEM; a token's key cannot leave it."""
        if self.token is not None:
            raise CredentialError("the client key is in a token and cannot be exported")
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return Secret(pem.decode("ascii"))

    def close(self) -> None:
        """Closes the token session of a token's key (nothing to do for the others)."""
        if self.token is not None:
            self.token.close()

    def __enter__(self) -> ClientIdentity:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_identity(cert_pem: bytes, key_pem: bytes, *, what: str = "client") -> ClientIdentity:
    """The identity of PEM material (certificates parse, the key matches the leaf); raises
    `CredentialError` naming `what`, never quoting the material."""
    certs = load_certificates(cert_pem, f"{what} certificate")
    key = load_private_key(key_pem, f"{what} key")
    if not key_matches(key, certs[0]):
        raise CredentialError(f"the {what} key does not match the {what} certificate")
    return ClientIdentity(certificate=certs[0], private_key=key, chain=tuple(certs[1:]))
