"""CIP Security for poll instances: the `connection.security` block, its credentials and
their expiry. Nothing here opens a connection; `unskit.cip.logix` hands the built rustls
configuration to pycomm3's socket layer. Certificates, keys and where they come from are
`unskit.pki`'s.

PEM material lives only in `Credentials` (whose repr hides it) and in the Rust config: it
never reaches logs, events, sb/status, describe or exception messages (errors name the key
and the problem, never the content)."""

from __future__ import annotations

import datetime
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from unskit.errors import CredentialError
from unskit.pki.certificates import CertificateSummary, load_certificates
from unskit.pki.identity import parse_identity
from unskit.pki.sources import VaultProvider, identity_material, trust_anchors
from unskit.pki.tls import ClientConfig

__all__ = [
    "CERT_EXPIRED",
    "CERT_EXPIRING",
    "CREDENTIAL_REJECTED",
    "PEER_UNVERIFIED",
    "Credentials",
    "ExpiryWatch",
    "SecurityPolicy",
    "load_credentials",
    "load_trust_anchors",
    "parse_credentials",
]

#: Event types (severity and context in docs/configuration.md, "CIP Security events").
PEER_UNVERIFIED = "tls-peer-unverified"
CERT_EXPIRING = "cert-expiring"
CERT_EXPIRED = "cert-expired"
CREDENTIAL_REJECTED = "tls-credential-rejected"

DEFAULT_RENEW_BEFORE_DAYS = 30
DEFAULT_RELOAD_INTERVAL_SECS = 300


@dataclass(frozen=True)
class SecurityPolicy:
    """One instance's `connection.security` block with the defaults filled in."""

    mode: str = "plaintext"
    verify_peer: bool = True
    server_name: str | None = None
    check_expiration: bool = True
    cipher_suites: tuple[str, ...] | None = None
    renew_before_days: int = DEFAULT_RENEW_BEFORE_DAYS
    reload_interval_secs: int = DEFAULT_RELOAD_INTERVAL_SECS
    client: Mapping[str, Any] = field(default_factory=dict)
    ca: Mapping[str, Any] = field(default_factory=dict)
    est_enabled: bool = False

    @staticmethod
    def from_block(security: Mapping[str, Any]) -> SecurityPolicy:
        """The policy of a schema-valid security block."""
        client = security.get("client") or {}
        suites = security.get("cipherSuites")
        return SecurityPolicy(
            mode=str(security.get("mode", "plaintext")),
            verify_peer=bool(security.get("verifyPeer", True)),
            server_name=security.get("serverName"),
            check_expiration=bool(security.get("checkExpiration", True)),
            cipher_suites=None if suites is None else tuple(suites),
            renew_before_days=int(client.get("renewBeforeDays", DEFAULT_RENEW_BEFORE_DAYS)),
            reload_interval_secs=int(
                security.get("reloadIntervalSecs", DEFAULT_RELOAD_INTERVAL_SECS)
            ),
            client=client,
            ca=security.get("ca") or {},
            est_enabled=bool((security.get("est") or {}).get("enabled", False)),
        )

    @property
    def tls(self) -> bool:
        return self.mode == "tls"

    @property
    def client_source(self) -> str:
        """vault, file or inline: how the client identity is sourced."""
        if "certSecret" in self.client:
            return "vault"
        if "certFile" in self.client:
            return "file"
        return "inline"


@dataclass(frozen=True, repr=False)
class Credentials:
    """A checked client identity and trust anchors. The repr shows summaries only."""

    cert_chain_pem: bytes
    key_pem: bytes
    roots_pem: tuple[bytes, ...]
    client: CertificateSummary
    roots: tuple[CertificateSummary, ...]
    #: A digest of all the material: a reload reconnects only when it changes.
    digest: str
    source: str

    def __repr__(self) -> str:
        return (
            f"Credentials(client={self.client.subject!r}, notAfter={self.client.not_after}, "
            f"roots={len(self.roots)}, source={self.source!r})"
        )

    def config(self, policy: SecurityPolicy) -> ClientConfig:
        """The rustls client configuration for these credentials under `policy`."""
        return ClientConfig(
            self.cert_chain_pem,
            self.key_pem,
            list(self.roots_pem),
            cipher_suites=None if policy.cipher_suites is None else list(policy.cipher_suites),
            verify_peer=policy.verify_peer,
            check_expiration=policy.check_expiration,
        )


