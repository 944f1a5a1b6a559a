"""Where EST credentials come from and go to: the current certificate (the `into`
destination, else the client identity), the EST server's trust and Basic credentials, the
store of an issued identity, and the certificate helpers (see `unskit.cip.enrollment`)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from unskit.cip.enrollment_settings import (
    _DAY_S,
    EnrolledIdentity,
    EstSettings,
    VaultProvider,
    _Current,
    _log,
)
from unskit.cip.est import ClientIdentity
from unskit.config.secrets import Secret, SecretRef
from unskit.config.vault import Vault
from unskit.errors import EstError, SecretError
from unskit.files import write_atomically


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
        found = self._read_into()
        if found is None and self.settings.client:
            block = self.settings.client
            with contextlib.suppress(EstError, SecretError, OSError):
                found = (self._identity(block, "client"), self._bundle_ca(block))
        if found is None:
            return None
        identity, ca_pem = found
        cert = _usable(identity, self._clock())
        return None if cert is None else _Current(cert, identity, ca_pem)

    def _read_into(self) -> tuple[ClientIdentity, str | None] | None:
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
            return ClientIdentity(value["certPem"], Secret(value["keyPem"])), value.get("caPem")
        cert_path, key_path = Path(into[1]), Path(into[2])
        if not cert_path.exists() or not key_path.exists():
            return None
        return ClientIdentity(cert_path.read_text(), Secret(key_path.read_text())), None

    def _identity(self, block: Mapping[str, Any], path: str) -> ClientIdentity:
        """A client identity from a certSecret, certFile/keyFile or cert/key $secret block."""
        if "certSecret" in block:
            value = self._vault().get(block["certSecret"])
            if isinstance(value, str) or "certPem" not in value or "keyPem" not in value:
                raise EstError(f"{path}.certSecret must name a bundle with certPem and keyPem")
            return ClientIdentity(value["certPem"], Secret(value["keyPem"]))
        if "certFile" in block and "keyFile" in block:
            return ClientIdentity(
                Path(block["certFile"]).read_text(), Secret(Path(block["keyFile"]).read_text())
            )
        cert, key = SecretRef.parse(block.get("cert")), SecretRef.parse(block.get("key"))
        if cert is not None and key is not None:
            vault = self._vault()
            return ClientIdentity(vault.resolve(cert).reveal(), vault.resolve(key))
        raise EstError(f"{path} names no complete client identity")

    def _bundle_ca(self, block: Mapping[str, Any]) -> str | None:
        if "certSecret" not in block:
            return None
        value = self._vault().get(block["certSecret"])
        return None if isinstance(value, str) else value.get("caPem")

    def _trust(self, block: Mapping[str, Any]) -> str | None:
        """PEM trust anchors from a CA-style block; None: the system's default roots."""
        if not block:
            return None
        if "file" in block:
            return Path(block["file"]).read_text()
        if "bundle" in block:
            return self._bundle_ca({"certSecret": block["bundle"]})
        vault = self._vault()
        if "secret" in block:
            return _ca_pem(vault.get(block["secret"]), f"secret {block['secret']!r}")
        if "trustStore" in block:
            # As for the connection: every retained version is trusted during a rollover.
            name = block["trustStore"]
            return "".join(_ca_pem(v, f"trustStore {name!r}") for v in vault.versions(name))
        if "cert" in block:
            ref = SecretRef.parse(block["cert"])
            if ref is not None:
                return vault.resolve(ref).reveal()
        if "list" in block:
            refs = [SecretRef.parse(item) for item in block["list"]]
            return "".join(vault.resolve(ref).reveal() for ref in refs if ref is not None)
        return None

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


def _ca_pem(value: str | Mapping[str, str], what: str) -> str:
    """A CA secret's PEM: a plain value, or every certificate field of a bundle."""
    if isinstance(value, str):
        return value
    parts = [text for _, text in sorted(value.items()) if "-----BEGIN CERTIFICATE-----" in text]
    if not parts:
        raise EstError(f"the EST trust {what} holds no PEM certificate in any field")
    return "\n".join(parts)


def _csr(key: ec.EllipticCurvePrivateKey, common_name: str) -> x509.CertificateSigningRequest:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())


def _usable(identity: ClientIdentity, now: float) -> x509.Certificate | None:
    """The leaf when it parses, is inside its validity and matches its key; else None."""
    try:
        cert = x509.load_pem_x509_certificate(identity.cert_pem.encode())
        key = serialization.load_pem_private_key(identity.key_pem.reveal().encode(), None)
    except (ValueError, TypeError):
        _log.warning("the stored client certificate or key is not valid PEM: re-enrolling")
        return None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ) != cert.public_key().public_bytes(serialization.Encoding.DER, spki):
        _log.warning("the stored client key does not match its certificate: re-enrolling")
        return None
    if not cert.not_valid_before_utc.timestamp() <= now < cert.not_valid_after_utc.timestamp():
        return None
    return cert


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
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return {
        "subject": str(names[0].value) if names else cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serial": format(cert.serial_number, "x"),
        "notBefore": _iso(cert.not_valid_before_utc),
        "notAfter": _iso(cert.not_valid_after_utc),
        "sha256": hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest(),
    }


def _iso(when: float | datetime) -> str:
    if isinstance(when, float | int):
        when = datetime.fromtimestamp(when, timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, EstError):
        return f"{exc.strerror or type(exc).__name__}: {exc.filename or ''}".rstrip(": ")
    return str(exc)
