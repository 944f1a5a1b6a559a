"""OPC UA security material: the client's identity, the server trust list and the user.

Everything here is plain `cryptography` and files; the driver hands the results to asyncua.
Configuration problems (a file, a vault secret, a token, a URI) are `ConfigError`s naming the
key's path; a server certificate that is not trusted is a `DeviceError` with the OPC UA
status name, so the runtime retries after backoff (an operator may trust it meanwhile).
Key material and passwords never appear in a repr, a message or a log.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding as asym_padding
from cryptography.hazmat.primitives.asymmetric import rsa

from unskit.config.secrets import Secret, SecretRef, SecretResolver, resolve_value
from unskit.errors import ConfigError, ConfigIssue, DeviceError, SecretError
from unskit.opcua.config import OpcUaConnection, ServerCertificatePin, UserToken
from unskit.opcua.pkcs11 import Pkcs11Token

__all__ = [
    "ClientIdentity",
    "SessionSecurity",
    "TrustStore",
    "UserCredentials",
    "certificate_summary",
    "load_client_identity",
    "load_server_pin",
    "resolve_user",
    "sha1_thumbprint",
]

_log = logging.getLogger(__name__)

#: Asymmetric key lengths every supported secure policy allows (OPC UA Part 7 limits).
MIN_KEY_BITS = 2048
MAX_KEY_BITS = 4096
#: Longest issuer chain followed from a server certificate to a trusted anchor.
MAX_CHAIN_DEPTH = 8
_PEM_MARK = b"-----BEGIN"
#: What each secure policy does with the client key: its signature padding (SHA-256) and
#: the OAEP hash of the key exchange the server encrypts to us.
_POLICY_RSA: dict[str, tuple[asym_padding.AsymmetricPadding, hashes.HashAlgorithm]] = {
    "Basic256Sha256": (asym_padding.PKCS1v15(), hashes.SHA1()),
    "Aes128_Sha256_RsaOaep": (asym_padding.PKCS1v15(), hashes.SHA1()),
    "Aes256_Sha256_RsaPss": (
        asym_padding.PSS(asym_padding.MGF1(hashes.SHA256()), 32),
        hashes.SHA256(),
    ),
}


@dataclass(frozen=True, eq=False)
class ClientIdentity:
    """The client's application instance certificate, its private key and application URI."""

    certificate: x509.Certificate
    certificate_der: bytes = field(repr=False)
    private_key: rsa.RSAPrivateKey = field(repr=False)
    application_uri: str
    #: Issuer certificates sent along (a vault bundle's caPem, the rest of a PEM file).
    chain: tuple[x509.Certificate, ...] = field(default=(), repr=False)
    #: The open token session of a pkcs11 key; `close` ends it.
    token: Pkcs11Token | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        where = "pkcs11" if self.token is not None else "memory"
        return (
            f"ClientIdentity(application_uri={self.application_uri!r}, "
            f"subject={self.certificate.subject.rfc4514_string()!r}, key={where})"
        )

    def close(self) -> None:
        """Closes the token session of a pkcs11 key (nothing to do for the others)."""
        if self.token is not None:
            self.token.close()

    def __enter__(self) -> ClientIdentity:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UserCredentials(NamedTuple):
    """A UserName token's username and password; the password never shows in a repr."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"UserCredentials(username={self.username!r}, password='***')"

    def __str__(self) -> str:
        return repr(self)


def load_client_identity(
    connection: OpcUaConnection,
    secrets: SecretResolver | None,
    *,
    environ: Mapping[str, str] | None = None,
    path: str = "connection",
) -> ClientIdentity | None:
    """The client identity of a secure connection (None under policy None); ConfigError."""
    if not connection.secure:
        return None
    spec = connection.client_certificate
    where = f"{path}.clientCertificate"
    if spec is None:
        policy = connection.security_policy
        raise _error(where, f"securityPolicy {policy} needs a client certificate")
    token: Pkcs11Token | None = None
    chain: list[x509.Certificate] = []
    private_key: rsa.RSAPrivateKey
    if spec.source == "vault":
        if spec.secret is None:
            raise _error(f"{where}.secret", "source vault needs a secret")
        certs = _certificates(
            _resolve(SecretRef(spec.secret.name, "certPem"), secrets, f"{where}.secret")
            .reveal()
            .encode(),
            f"{where}.secret",
            f"the certPem of {spec.secret.name!r}",
        )
        private_key = _private_key(
            _resolve(SecretRef(spec.secret.name, "keyPem"), secrets, f"{where}.secret")
            .reveal()
            .encode(),
            f"{where}.secret",
            f"the keyPem of {spec.secret.name!r}",
        )
        chain = certs[1:]
        ca_pem = _resolve_optional(SecretRef(spec.secret.name, "caPem"), secrets)
        if ca_pem is not None:
            chain += _certificates(
                ca_pem.reveal().encode(), f"{where}.secret", f"the caPem of {spec.secret.name!r}"
            )
        certificate = certs[0]
    elif spec.source == "file":
        if not spec.cert_path or not spec.key_path:
            raise _error(where, "source file needs certPath and keyPath")
        certs = _certificates(
            _read(spec.cert_path, f"{where}.certPath"), f"{where}.certPath", spec.cert_path
        )
        private_key = _private_key(
            _read(spec.key_path, f"{where}.keyPath"), f"{where}.keyPath", spec.key_path
        )
        certificate, chain = certs[0], certs[1:]
    elif spec.source == "pkcs11":
        if spec.pkcs11 is None:
            raise _error(where, "source pkcs11 needs modulePath and keyLabel")
        token = Pkcs11Token.open(spec.pkcs11, environ, path=where)
        try:
            private_key = token.private_key(spec.pkcs11.key_label)
            certificate = token.certificate(spec.pkcs11.cert_label)
        except BaseException:
            token.close()
            raise
    else:
        raise _error(f"{where}.source", f"unknown source {spec.source!r} (vault, file, pkcs11)")
    try:
        uri = _check_identity(connection, certificate, private_key, path)
        if token is not None:
            _probe_token(connection.security_policy, private_key, f"{path}.securityPolicy")
    except BaseException:
        if token is not None:
            token.close()
        raise
    return ClientIdentity(
        certificate=certificate,
        certificate_der=certificate.public_bytes(serialization.Encoding.DER),
        private_key=private_key,
        application_uri=uri,
        chain=tuple(chain),
        token=token,
    )


def resolve_user(
    user: UserToken, secrets: SecretResolver | None, *, path: str = "connection.user"
) -> UserCredentials:
    """The UserName token's (username, password), vault references resolved; ConfigError."""
    username = _resolve(user.username, secrets, f"{path}.username")
    password = _resolve(user.password, secrets, f"{path}.password")
    return UserCredentials(username.reveal(), password.reveal())


