"""The opcua-adapter's `component` section, parsed into southbound instances.

The shapes below are the contract between the parser, the security module and the driver;
the driver reads an instance's `OpcUaSettings` with `opcua_settings(spec)`. As in the CIP
adapter, the document-level schema checks `component.global` and that `instances` is a
non-empty array; each entry is then checked on its own (its schema, then the rules a schema
cannot say), so one malformed entry is skipped with its JSON path while the others run."""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from unskit.config.model import ComponentConfig, thaw
from unskit.config.schema import definition_schema, load_schema, validate_with_schema
from unskit.config.secrets import SecretRef
from unskit.config.templates import path_template_variables, render_path_template
from unskit.errors import ConfigError, ConfigIssue, missing_extra
from unskit.southbound.component import Candidate
from unskit.southbound.driver import InstanceSpec, Timing, parse_timing
from unskit.southbound.service import Skipped

__all__ = [
    "MESSAGE_MODES",
    "SECURITY_POLICIES",
    "TOKEN",
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
    "component_schema",
    "opcua_settings",
    "parse_component",
]

TOKEN = "opcua-adapter"
#: The policies this build speaks; any other name falls back to None with a warning (spec 3).
SECURITY_POLICIES = ("None", "Basic256Sha256", "Aes128_Sha256_RsaOaep", "Aes256_Sha256_RsaPss")
MESSAGE_MODES = ("None", "Sign", "SignAndEncrypt")
_MAX_PORT = 65535


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


# -- parsing: the `component` section into InstanceSpecs ------------------------------------

_log = logging.getLogger(__name__)

SCHEMA_FILE = "opcua-adapter.schema.json"
DEFAULT_ADAPTER = "opcua"
DEFAULT_PKI_DIR = "pki/{InstanceId}"
#: The vault field a pinned server certificate is read from unless `field` says otherwise.
DEFAULT_PIN_FIELD = "caPem"
#: Built-in values, the last step of the precedence matcher > instance > global.
BUILTIN_PUBLISH_INTERVAL_MS = 1000
BUILTIN_SAMPLING_RATE_MS = 0
BUILTIN_QUEUE_SIZE = 100
STALE_SIGNAL_SECS = 30
#: Percent deadbands are a share of the node's EURange.
_MAX_PERCENT = 100

#: Credential styles: each credential is sourced by exactly one of these key sets.
_USER_STYLES = {"inline": ("username", "password"), "vault": ("source", "secret")}
_CERTIFICATE_KEYS = {
    "vault": ("secret",),
    "file": ("certPath", "keyPath"),
    "pkcs11": ("modulePath", "slotIndex", "pin", "pinEnv", "keyLabel", "certLabel"),
}
_CERTIFICATE_REQUIRED = {
    "vault": ("secret",),
    "file": ("certPath", "keyPath"),
    "pkcs11": ("modulePath", "keyLabel"),
}
_PIN_KEYS = {"file": ("path",), "vault": ("secret", "field")}
_PIN_REQUIRED = {"file": ("path",), "vault": ("secret",)}
_NEEDS_VAULT = (
    "is vault, which needs the credentials section (the encrypted vault it resolves from)"
)


@functools.cache
def component_schema() -> Mapping[str, Any]:
    """The `component` section's JSON Schema (a data file shipped with the package)."""
    return load_schema(SCHEMA_FILE)


@functools.cache
def _instance_schema() -> Mapping[str, Any]:
    return definition_schema(component_schema(), "instance")


def parse_component(config: ComponentConfig) -> Candidate:
    """Every valid instance (precedence resolved) and every skipped one with its reason."""
    component = thaw(config.component)
    global_section = component.get("global") or {}
    timing = parse_timing(
        global_section, thresholds_key="healthThresholds", stale_signal_secs=STALE_SIGNAL_SECS
    )
    global_defaults = global_section.get("defaults") or {}
    specs: list[InstanceSpec] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for index, entry in enumerate(component.get("instances") or []):
        path = f"$.component.instances[{index}]"
        ident = entry.get("id") if isinstance(entry, Mapping) else None
        name = ident if isinstance(ident, str) and ident else f"#{index}"
        issues = _instance_issues(entry, index, config)
        if issues:
            reason = "; ".join(str(issue) for issue in issues)
            skipped.append(Skipped(name, reason, tuple(issues)))
            continue
        if name in seen:
            issue = ConfigIssue(f"{path}.id", "duplicate id: the first entry wins")
            skipped.append(Skipped(name, str(issue), (issue,)))
            continue
        seen.add(name)
        specs.append(_instance(entry, global_defaults, timing, path, config))
    return Candidate(specs, skipped)


def opcua_settings(spec: InstanceSpec) -> OpcUaSettings:
    """The OPC UA settings `parse_component` put on an instance."""
    if not isinstance(spec.settings, OpcUaSettings):
        raise TypeError(f"instance {spec.id} carries no OpcUaSettings: not an opcua-adapter entry")
    return spec.settings