def parse_credentials(
    cert_chain_pem: bytes,
    key_pem: bytes,
    roots_pem: Sequence[bytes],
    *,
    source: str,
    what: str = "client",
) -> Credentials:
    """Checks PEM material (certificates parse, the key matches the leaf) and summarises it;
    raises `CredentialError` naming `what`, never quoting the material."""
    identity = parse_identity(cert_chain_pem, key_pem, what=what)
    roots: list[CertificateSummary] = []
    for index, pem in enumerate(roots_pem):
        certs = load_certificates(pem, f"CA certificate #{index + 1}")
        roots += [CertificateSummary.of(cert) for cert in certs]
    digest = hashlib.sha256()
    for part in (cert_chain_pem, key_pem, *roots_pem):
        digest.update(hashlib.sha256(part).digest())
    return Credentials(
        cert_chain_pem=cert_chain_pem,
        key_pem=key_pem,
        roots_pem=tuple(roots_pem),
        client=identity.summary(),
        roots=tuple(roots),
        digest=digest.hexdigest(),
        source=source,
    )


def load_credentials(policy: SecurityPolicy, secrets: VaultProvider | None) -> Credentials:
    """Reads the client identity and trust anchors from the vault, files or inline
    references the policy names; raises `CredentialError` (never quoting PEM)."""
    if not policy.client:
        raise CredentialError("tls requires a client identity (client)")
    material = identity_material(policy.client, secrets, "client")
    roots = trust_anchors(policy.ca, secrets, "ca")
    if not roots and material.ca_pem is not None:
        roots = [material.ca_pem]
    if policy.verify_peer and not roots:
        raise CredentialError("verifyPeer needs trust anchors (ca, or caPem in the bundle)")
    return parse_credentials(
        material.cert_pem, material.key_pem, roots, source=policy.client_source
    )


def load_trust_anchors(policy: SecurityPolicy, secrets: VaultProvider | None) -> list[bytes]:
    """The configured CA roots alone (no client identity needed): what a first enrolled
    identity is checked against; raises `CredentialError` (never quoting PEM)."""
    return trust_anchors(policy.ca, secrets, "ca")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class ExpiryWatch:
    """Decides the cert-expiring and cert-expired events: each at most once per certificate
    per UTC day, however often it is asked (every poll)."""

    def __init__(
        self,
        emit: Callable[[str, str, Mapping[str, Any]], None],
        renew_before_days: int,
        clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self._emit = emit
        self._renew = datetime.timedelta(days=renew_before_days)
        self._renew_days = renew_before_days
        self._clock = clock
        self._lock = threading.Lock()
        #: (certificate fingerprint, event type) -> the UTC date it was last emitted.
        self._sent: dict[tuple[str, str], datetime.date] = {}

    def check(self, cert: CertificateSummary) -> str | None:
        """Emits what is due for `cert` now; returns the event type emitted, if any."""
        now = self._clock()
        if now >= cert.not_after:
            kind, severity = CERT_EXPIRED, "error"
        elif now >= cert.not_after - self._renew:
            kind, severity = CERT_EXPIRING, "warning"
        else:
            return None
        today = now.date()
        with self._lock:
            if self._sent.get((cert.sha256, kind)) == today:
                return None
            self._sent[(cert.sha256, kind)] = today
        left = (cert.not_after - now).total_seconds() / 86400
        self._emit(
            severity,
            kind,
            {
                "certificate": cert.to_json(),
                "daysLeft": round(left, 2),
                "renewBeforeDays": self._renew_days,
            },
        )
        return kind