def load_server_pin(
    pin: ServerCertificatePin,
    secrets: SecretResolver | None,
    *,
    path: str = "connection.trust.serverCertificate",
) -> bytes:
    """The DER of the pinned server certificate (a PEM/DER file or a vault field); ConfigError."""
    if pin.source == "file":
        if not pin.path:
            raise _error(f"{path}.path", "source file needs a path")
        data = _read(pin.path, f"{path}.path")
        what, where = pin.path, f"{path}.path"
    elif pin.source == "vault":
        if pin.secret is None:
            raise _error(f"{path}.secret", "source vault needs a secret")
        ref = SecretRef(pin.secret.name, pin.secret.field or "caPem")
        data = _resolve(ref, secrets, f"{path}.secret").reveal().encode()
        what, where = str(ref), f"{path}.secret"
    else:
        raise _error(f"{path}.source", f"unknown source {pin.source!r} (file, vault)")
    certs = _certificates(data, where, what)
    if len(certs) != 1:
        raise _error(where, f"{what} holds {len(certs)} certificates; a pin is exactly one")
    return certs[0].public_bytes(serialization.Encoding.DER)


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
            offered = _split_der_chain(der)
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
        path = _chain_to_anchor(leaf, pool, anchor_ders)
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
                f"{_iso(cert.not_valid_before_utc)} to {_iso(cert.not_valid_after_utc)}",
            )

    def _reject(
        self, leaf_der: bytes, code: str, reason: str, pinned: bytes | None = None
    ) -> NoReturn:
        thumbprint = sha1_thumbprint(leaf_der)
        target = self.rejected / f"{thumbprint}.der"
        try:
            _write_atomic(target, leaf_der)
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
                certs = _parse_certificates(entry.read_bytes())
            except (OSError, ValueError):
                _log.warning("trust list file %s is not a PEM or DER certificate; ignored", entry)
                continue
            found += [(cert, cert.public_bytes(serialization.Encoding.DER)) for cert in certs]
        return found


