"""CIP Security for poll instances: the `connection.security` block, its credentials and
their expiry. Nothing here opens a connection; `unskit.cip.logix` hands the built rustls
configuration to pycomm3's socket layer.

PEM material lives only in `Credentials` (whose repr hides it) and in the Rust config: it
never reaches logs, events, sb/status, describe or exception messages (errors name the key
and the problem, never the content)."""

from __future__ import annotations

import datetime
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from unskit._core import tls as _tls
from unskit.config.secrets import SecretRef
from unskit.config.vault import VaultSecrets
from unskit.errors import CredentialError, SecretError

__all__ = [
    "CERT_EXPIRED",
    "CERT_EXPIRING",
    "CREDENTIAL_REJECTED",
    "PEER_UNVERIFIED",
    "CertSummary",
    "Credentials",
    "ExpiryWatch",
    "SecurityPolicy",
    "cipher_suite_names",
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
_PEM_CERT = b"-----BEGIN CERTIFICATE-----"


def cipher_suite_names() -> dict[str, str]:
    """Every accepted `cipherSuites` name (IANA and rustls, upper case) -> its IANA name."""
    names: dict[str, str] = {}
    for iana, rustls, _ in _tls.cipher_suites():
        names[iana] = iana
        names[rustls] = iana
    return names


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


@dataclass(frozen=True)
class CertSummary:
    """What may be shown of a certificate: names, serial, validity and fingerprint."""

    subject: str
    issuer: str
    serial: str
    not_before: datetime.datetime
    not_after: datetime.datetime
    sha256: str

    @staticmethod
    def of(cert: x509.Certificate) -> CertSummary:
        return CertSummary(
            subject=cert.subject.rfc4514_string(),
            issuer=cert.issuer.rfc4514_string(),
            serial=format(cert.serial_number, "x"),
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
            sha256=cert.fingerprint(_sha256()).hex(),
        )

    @staticmethod
    def of_der(der: bytes) -> CertSummary:
        return CertSummary.of(x509.load_der_x509_certificate(der))

    def to_json(self) -> dict[str, str]:
        return {
            "subject": self.subject,
            "issuer": self.issuer,
            "serial": self.serial,
            "notBefore": _rfc3339(self.not_before),
            "notAfter": _rfc3339(self.not_after),
            "sha256": self.sha256,
        }


@dataclass(frozen=True, repr=False)
class Credentials:
    """A checked client identity and trust anchors. The repr shows summaries only."""

    cert_chain_pem: bytes
    key_pem: bytes
    roots_pem: tuple[bytes, ...]
    client: CertSummary
    roots: tuple[CertSummary, ...]
    #: A digest of all the material: a reload reconnects only when it changes.
    digest: str
    source: str

    def __repr__(self) -> str:
        return (
            f"Credentials(client={self.client.subject!r}, notAfter={self.client.not_after}, "
            f"roots={len(self.roots)}, source={self.source!r})"
        )

    def config(self, policy: SecurityPolicy) -> _tls.ClientConfig:
        """The rustls client configuration for these credentials under `policy`."""
        return _tls.ClientConfig(
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
    chain = _certificates(cert_chain_pem, f"{what} certificate")
    key = _private_key(key_pem, f"{what} key")
    leaf = chain[0]
    if _public_der(key.public_key()) != _public_der(leaf.public_key()):
        raise CredentialError(f"the {what} key does not match the {what} certificate")
    roots: list[CertSummary] = []
    for index, pem in enumerate(roots_pem):
        roots += [CertSummary.of(c) for c in _certificates(pem, f"CA certificate #{index + 1}")]
    digest = hashlib.sha256()
    for part in (cert_chain_pem, key_pem, *roots_pem):
        digest.update(hashlib.sha256(part).digest())
    return Credentials(
        cert_chain_pem=cert_chain_pem,
        key_pem=key_pem,
        roots_pem=tuple(roots_pem),
        client=CertSummary.of(leaf),
        roots=tuple(roots),
        digest=digest.hexdigest(),
        source=source,
    )


def load_credentials(policy: SecurityPolicy, secrets: VaultSecrets | None) -> Credentials:
    """Reads the client identity and trust anchors from the vault, files or inline
    references the policy names; raises `CredentialError` (never quoting PEM)."""
    client, ca = policy.client, policy.ca
    bundle_ca: bytes | None = None
    try:
        if "certSecret" in client:
            bundle = _bundle(secrets, client["certSecret"], "client.certSecret")
            for needed in ("certPem", "keyPem"):
                if needed not in bundle:
                    raise CredentialError(
                        f"client.certSecret {client['certSecret']!r} has no {needed} field"
                    )
            cert_pem, key_pem = bundle["certPem"].encode(), bundle["keyPem"].encode()
            if "caPem" in bundle:
                bundle_ca = bundle["caPem"].encode()
        elif "certFile" in client:
            cert_pem = _read_file(client["certFile"], "client.certFile")
            key_pem = _read_file(client["keyFile"], "client.keyFile")
        elif "cert" in client:
            cert_pem = _resolve(secrets, client["cert"], "client.cert")
            key_pem = _resolve(secrets, client["key"], "client.key")
        else:
            raise CredentialError("tls requires a client identity (client)")
        roots = _trust_anchors(ca, secrets)
    except SecretError as error:
        raise CredentialError(str(error)) from None
    if not roots and bundle_ca is not None:
        roots = [bundle_ca]
    if policy.verify_peer and not roots:
        raise CredentialError("verifyPeer needs trust anchors (ca, or caPem in the bundle)")
    return parse_credentials(cert_pem, key_pem, roots, source=policy.client_source)


def load_trust_anchors(policy: SecurityPolicy, secrets: VaultSecrets | None) -> list[bytes]:
    """The configured CA roots alone (no client identity needed): what a first enrolled
    identity is checked against; raises `CredentialError` (never quoting PEM)."""
    try:
        return _trust_anchors(policy.ca, secrets)
    except SecretError as error:
        raise CredentialError(str(error)) from None


def _trust_anchors(ca: Mapping[str, Any], secrets: VaultSecrets | None) -> list[bytes]:
    if "secret" in ca:
        value = _vault(secrets, "ca.secret").get(ca["secret"])
        return [_pem_of(value, f"ca.secret {ca['secret']!r}")]
    if "file" in ca:
        return [_read_file(ca["file"], "ca.file")]
    if "cert" in ca:
        return [_resolve(secrets, ca["cert"], "ca.cert")]
    if "trustStore" in ca:
        # Every retained version is trusted: old and new roots together during a rollover.
        name = ca["trustStore"]
        versions = _vault(secrets, "ca.trustStore").versions(name)
        return [_pem_of(value, f"ca.trustStore {name!r}") for value in versions]
    if "list" in ca:
        return [_resolve(secrets, ref, f"ca.list[{index}]") for index, ref in enumerate(ca["list"])]
    return []


def _pem_of(value: str | Mapping[str, str], what: str) -> bytes:
    """A CA secret's PEM: a plain value, or every certificate field of a bundle."""
    if isinstance(value, str):
        return value.encode()
    parts = [text for _, text in sorted(value.items()) if _PEM_CERT.decode() in text]
    if not parts:
        raise CredentialError(f"{what} holds no PEM certificate in any field")
    return "\n".join(parts).encode()


def _vault(secrets: VaultSecrets | None, key: str) -> Any:
    if secrets is None:
        raise CredentialError(f"{key} needs the vault: the configuration has no credentials")
    return secrets.vault()


def _bundle(secrets: VaultSecrets | None, name: str, key: str) -> Mapping[str, str]:
    value = _vault(secrets, key).get(name)
    if isinstance(value, str):
        raise CredentialError(f"{key} {name!r} is a plain value, not a certPem/keyPem bundle")
    return value  # type: ignore[no-any-return]


def _resolve(secrets: VaultSecrets | None, ref: Mapping[str, Any], key: str) -> bytes:
    parsed = SecretRef.parse(ref)
    if parsed is None:
        raise CredentialError(f"{key} is not a $secret reference")
    if secrets is None:
        raise CredentialError(f"{key} needs the vault: the configuration has no credentials")
    return secrets.resolve(parsed).reveal().encode()


def _read_file(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise CredentialError(f"{key} {path}: {error.strerror or error}") from None


def _certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    if _PEM_CERT not in pem:
        raise CredentialError(f"the {what} is not PEM (no CERTIFICATE block)")
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise CredentialError(f"the {what} is corrupt PEM (it does not parse)") from None
    return certs


def _private_key(pem: bytes, what: str) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise CredentialError(
            f"the {what} is not an unencrypted PEM private key (or it is corrupt)"
        ) from None
    except Exception:
        # cryptography raises its own unsupported-algorithm errors; none may quote the key.
        raise CredentialError(f"the {what} cannot be loaded") from None


def _public_der(key: Any) -> bytes:
    return bytes(
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _sha256() -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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

    def check(self, cert: CertSummary) -> str | None:
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
