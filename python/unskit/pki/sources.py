"""Where PEM material comes from: the client identity and the trust anchors a configuration
block names (a vault bundle, files, `$secret` references, every retained version of a trust
store). Failures are `CredentialError`s naming the key's path, never the material."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from unskit.config.secrets import SecretRef
from unskit.config.vault import Vault
from unskit.errors import CredentialError, SecretError
from unskit.pki.certificates import PEM_CERTIFICATE, read_file

__all__ = ["IdentityMaterial", "VaultProvider", "identity_material", "trust_anchors"]


class VaultProvider(Protocol):
    """Opens the vault (`unskit.config.vault.VaultSecrets` fits)."""

    def vault(self) -> Vault:
        """The vault, opened with its key."""
        ...


@dataclass(frozen=True, repr=False)
class IdentityMaterial:
    """A client identity as configured: PEM certificate chain and key, and the CA PEM a
    vault bundle may carry beside them. The repr shows none of it."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes | None = None

    def __repr__(self) -> str:
        return f"IdentityMaterial(ca={'yes' if self.ca_pem is not None else 'no'})"


def identity_material(
    block: Mapping[str, Any], secrets: VaultProvider | None, path: str
) -> IdentityMaterial:
    """The identity a `certSecret`, `certFile`/`keyFile` or `cert`/`key` block names."""
    try:
        if "certSecret" in block:
            name = block["certSecret"]
            bundle = _bundle(secrets, name, f"{path}.certSecret")
            for needed in ("certPem", "keyPem"):
                if needed not in bundle:
                    raise CredentialError(f"{path}.certSecret {name!r} has no {needed} field")
            ca = bundle.get("caPem")
            return IdentityMaterial(
                bundle["certPem"].encode(),
                bundle["keyPem"].encode(),
                None if ca is None else ca.encode(),
            )
        if "certFile" in block and "keyFile" in block:
            return IdentityMaterial(
                read_file(block["certFile"], f"{path}.certFile"),
                read_file(block["keyFile"], f"{path}.keyFile"),
            )
        if "cert" in block and "key" in block:
            return IdentityMaterial(
                _resolve(secrets, block["cert"], f"{path}.cert"),
                _resolve(secrets, block["key"], f"{path}.key"),
            )
    except SecretError as error:
        raise CredentialError(str(error)) from None
    raise CredentialError(
        f"{path} names no client identity (certSecret, certFile and keyFile, or cert and key)"
    )


def trust_anchors(
    block: Mapping[str, Any], secrets: VaultProvider | None, path: str
) -> list[bytes]:
    """The PEM trust anchors a CA-style block names; none for an empty block."""
    try:
        if "file" in block:
            return [read_file(block["file"], f"{path}.file")]
        if "bundle" in block:
            ca = _bundle(secrets, block["bundle"], f"{path}.bundle").get("caPem")
            return [] if ca is None else [ca.encode()]
        if "secret" in block:
            value = _vault(secrets, f"{path}.secret").get(block["secret"])
            return [_certificate_pem(value, f"{path}.secret {block['secret']!r}")]
        if "cert" in block:
            return [_resolve(secrets, block["cert"], f"{path}.cert")]
        if "trustStore" in block:
            # Every retained version is trusted: old and new roots together during a rollover.
            name = block["trustStore"]
            versions = _vault(secrets, f"{path}.trustStore").versions(name)
            return [_certificate_pem(value, f"{path}.trustStore {name!r}") for value in versions]
        if "list" in block:
            return [
                _resolve(secrets, ref, f"{path}.list[{index}]")
                for index, ref in enumerate(block["list"])
            ]
    except SecretError as error:
        raise CredentialError(str(error)) from None
    return []


def _certificate_pem(value: str | Mapping[str, str], what: str) -> bytes:
    """A CA secret's PEM: a plain value, or every certificate field of a bundle."""
    if isinstance(value, str):
        return value.encode()
    marker = PEM_CERTIFICATE.decode()
    parts = [text for _, text in sorted(value.items()) if marker in text]
    if not parts:
        raise CredentialError(f"{what} holds no PEM certificate in any field")
    return "\n".join(parts).encode()


def _vault(secrets: VaultProvider | None, key: str) -> Vault:
    if secrets is None:
        raise CredentialError(f"{key} needs the vault: the configuration has no credentials")
    return secrets.vault()


def _bundle(secrets: VaultProvider | None, name: str, key: str) -> Mapping[str, str]:
    value = _vault(secrets, key).get(name)
    if isinstance(value, str):
        raise CredentialError(f"{key} {name!r} is a plain value, not a certPem/keyPem bundle")
    return value


def _resolve(secrets: VaultProvider | None, ref: Any, key: str) -> bytes:
    parsed = SecretRef.parse(ref)
    if parsed is None:
        raise CredentialError(f"{key} is not a $secret reference")
    return _vault(secrets, key).resolve(parsed).reveal().encode()
