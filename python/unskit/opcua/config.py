"""The opcua-adapter's `component` section, parsed into southbound instances.

The shapes (`settings.py`) are the contract between the parser, the security module and the
driver; the driver reads an instance's `OpcUaSettings` with `opcua_settings(spec)`. As in the CIP
adapter, the document-level schema checks `component.global` and that `instances` is a
non-empty array; each entry is then checked on its own (its schema, then the rules a schema
cannot say, in `rules.py`), so one malformed entry is skipped with its JSON path while the
others run. This module parses the section and builds each valid entry; it re-exports the
shapes."""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from unskit.config.model import ComponentConfig, thaw
from unskit.config.schema import definition_schema, load_schema, validate_with_schema
from unskit.config.secrets import SecretRef
from unskit.config.templates import path_template_variables, render_path_template
from unskit.errors import ConfigIssue
from unskit.opcua.rules import _rules
from unskit.opcua.settings import (
    DEFAULT_PKI_DIR,
    MESSAGE_MODES,
    SECURITY_POLICIES,
    ClientCertificate,
    DataChangeDeadband,
    OpcUaConnection,
    OpcUaSettings,
    Pkcs11Key,
    ServerCertificatePin,
    SignalMatcher,
    SubscriptionSpec,
    TrustSettings,
    UserToken,
)
from unskit.southbound.component import Candidate, parse_instances
from unskit.southbound.driver import InstanceSpec, Timing, parse_timing

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


# -- parsing: the `component` section into InstanceSpecs ------------------------------------

_log = logging.getLogger(__name__)

SCHEMA_FILE = "opcua-adapter.schema.json"
DEFAULT_ADAPTER = "opcua"
#: The vault field a pinned server certificate is read from unless `field` says otherwise.
DEFAULT_PIN_FIELD = "caPem"
#: Built-in values, the last step of the precedence matcher > instance > global.
BUILTIN_PUBLISH_INTERVAL_MS = 1000
BUILTIN_SAMPLING_RATE_MS = 0
BUILTIN_QUEUE_SIZE = 100
STALE_SIGNAL_SECS = 30


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
    return parse_instances(
        component.get("instances") or [],
        lambda entry, index: _instance_issues(entry, index, config),
        lambda entry, path: _instance(entry, global_defaults, timing, path, config),
    )


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
