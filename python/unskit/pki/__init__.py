"""Certificates and trust for every component: certificates and keys from PEM or DER, the
one summary format, a client's identity, where identities and trust anchors come from, the
path to a trust anchor, the EST client (RFC 7030) and the Rust TLS client.

The components keep their protocol's policy: `unskit.cip` CIP Security's policy, posture and
enrollment scheduling; `unskit.opcua` thumbprints, application URIs, its trust list and
PKCS#11. `unskit.pki.est` (the EST client, with http.client and ssl) is imported where
enrollment runs, not here, so loading a certificate costs no HTTP stack."""

from __future__ import annotations

from unskit.pki.certificates import (
    CertificateSummary,
    key_matches,
    load_certificates,
    load_private_key,
)
from unskit.pki.identity import ClientIdentity, parse_identity
from unskit.pki.sources import IdentityMaterial, identity_material, trust_anchors
from unskit.pki.trust import chain_to_anchor

__all__ = [
    "CertificateSummary",
    "ClientIdentity",
    "IdentityMaterial",
    "chain_to_anchor",
    "identity_material",
    "key_matches",
    "load_certificates",
    "load_private_key",
    "parse_identity",
    "trust_anchors",
]
