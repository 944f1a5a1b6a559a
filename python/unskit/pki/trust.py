"""Trust in a certificate: the path from a leaf through its issuers to a trust anchor,
every signature checked (the trust lists that hold the anchors are the protocols')."""

from __future__ import annotations

from collections.abc import Iterable

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

__all__ = ["MAX_CHAIN_DEPTH", "can_issue", "chain_to_anchor"]

#: Longest issuer chain followed from a certificate to a trusted anchor.
MAX_CHAIN_DEPTH = 8


def chain_to_anchor(
    leaf: x509.Certificate,
    pool: Iterable[tuple[x509.Certificate, bytes]],
    anchors: set[bytes],
) -> list[x509.Certificate] | None:
    """The path leaf .. trusted CA (signatures checked), or None when there is none."""
    candidates = list(pool)

    def walk(cert: x509.Certificate, seen: set[bytes]) -> list[x509.Certificate] | None:
        if len(seen) > MAX_CHAIN_DEPTH:
            return None
        for issuer, issuer_der in candidates:
            if issuer_der in seen or not can_issue(issuer):
                continue
            try:
                cert.verify_directly_issued_by(issuer)
            except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
                continue
            if issuer_der in anchors:
                return [cert, issuer]
            rest = walk(issuer, seen | {issuer_der})
            if rest is not None:
                return [cert, *rest]
        return None

    return walk(leaf, {leaf.public_bytes(serialization.Encoding.DER)})


def can_issue(cert: x509.Certificate) -> bool:
    """Whether a certificate may sign others: a CA (basic constraints) allowed keyCertSign."""
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    except ValueError:
        return False
    if not basic.ca:
        return False
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return bool(usage.key_cert_sign)
