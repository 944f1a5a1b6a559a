"""The server trust list of one instance (trusted/, issuers/, rejected/ under its pkiDir):
a server certificate accepted by its pin, as a trusted one or by its chain to a trusted CA."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import NoReturn

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from unskit.errors import DeviceError
from unskit.files import write_atomically
from unskit.opcua.certificates import sha1_thumbprint
from unskit.pki.certificates import load_certificates, rfc3339, split_der_chain
from unskit.pki.trust import chain_to_anchor

__all__ = ["TrustStore"]

# The logger keeps the name it had before this module was split out of security.py.
_log = logging.getLogger("unskit.opcua.security")


class TrustStore:
    """The server trust list of one instance: ``trusted/``, ``issuers/`` and ``rejected/``
    under its pkiDir. There is no auto-trust: an operator moves a certificate from
    rejected/ to trusted/."""

    def __init__(self, pki_dir: str | os.PathLike[str]) -> None:
        self.pki_dir = Path(pki_dir)
        self.trusted = self.pki_dir / "trusted"
        self.rejected = self.pki_dir / "rejected"
        self.issuers = self.pki_dir / "issuers"

    def __repr__(self) -> str:
        return f"TrustStore({os.fspath(self.pki_dir)!r})"

    def ensure(self) -> None:
        """Creates pkiDir and its three subdirectories (mode 0700) where missing."""
        for directory in (self.pki_dir, self.trusted, self.rejected, self.issuers):
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise DeviceError(
                    f"trust list directory {directory} cannot be created: {exc.strerror}",
                    code="BadCertificateInvalid",
                ) from None

    def check_server_certificate(
        self,
        der: bytes,
        pin: bytes | None = None,
        *,
        now: datetime.datetime | None = None,
    ) -> x509.Certificate:
        """The server certificate if trusted (the pin alone when one is set), else
        DeviceError after writing it to rejected/. `der` may carry the server's chain."""
        self.ensure()
        when = now or datetime.datetime.now(datetime.timezone.utc)
        try:
            offered = split_der_chain(der)
        except ValueError:
            raise DeviceError(
                "the server certificate is not DER X.509", code="BadCertificateInvalid"
            ) from None
        leaf, leaf_der = offered[0]
        thumbprint = sha1_thumbprint(leaf_der)
        if pin is not None:
            if leaf_der == pin:
                self._check_dates([leaf], when, leaf_der)
                return leaf
            self._reject(
                leaf_der,
                "BadCertificateUntrusted",
                f"does not match the pinned server certificate (sha1 {sha1_thumbprint(pin)}); "
                "with a pin no other certificate is accepted",
                pin,
            )
        anchors = self._read_dir(self.trusted)
        anchor_ders = {item_der for _, item_der in anchors}
        if leaf_der in anchor_ders:
            self._check_dates([leaf], when, leaf_der)
            return leaf
        pool = anchors + self._read_dir(self.issuers) + offered[1:]
        path = chain_to_anchor(leaf, pool, anchor_ders)
        if path is None:
            self._reject(
                leaf_der,
                "BadCertificateUntrusted",
                f"(subject {leaf.subject.rfc4514_string()!r}, issuer "
                f"{leaf.issuer.rfc4514_string()!r}) is not in {self.trusted} and does not "
                f"chain to a CA there",
            )
        self._check_dates(path, when, leaf_der)
        _log.debug("server certificate sha1 %s trusted through its issuer chain", thumbprint)
        return leaf

    def _check_dates(
        self, path: list[x509.Certificate], when: datetime.datetime, leaf_der: bytes
    ) -> None:
        for index, cert in enumerate(path):
            if cert.not_valid_before_utc <= when <= cert.not_valid_after_utc:
                continue
            whose = "it" if index == 0 else f"its issuer {cert.subject.rfc4514_string()!r}"
            self._reject(
                leaf_der,
                "BadCertificateTimeInvalid" if index == 0 else "BadCertificateIssuerTimeInvalid",
                f"is outside its validity period: {whose} is valid from "
                f"{rfc3339(cert.not_valid_before_utc)} to {rfc3339(cert.not_valid_after_utc)}",
            )

    def _reject(
        self, leaf_der: bytes, code: str, reason: str, pinned: bytes | None = None
    ) -> NoReturn:
        thumbprint = sha1_thumbprint(leaf_der)
        target = self.rejected / f"{thumbprint}.der"
        try:
            write_atomically(target, leaf_der)
            saved = f"; written to {target}"
            if code == "BadCertificateUntrusted" and pinned is None:
                saved += f" (move it to {self.trusted} to trust it)"
        except OSError as exc:
            saved = f"; it could not be written to {target}: {exc.strerror}"
        raise DeviceError(f"server certificate sha1 {thumbprint} {reason}{saved}", code=code)

    @staticmethod
    def _read_dir(directory: Path) -> list[tuple[x509.Certificate, bytes]]:
        found: list[tuple[x509.Certificate, bytes]] = []
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            return found
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file():
                continue
            try:
                certs = load_certificates(entry.read_bytes(), entry.name, der=True)
            except (OSError, ValueError):
                _log.warning("trust list file %s is not a PEM or DER certificate; ignored", entry)
                continue
            found += [(cert, cert.public_bytes(serialization.Encoding.DER)) for cert in certs]
        return found
