"""The opcua-adapter's settings of one instance entry, as frozen shapes: the connection (security
policy and message mode, user token, client certificate from vault, file or a PKCS#11 token,
trust list and server certificate pin), the subscriptions with their resolved signal matchers
and deadbands, and `OpcUaSettings`, which `config.py` puts on each InstanceSpec. They are the
contract between the parser, the security modules and the driver."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from unskit.config.secrets import SecretRef

__all__ = [
    "DEFAULT_PKI_DIR",
    "MESSAGE_MODES",
    "SECURITY_POLICIES",
    "ClientCertificate",
    "DataChangeDeadband",
    "OpcUaConnection",
    "OpcUaSettings",
    "Pkcs11Key",
    "ServerCertificatePin",
    "SignalMatcher",
    "SubscriptionSpec",
    "TrustSettings",
    "UserToken",
]

#: The policies this build speaks; any other name falls back to None with a warning (spec 3).
SECURITY_POLICIES = ("None", "Basic256Sha256", "Aes128_Sha256_RsaOaep", "Aes256_Sha256_RsaPss")
MESSAGE_MODES = ("None", "Sign", "SignAndEncrypt")
DEFAULT_PKI_DIR = "pki/{InstanceId}"


@dataclass(frozen=True)
class DataChangeDeadband:
    """A server-side DataChangeFilter: ``None``, ``Absolute`` or ``Percent`` (of EURange)."""

    type: str = "None"
    value: float = 0.0


@dataclass(frozen=True)
class SignalMatcher:
    """One include or exclude matcher, with inherited settings resolved."""

    #: JSON path of the matcher, for warnings ("$.component.instances[0].subscriptions[0]...").
    path: str
    #: Preferred: resolved to the server's current index at every (re)connect.
    namespace_uri: str | None
    #: The literal index, used only without namespace_uri.
    namespace: int
    #: Include: identifier, browse name or display name; exclude: identifier only.
    match: re.Pattern[str]
    sampling_rate_ms: float
    queue_size: int
    deadband: DataChangeDeadband = field(default_factory=DataChangeDeadband)


@dataclass(frozen=True)
class SubscriptionSpec:
    id: str
    publish_interval_ms: float
    include: tuple[SignalMatcher, ...]
    exclude: tuple[SignalMatcher, ...]


@dataclass(frozen=True)
class UserToken:
    """A UserName token; the password is inline or a vault reference, resolved at connect."""

    username: str | SecretRef
    password: str | SecretRef = field(repr=False)


@dataclass(frozen=True)
class Pkcs11Key:
    """A client key that never leaves its token: sign and decrypt go through PKCS#11."""

    module_path: str
    slot_index: int
    #: The user PIN inline, or the name of the environment variable that holds it.
    pin: str | None = field(default=None, repr=False)
    pin_env: str | None = None
    key_label: str = ""
    cert_label: str = ""


@dataclass(frozen=True)
class ClientCertificate:
    """The client's application instance certificate: vault, file or pkcs11."""

    source: str
    #: vault: a bundle secret with certPem, keyPem and optionally caPem.
    secret: SecretRef | None = None
    #: file: templates already rendered.
    cert_path: str | None = None
    key_path: str | None = None
    pkcs11: Pkcs11Key | None = None


@dataclass(frozen=True)
class ServerCertificatePin:
    """The one server certificate accepted: a PEM/DER file, or a vault secret's caPem."""

    source: str
    path: str | None = None
    secret: SecretRef | None = None


@dataclass(frozen=True)
class TrustSettings:
    #: Rendered pkiDir (default ``pki/{InstanceId}``) with trusted/, rejected/ and issuers/.
    pki_dir: str
    server_certificate: ServerCertificatePin | None = None


@dataclass(frozen=True)
class OpcUaConnection:
    endpoint: str
    #: One of SECURITY_POLICIES (an unrecognised name has already fallen back to None).
    security_policy: str = "None"
    #: One of MESSAGE_MODES; None under a secure policy has already become SignAndEncrypt.
    message_mode: str = "None"
    application_uri: str | None = None
    user: UserToken | None = None
    client_certificate: ClientCertificate | None = None
    trust: TrustSettings = field(default_factory=lambda: TrustSettings("pki/default"))

    @property
    def secure(self) -> bool:
        return self.security_policy != "None"


@dataclass(frozen=True)
class OpcUaSettings:
    """Everything of one instance entry the driver needs beyond the InstanceSpec."""

    connection: OpcUaConnection
    subscriptions: tuple[SubscriptionSpec, ...]
    #: publish.batchMs resolved (default: the instance's publishIntervalMs).
    batch_ms: int
    #: writes.allow holds "*": every node may be written.
    writes_any: bool = False