# -- the rules a schema cannot say ----------------------------------------------------------


def _instance_issues(entry: object, index: int, config: ComponentConfig) -> list[ConfigIssue]:
    """Schema issues of one entry, then the cross-key rules (only on a schema-valid entry)."""
    issues = validate_with_schema(entry, _instance_schema(), ("component", "instances", index))
    if issues or not isinstance(entry, Mapping):
        return issues
    return list(_rules(entry, f"$.component.instances[{index}]", config))


def _rules(entry: Mapping[str, Any], path: str, config: ComponentConfig) -> Iterator[ConfigIssue]:
    if importlib.util.find_spec("asyncua") is None:
        yield ConfigIssue(path, missing_extra("the opcua-adapter", "asyncua", "opcua"))
    connection = entry["connection"]
    at = f"{path}.connection"
    yield from _endpoint_rules(connection["endpoint"], f"{at}.endpoint")
    yield from _security_rules(connection, at)
    vault = config.credentials is not None
    if "user" in connection:
        yield from _user_rules(connection["user"], f"{at}.user", vault)
    if "clientCertificate" in connection:
        yield from _certificate_rules(connection["clientCertificate"], f"{at}.clientCertificate")
    pin = (connection.get("trust") or {}).get("serverCertificate")
    if pin is not None:
        yield from _sourced_rules(pin, f"{at}.trust.serverCertificate", _PIN_KEYS, _PIN_REQUIRED)
    for key, source in _vault_sourced(connection, at):
        if source == "vault" and not vault:
            yield ConfigIssue(f"{key}.source", _NEEDS_VAULT)
    variables = path_template_variables(config, entry["id"])
    for template, template_path in _templates(connection, at):
        try:
            render_path_template(template, variables, template_path)
        except ConfigError as exc:
            yield from exc.issues
    yield from _subscription_rules(entry.get("subscriptions") or [], path)


def _endpoint_rules(endpoint: str, path: str) -> Iterator[ConfigIssue]:
    try:
        port = urlsplit(endpoint).port
    except ValueError:
        port = -1
    if port is not None and not 0 < port <= _MAX_PORT:
        yield ConfigIssue(path, f"the port is not in 1..{_MAX_PORT}")


def _security_rules(connection: Mapping[str, Any], path: str) -> Iterator[ConfigIssue]:
    policy = connection.get("securityPolicy", "None")
    if policy in SECURITY_POLICIES and policy != "None":
        if "clientCertificate" not in connection:
            yield ConfigIssue(
                f"{path}.clientCertificate",
                f"is required under securityPolicy {policy}: a secure channel needs the "
                "client's application instance certificate",
            )
        return
    fallback = (
        ""
        if policy == "None"
        else f" (securityPolicy {policy!r} is not one this build speaks, so it falls back to None)"
    )
    # Fail closed: a key that only a secure channel uses means the user expects one.
    for key in ("clientCertificate", "applicationUri"):
        if key in connection:
            yield ConfigIssue(
                f"{path}.{key}",
                f"applies to a secure securityPolicy only; under None it would go unused{fallback}",
            )
    mode = connection.get("messageMode", "None")
    if mode != "None":
        yield ConfigIssue(
            f"{path}.messageMode",
            f"{mode} needs a secure securityPolicy: None neither signs nor encrypts{fallback}",
        )


def _user_rules(user: Mapping[str, Any], path: str, vault: bool) -> Iterator[ConfigIssue]:
    styles = [style for style, keys in _USER_STYLES.items() if any(key in user for key in keys)]
    if len(styles) > 1:
        yield ConfigIssue(
            path,
            "mixes sourcing styles (inline username/password and vault source/secret): use one",
        )
        return
    if not styles:
        yield ConfigIssue(path, "needs username and password, or source vault and secret")
        return
    (style,) = styles
    for key in _USER_STYLES[style]:
        if key not in user:
            yield ConfigIssue(f"{path}.{key}", f"is required for a {style} user token")


def _certificate_rules(certificate: Mapping[str, Any], path: str) -> Iterator[ConfigIssue]:
    yield from _sourced_rules(certificate, path, _CERTIFICATE_KEYS, _CERTIFICATE_REQUIRED)
    if certificate["source"] == "pkcs11":
        if "pin" in certificate and "pinEnv" in certificate:
            yield ConfigIssue(f"{path}.pinEnv", "pin and pinEnv exclude each other: give one")
        elif "pin" not in certificate and "pinEnv" not in certificate:
            yield ConfigIssue(
                f"{path}.pin",
                "is required with source pkcs11 (or pinEnv, the variable that holds it)",
            )


