"""OPC UA security material: the client's identity, the server trust list and the user.

Everything here is plain `cryptography` and files; the driver hands the results to asyncua.
Configuration problems (a file, a vault secret, a token, a URI) are `ConfigError`s naming the
key's path; a server certificate that is not trusted is a `DeviceError` with the OPC UA
status name, so the runtime retries after backoff (an operator may trust it meanwhile).
Key material and passwords never appear in a repr, a message or a log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cryptography import x509

from unskit.config.secrets import SecretResolver
from unskit.errors import ConfigError, DeviceError
from unskit.opcua.certificates import sha1_thumbprint
from unskit.opcua.config import OpcUaConnection
from unskit.opcua.identity import (
    UserCredentials,
    load_client_identity,
    load_server_pin,
    resolve_user,
)
from unskit.opcua.trust import TrustStore
from unskit.pki.identity import ClientIdentity

__all__ = [
    "SessionSecurity",
    "TrustStore",
    "UserCredentials",
    "load_client_identity",
    "load_server_pin",
    "resolve_user",
    "sha1_thumbprint",
]


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
            client = {"source": self.source, **identity.summary().to_json()}
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


def _configuration_failure(exc: ConfigError) -> DeviceError:
    return DeviceError("; ".join(map(str, exc.issues)), code="BadConfigurationError")
