"""The rules of one opcua-adapter instance entry that its JSON Schema cannot say, checked on a
schema-valid entry: the asyncua extra installed, the endpoint's port, what a security policy
needs and what only a secure one uses, one sourcing style per credential (inline, vault, file,
pkcs11) and the credentials section a vault source needs, every path template renderable,
subscription ids unique, matchers' regular expressions and Percent deadbands. Each problem is
a `ConfigIssue` naming its JSON path."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from unskit.config.model import ComponentConfig
from unskit.config.templates import path_template_variables, render_path_template
from unskit.errors import ConfigError, ConfigIssue, extra_installed, missing_extra
from unskit.opcua.settings import DEFAULT_PKI_DIR, SECURITY_POLICIES

_MAX_PORT = 65535
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


def _rules(entry: Mapping[str, Any], path: str, config: ComponentConfig) -> Iterator[ConfigIssue]:
    if not extra_installed("asyncua"):
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