class SessionSecurity:
    """The security of one instance's sessions over its driver's life: the client identity
    loaded at connect and kept until `close`, the user and the pin resolved at every
    connect, the server certificate checked against the trust list. Configuration problems
    become DeviceErrors coded BadConfigurationError, so the instance shows them in
    sb/status and backs off instead of stopping."""

    def __init__(
        self,
        connection: OpcUaConnection,
        secrets: SecretResolver | None,
        *,
        environ: Mapping[str, str] | None = None,
        path: str = "connection",
    ) -> None:
        self.connection = connection
        self._secrets = secrets
        self._environ = environ
        self._path = path
        #: None under policy None: nothing of the trust list runs and no pkiDir is created.
        self.trust = TrustStore(connection.trust.pki_dir) if connection.secure else None
        self._identity: ClientIdentity | None = None
        #: A PKCS#11 identity that could not be loaded: never tried again by this instance.
        self._refused: DeviceError | None = None
        #: The server certificate the last secure connect accepted.
        self.server_certificate: x509.Certificate | None = None

    def __repr__(self) -> str:
        return (
            f"SessionSecurity({self.connection.security_policy}, "
            f"{self.connection.message_mode}, identity={self._identity!r})"
        )

    @property
    def source(self) -> str | None:
        """Where the client certificate comes from (vault, file, pkcs11), if secure."""
        spec = self.connection.client_certificate
        return spec.source if spec is not None and self.connection.secure else None

    def identity(self) -> ClientIdentity | None:
        """The client identity (None under policy None), loaded at the first call after
        construction or `close`; a PKCS#11 load that failed is not retried (a wrong PIN
        tried at every reconnect could lock the token)."""
        if not self.connection.secure:
            return None
        if self._refused is not None:
            raise self._refused
        if self._identity is None:
            try:
                self._identity = load_client_identity(
                    self.connection, self._secrets, environ=self._environ, path=self._path
                )
            except ConfigError as exc:
                refused = _configuration_failure(exc)
                if self.source == "pkcs11":
                    self._refused = DeviceError(
                        f"{refused}; not tried again until the instance restarts",
                        code=refused.code,
                    )
                raise refused from None
        return self._identity

    def user(self) -> UserCredentials | None:
        """The UserName token with vault references resolved now, or None."""
        if self.connection.user is None:
            return None
        try:
            return resolve_user(self.connection.user, self._secrets, path=f"{self._path}.user")
        except ConfigError as exc:
            raise _configuration_failure(exc) from None

    def check_server(self, der: bytes) -> x509.Certificate:
        """The certificate a server endpoint presents, if the pin (when configured, alone)
        or the trust list accepts it; else DeviceError, the certificate in rejected/."""
        if self.trust is None:
            raise DeviceError("securityPolicy None checks no server certificate")
        pin: bytes | None = None
        spec = self.connection.trust.server_certificate
        if spec is not None:
            try:
                pin = load_server_pin(
                    spec, self._secrets, path=f"{self._path}.trust.serverCertificate"
                )
            except ConfigError as exc:
                raise _configuration_failure(exc) from None
        self.server_certificate = None
        self.server_certificate = self.trust.check_server_certificate(der, pin)
        return self.server_certificate

    def facts(self) -> dict[str, Any]:
        """The security object of sb/status: policy, mode, trust list, pin, the client
        certificate's summary and source, the user (a vault one by its reference)."""
        connection = self.connection
        identity = self._identity
        client: dict[str, Any] | None = None
        if identity is not None:
            client = {"source": self.source, **certificate_summary(identity.certificate)}
        user = connection.user
        return {
            "securityPolicy": connection.security_policy,
            "messageMode": connection.message_mode if connection.secure else "None",
            "pkiDir": os.fspath(self.trust.pki_dir) if self.trust is not None else None,
            "serverCertificatePinned": self.trust is not None
            and connection.trust.server_certificate is not None,
            "clientCertificate": client,
            "applicationUri": identity.application_uri if identity is not None else None,
            "user": str(user.username) if user is not None else None,
        }

    def close(self) -> None:
        """Closes the identity (a token session); the next `identity` loads it again."""
        identity, self._identity = self._identity, None
        self.server_certificate = None
        if identity is not None:
            identity.close()


def certificate_summary(cert: x509.Certificate) -> dict[str, Any]:
    """JSON-ready facts of a certificate for sb/status (no key material)."""
    return {
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serialNumber": format(cert.serial_number, "x"),
        "notBefore": _iso(cert.not_valid_before_utc),
        "notAfter": _iso(cert.not_valid_after_utc),
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
        "sanUris": _san_uris(cert),
    }


def sha1_thumbprint(der: bytes) -> str:
    """The OPC UA certificate thumbprint: SHA-1 of the DER, lower-case hex."""
    return hashlib.sha1(der, usedforsecurity=False).hexdigest()


# -- identity helpers ---------------------------------------------------------------------


