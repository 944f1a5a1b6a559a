"""Where EST credentials come from and go to: the current certificate (the `into`
destination, else the client identity), the EST server's trust and Basic credentials, the
store of an issued identity, and the certificate helpers (see `unskit.cip.enrollment`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from unskit.cip.enrollment_settings import _DAY_S, EnrolledIdentity, EstSettings, _Current, _log
from unskit.config.secrets import Secret, SecretRef
from unskit.config.vault import Vault
from unskit.errors import CredentialError, EstError, SecretError
from unskit.files import write_atomically
from unskit.pki.certificates import CertificateSummary
from unskit.pki.identity import ClientIdentity, parse_identity
from unskit.pki.sources import IdentityMaterial, VaultProvider, identity_material, trust_anchors


class _Credentials:
    """Reads and stores one instance's credentials; `EnrollmentManager.__init__` sets these."""

    settings: EstSettings
    _secrets: VaultProvider | None
    _clock: Callable[[], float]

    # -- credentials -----------------------------------------------------------------------

    def _vault(self) -> Vault:
        if self._secrets is None:
            raise SecretError("EST needs the vault, but the configuration has no credentials")
        return self._secrets.vault()

    def _current(self) -> _Current | None:
        """The usable certificate now: the into destination's, else the client identity's."""
        material = self._read_into()
        if material is None and self.settings.client:
            with contextlib.suppress(CredentialError, OSError):
                material = identity_material(self.settings.client, self._secrets, "client")
        if material is None:
            return None
        identity = _usable(material, self._clock())
        if identity is None:
            return None
        ca_pem = None if material.ca_pem is None else material.ca_pem.decode()
        return _Current(identity.certificate, identity, ca_pem)

    def _read_into(self) -> IdentityMaterial | None:
        """What the into destination holds, None when it holds no complete identity."""
        into = self.settings.into
        if into[0] == "vault":
            try:
                value = self._vault().get(into[1])
            except SecretError as exc:
                if "has no secret named" in str(exc):
                    return None
                raise
            if isinstance(value, str) or "certPem" not in value or "keyPem" not in value:
                return None
            ca = value.get("caPem")
            return IdentityMaterial(
                value["certPem"].encode(),
                value["keyPem"].encode(),
                None if ca is None else ca.encode(),
            )
        cert_path, key_path = Path(into[1]), Path(into[2])
        if not cert_path.exists() or not key_path.exists():
            return None
        return IdentityMaterial(cert_path.read_bytes(), key_path.read_bytes())

    def _bootstrap_identity(self, block: Mapping[str, Any]) -> ClientIdentity:
        """The identity that authenticates a first enrollment (est.auth.bootstrap)."""
        material = identity_material(block, self._secrets, "est.auth.bootstrap")
        try:
            return parse_identity(material.cert_pem, material.key_pem)
        except CredentialError as error:
            raise EstError(f"the EST client identity is unusable: {error}") from None

    def _trust(self, block: Mapping[str, Any]) -> str | None:
        """PEM trust anchors of the EST server; None: the system's default roots."""
        anchors = trust_anchors(block, self._secrets, "est.trust")
        return "\n".join(anchor.decode() for anchor in anchors) if anchors else None

    def _basic(self, ref: SecretRef) -> tuple[str, Secret]:
        vault = self._vault()
        value = vault.get(ref.name)
        if isinstance(value, str) or ref.field is not None:
            raise EstError(
                f"est.auth.basic: secret {ref.name!r} must be a bundle with username and password"
            )
        if "username" not in value or "password" not in value:
            raise EstError(f"est.auth.basic: secret {ref.name!r} lacks username or password")
        return value["username"], Secret(value["password"])

    def _store(self, identity: EnrolledIdentity) -> None:
        into = self.settings.into
        if into[0] == "vault":
            bundle = {"certPem": identity.cert_pem, "keyPem": identity.key_pem.reveal()}
            if identity.ca_pem is not None:
                bundle["caPem"] = identity.ca_pem
            self._vault().put(into[1], bundle)
            return
        # The key first: a reader that sees the new certificate also finds its key.
        write_atomically(Path(into[2]), identity.key_pem.reveal().encode(), mode=0o600)
        write_atomically(Path(into[1]), identity.cert_pem.encode(), mode=0o644)


# -- helpers -----------------------------------------------------------------------------------


def _csr(key: ec.EllipticCurvePrivateKey, common_name: str) -> x509.CertificateSigningRequest:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())


def _usable(material: IdentityMaterial, now: float) -> ClientIdentity | None:
    """The identity when it parses, matches its key and is inside its validity; else None."""
    try:
        identity = parse_identity(material.cert_pem, material.key_pem)
    except CredentialError as error:
        _log.warning("the stored client identity is unusable (%s): re-enrolling", error)
        return None
    cert = identity.certificate
    if not cert.not_valid_before_utc.timestamp() <= now < cert.not_valid_after_utc.timestamp():
        return None
    return identity


def _renew_at(cert: x509.Certificate, renew_before_days: int) -> float:
    """notAfter minus renewBeforeDays; for a certificate whose whole lifetime is shorter than
    that window, two thirds into its lifetime (else every renewal would renew at once)."""
    start = cert.not_valid_before_utc.timestamp()
    end = cert.not_valid_after_utc.timestamp()
    window = renew_before_days * _DAY_S
    if window >= end - start:
        return start + (end - start) * 2 / 3
    return end - window


def _summary(cert: x509.Certificate) -> dict[str, Any]:
    return CertificateSummary.of(cert).to_json()


def _iso(when: float | datetime) -> str:
    if isinstance(when, float | int):
        when = datetime.fromtimestamp(when, timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, EstError):
        return f"{exc.strerror or type(exc).__name__}: {exc.filename or ''}".rstrip(": ")
    return str(exc)