def _sourced_rules(
    credential: Mapping[str, Any],
    path: str,
    keys: Mapping[str, tuple[str, ...]],
    required: Mapping[str, tuple[str, ...]],
) -> Iterator[ConfigIssue]:
    """One credential, one sourcing style: no key of another source, every key of its own."""
    source = credential["source"]
    for other, other_keys in keys.items():
        for key in other_keys:
            if other != source and key in credential and key not in keys[source]:
                yield ConfigIssue(
                    f"{path}.{key}",
                    f"belongs to source {other}, but source is {source}: "
                    "one credential has one sourcing style",
                )
    for key in required[source]:
        if key not in credential:
            yield ConfigIssue(f"{path}.{key}", f"is required with source {source}")


def _vault_sourced(connection: Mapping[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(path, source) of every credential that names a source."""
    for key in ("user", "clientCertificate"):
        source = (connection.get(key) or {}).get("source")
        if source is not None:
            yield f"{path}.{key}", source
    pin = (connection.get("trust") or {}).get("serverCertificate") or {}
    if "source" in pin:
        yield f"{path}.trust.serverCertificate", pin["source"]


def _templates(connection: Mapping[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(template, path) of every path template of a connection, defaults included."""
    trust = connection.get("trust") or {}
    yield trust.get("pkiDir", DEFAULT_PKI_DIR), f"{path}.trust.pkiDir"
    certificate = connection.get("clientCertificate") or {}
    if certificate.get("source") == "file":
        for key in ("certPath", "keyPath"):
            if key in certificate:
                yield certificate[key], f"{path}.clientCertificate.{key}"
    pin = trust.get("serverCertificate") or {}
    if pin.get("source") == "file" and "path" in pin:
        yield pin["path"], f"{path}.trust.serverCertificate.path"


def _subscription_rules(
    subscriptions: Sequence[Mapping[str, Any]], path: str
) -> Iterator[ConfigIssue]:
    ids: set[str] = set()
    for s, subscription in enumerate(subscriptions):
        at = f"{path}.subscriptions[{s}]"
        if "id" in subscription:
            if subscription["id"] in ids:
                yield ConfigIssue(f"{at}.id", "duplicate subscription id: unique per instance")
            ids.add(subscription["id"])
        for kind in ("include", "exclude"):
            for m, matcher in enumerate(subscription.get(kind) or []):
                yield from _matcher_rules(matcher, f"{at}.{kind}[{m}]")


def _matcher_rules(matcher: Mapping[str, Any], path: str) -> Iterator[ConfigIssue]:
    try:
        re.compile(matcher.get("match", ".*"))
    except re.error as exc:
        where = "" if exc.pos is None else f" at position {exc.pos}"
        yield ConfigIssue(f"{path}.match", f"is not a valid regular expression: {exc.msg}{where}")
    deadband = matcher.get("deadband") or {}
    if deadband.get("type") == "Percent" and deadband.get("value", 0) > _MAX_PERCENT:
        yield ConfigIssue(
            f"{path}.deadband.value",
            f"a Percent deadband is a share of the node's EURange: at most {_MAX_PERCENT}",
        )


# -- building a valid entry -----------------------------------------------------------------


def _instance(
    entry: Mapping[str, Any],
    global_defaults: Mapping[str, Any],
    timing: Timing,
    path: str,
    config: ComponentConfig,
) -> InstanceSpec:
    instance_defaults = entry.get("defaults") or {}

    def resolved(key: str, builtin: float, *layers: Mapping[str, Any]) -> Any:
        for layer in (*layers, instance_defaults, global_defaults):
            if key in layer:
                return layer[key]
        return builtin

    subscriptions = tuple(
        SubscriptionSpec(
            id=subscription.get("id") or str(uuid.uuid4()),
            publish_interval_ms=float(
                resolved("publishIntervalMs", BUILTIN_PUBLISH_INTERVAL_MS, subscription)
            ),
            include=_matchers(subscription, "include", f"{path}.subscriptions[{s}]", resolved),
            exclude=_matchers(subscription, "exclude", f"{path}.subscriptions[{s}]", resolved),
        )
        for s, subscription in enumerate(entry.get("subscriptions") or [])
    )
    allow = (entry.get("writes") or {}).get("allow", [])
    publish_interval = resolved("publishIntervalMs", BUILTIN_PUBLISH_INTERVAL_MS)
    batch_ms = (entry.get("publish") or {}).get("batchMs", int(publish_interval))
    settings = OpcUaSettings(
        connection=_connection(entry, path, config),
        subscriptions=subscriptions,
        batch_ms=int(batch_ms),
        writes_any="*" in allow,
    )
    return InstanceSpec(
        id=entry["id"],
        adapter=entry.get("adapter", DEFAULT_ADAPTER),
        endpoint=entry["connection"]["endpoint"],
        poll_groups=(),
        writes_allow=frozenset(allow),
        timing=timing,
        entry=entry,
        settings=settings,
    )


def _matchers(
    subscription: Mapping[str, Any],
    kind: str,
    path: str,
    resolved: Callable[..., Any],
) -> tuple[SignalMatcher, ...]:
    matchers: list[SignalMatcher] = []
    for m, matcher in enumerate(subscription.get(kind) or []):
        at = f"{path}.{kind}[{m}]"
        if "topic" in matcher:
            _log.warning("%s.topic is ignored: there are no per-signal topic templates", at)
        deadband = matcher.get("deadband") or {}
        matchers.append(
            SignalMatcher(
                path=at,
                namespace_uri=matcher.get("namespaceUri"),
                namespace=matcher.get("namespace", 0),
                match=re.compile(matcher.get("match", ".*")),
                sampling_rate_ms=float(
                    resolved("samplingRateMs", BUILTIN_SAMPLING_RATE_MS, matcher)
                ),
                queue_size=int(resolved("queueSize", BUILTIN_QUEUE_SIZE, matcher)),
                deadband=DataChangeDeadband(
                    deadband.get("type", "None"), float(deadband.get("value", 0))
                ),
            )
        )
    return tuple(matchers)


def _connection(entry: Mapping[str, Any], path: str, config: ComponentConfig) -> OpcUaConnection:
    connection = entry["connection"]
    at = f"{path}.connection"
    policy = connection.get("securityPolicy", "None")
    if policy not in SECURITY_POLICIES:
        _log.warning(
            "%s.securityPolicy %r is not one this build speaks (%s): falling back to None",
            at,
            policy,
            ", ".join(SECURITY_POLICIES),
        )
        policy = "None"
    mode = connection.get("messageMode", "None")
    if policy != "None" and mode == "None":
        mode = "SignAndEncrypt"
    variables = path_template_variables(config, entry["id"])
    trust = connection.get("trust") or {}
    if "autoTrustServerCert" in trust:
        _log.warning(
            "%s.trust.autoTrustServerCert is ignored: there is no auto-trust; put the server "
            "certificate in the trust list (trusted/) or pin it (trust.serverCertificate)",
            at,
        )
    return OpcUaConnection(
        endpoint=connection["endpoint"],
        security_policy=policy,
        message_mode=mode,
        application_uri=connection.get("applicationUri"),
        user=_user(connection.get("user")),
        client_certificate=_client_certificate(
            connection.get("clientCertificate"), variables, f"{at}.clientCertificate"
        ),
        trust=TrustSettings(
            pki_dir=render_path_template(
                trust.get("pkiDir", DEFAULT_PKI_DIR), variables, f"{at}.trust.pkiDir"
            ),
            server_certificate=_server_certificate(
                trust.get("serverCertificate"), variables, f"{at}.trust.serverCertificate"
            ),
        ),
    )


def _credential(value: Any) -> str | SecretRef:
    ref = SecretRef.parse(value)
    return ref if ref is not None else str(value)


def _user(user: Mapping[str, Any] | None) -> UserToken | None:
    if user is None:
        return None
    if user.get("source") == "vault":
        # A vault basic-auth secret: one JSON object with username and password.
        return UserToken(
            SecretRef(user["secret"], "username"), SecretRef(user["secret"], "password")
        )
    return UserToken(_credential(user["username"]), _credential(user["password"]))


def _client_certificate(
    certificate: Mapping[str, Any] | None, variables: Mapping[str, str], path: str
) -> ClientCertificate | None:
    if certificate is None:
        return None
    source = certificate["source"]
    if source == "vault":
        return ClientCertificate(source, secret=SecretRef(certificate["secret"]))
    if source == "file":
        return ClientCertificate(
            source,
            cert_path=render_path_template(certificate["certPath"], variables, f"{path}.certPath"),
            key_path=render_path_template(certificate["keyPath"], variables, f"{path}.keyPath"),
        )
    key_label = certificate["keyLabel"]
    return ClientCertificate(
        source,
        pkcs11=Pkcs11Key(
            module_path=certificate["modulePath"],
            slot_index=certificate.get("slotIndex", 0),
            pin=certificate.get("pin"),
            pin_env=certificate.get("pinEnv"),
            key_label=key_label,
            cert_label=certificate.get("certLabel", key_label),
        ),
    )


def _server_certificate(
    pin: Mapping[str, Any] | None, variables: Mapping[str, str], path: str
) -> ServerCertificatePin | None:
    if pin is None:
        return None
    if pin["source"] == "vault":
        return ServerCertificatePin(
            "vault", secret=SecretRef(pin["secret"], pin.get("field", DEFAULT_PIN_FIELD))
        )
    return ServerCertificatePin(
        "file", path=render_path_template(pin["path"], variables, f"{path}.path")
    )