def _check_identity(
    connection: OpcUaConnection,
    certificate: x509.Certificate,
    private_key: rsa.RSAPrivateKey,
    path: str,
) -> str:
    where = f"{path}.clientCertificate"
    public = certificate.public_key()
    if not isinstance(public, rsa.RSAPublicKey):
        raise _error(where, "the client certificate's key is not RSA, which OPC UA policies need")
    if public.public_numbers() != private_key.public_key().public_numbers():
        raise _error(where, "the private key does not belong to the client certificate")
    if not MIN_KEY_BITS <= public.key_size <= MAX_KEY_BITS:
        raise _error(
            where,
            f"the client key has {public.key_size} bits; securityPolicy "
            f"{connection.security_policy} needs {MIN_KEY_BITS} to {MAX_KEY_BITS}",
        )
    uris = _san_uris(certificate)
    if not uris:
        raise _error(
            where,
            "the client certificate has no SAN URI, which is the application URI a secure "
            "connection needs",
        )
    configured = connection.application_uri
    if configured is None:
        return uris[0]
    if configured not in uris:
        raise _error(
            f"{path}.applicationUri",
            f"{configured!r} differs from the client certificate's SAN URI "
            f"{', '.join(repr(u) for u in uris)}",
        )
    return configured


def _probe_token(policy: str, key: rsa.RSAPrivateKey, where: str) -> None:
    # Tokens differ in the mechanism parameters they take (SoftHSM 2.6 decrypts OAEP with
    # SHA-1 only): one signature and one decryption now, so a token that cannot serve the
    # policy is a clear error at load, not a failed handshake.
    if policy not in _POLICY_RSA:
        raise _error(where, f"unknown securityPolicy {policy!r}")
    sign_padding, oaep_hash = _POLICY_RSA[policy]
    oaep = asym_padding.OAEP(asym_padding.MGF1(oaep_hash), oaep_hash, None)
    probe = os.urandom(32)
    step = f"sign with {sign_padding.name}-SHA256"
    try:
        signature = key.sign(probe, sign_padding, hashes.SHA256())
        key.public_key().verify(signature, probe, sign_padding, hashes.SHA256())
        step = f"decrypt RSA-OAEP with {oaep_hash.name.upper()}"
        if key.decrypt(key.public_key().encrypt(probe, oaep), oaep) != probe:
            raise InvalidSignature
    except (DeviceError, UnsupportedAlgorithm, InvalidSignature) as exc:
        detail = f": {exc}" if str(exc) else ""
        raise _error(
            where, f"the PKCS#11 token cannot {step}, which {policy} needs{detail}"
        ) from None


def _resolve(
    value: str | Secret | SecretRef | None, secrets: SecretResolver | None, path: str
) -> Secret:
    try:
        resolved = resolve_value(value, secrets)
    except SecretError as exc:
        raise _error(path, str(exc)) from None
    if resolved is None:
        raise _error(path, "a value is required")
    return resolved


def _resolve_optional(ref: SecretRef, secrets: SecretResolver | None) -> Secret | None:
    # Only called after certPem and keyPem of the same bundle resolved, so the vault and its
    # key are fine; what is left to fail is the field's absence.
    try:
        return resolve_value(ref, secrets)
    except SecretError:
        return None


def _read(path: str, where: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise _error(where, f"{path} cannot be read: {exc.strerror}") from None


def _certificates(data: bytes, where: str, what: str) -> list[x509.Certificate]:
    try:
        certs = _parse_certificates(data)
    except ValueError:
        raise _error(where, f"{what} is not a PEM or DER X.509 certificate") from None
    if not certs:
        raise _error(where, f"{what} holds no certificate")
    return certs


def _parse_certificates(data: bytes) -> list[x509.Certificate]:
    if _PEM_MARK in data:
        return x509.load_pem_x509_certificates(data)
    return [cert for cert, _ in _split_der_chain(data)]


def _private_key(data: bytes, where: str, what: str) -> rsa.RSAPrivateKey:
    try:
        if _PEM_MARK in data:
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_der_private_key(data, password=None)
    except TypeError:
        # There is no passphrase setting: an encrypted key file cannot be opened.
        raise _error(where, f"{what} is an encrypted private key; store it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm):
        raise _error(where, f"{what} is not a PEM or DER private key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise _error(where, f"{what} is not an RSA private key, which OPC UA policies need")
    return key


def _san_uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (x509.ExtensionNotFound, ValueError):
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


# -- trust helpers ------------------------------------------------------------------------


def _split_der_chain(data: bytes) -> list[tuple[x509.Certificate, bytes]]:
    """Concatenated DER certificates (how OPC UA sends a chain), each with its bytes."""
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


def _chain_to_anchor(
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
            if issuer_der in seen or not _can_issue(issuer):
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


def _can_issue(cert: x509.Certificate) -> bool:
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


def _write_atomic(target: Path, data: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _iso(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _configuration_failure(exc: ConfigError) -> DeviceError:
    return DeviceError("; ".join(map(str, exc.issues)), code="BadConfigurationError")


def _error(path: str, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(path, message)])
