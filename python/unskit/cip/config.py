"""The ethernet-ip-adapter's `component` section, parsed into southbound instances.

The document-level schema checks `component.global` and that `instances` is a non-empty
array; each instance entry is then checked on its own (its schema, then the rules a schema
cannot say), so one malformed entry is skipped with its JSON path while the others run."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from unskit.config.model import ComponentConfig, thaw
from unskit.config.schema import definition_schema, load_schema, validate_with_schema
from unskit.elementary_types import field_bytes
from unskit.errors import ConfigIssue
from unskit.southbound.component import Candidate, parse_instances
from unskit.southbound.driver import (
    Deadband,
    InstanceSpec,
    PollGroupSpec,
    PublishMode,
    SignalSpec,
    Timing,
    parse_timing,
)

__all__ = [
    "CIP_PORT",
    "CIP_TLS_PORT",
    "TOKEN",
    "CipConnection",
    "PushSettings",
    "component_schema",
    "parse_component",
    "push_settings",
    "run_signal_id",
    "security_mode",
]

_log = logging.getLogger(__name__)

TOKEN = "ethernet-ip-adapter"
CIP_PORT = 44818
CIP_TLS_PORT = 2221
SCHEMA_FILE = "ethernet-ip-adapter.schema.json"
#: pycomm3 refuses port 65535 when it parses the path (`port >= 65535`), so it is not usable.
_MAX_PORT = 65534

#: The class-1 UDP socket of the component (global.implicitIo): port and bind address.
IMPLICIT_IO_PORT = 2222
IMPLICIT_IO_BIND = "0.0.0.0"
#: Where multicast T-to-O groups are joined: 0.0.0.0 lets the kernel pick by route.
IMPLICIT_IO_MULTICAST_INTERFACE = "0.0.0.0"

#: Built-in values, the last step of the precedence signal > group > device > global.
BUILTIN_POLL_INTERVAL_MS = 5000
BUILTIN_PUBLISH_MODE = "onChange"
BUILTIN_BATCH_MS = 0

#: Credential styles: each credential is sourced by exactly one of these key sets.
_CLIENT_STYLES = {
    "vault": ("certSecret",),
    "file": ("certFile", "keyFile"),
    "inline": ("cert", "key"),
}
_CA_STYLES = ("secret", "file", "cert", "trustStore", "list")


@functools.cache
def component_schema() -> Mapping[str, Any]:
    """The `component` section's JSON Schema (a data file shipped with the package)."""
    return load_schema(SCHEMA_FILE)


@functools.cache
def _instance_schema() -> Mapping[str, Any]:
    return definition_schema(component_schema(), "instance")


@dataclass(frozen=True)
class CipConnection:
    """Where and how a poll instance reaches its PLC (the driver reads this from extra)."""

    host: str
    port: int
    slot: int | None
    connected: bool

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class PushSettings:
    """A push instance's `io` with its publication defaults and the component's UDP socket."""

    io: Mapping[str, Any]
    publish_mode: str
    batch_ms: int
    udp_port: int
    bind_address: str
    multicast_interface: str


def parse_component(config: ComponentConfig) -> Candidate:
    """Every valid instance (precedence resolved) and every skipped one with its reason."""
    component = thaw(config.component)
    global_section = component.get("global") or {}
    timing = parse_timing(
        global_section, thresholds_key="thresholds", stale_signal_secs=Timing().stale_signal_secs
    )
    global_defaults = global_section.get("defaults") or {}
    implicit_io = global_section.get("implicitIo") or {}
    return parse_instances(
        component.get("instances") or [],
        _instance_issues,
        lambda entry, path: _instance(entry, global_defaults, timing, path, implicit_io),
    )


def _instance_issues(entry: object, index: int) -> list[ConfigIssue]:
    """Schema issues of one entry, then the cross-key rules (only on a schema-valid entry)."""
    issues = validate_with_schema(entry, _instance_schema(), ("component", "instances", index))
    if issues or not isinstance(entry, Mapping):
        return issues
    return list(_rules(entry, f"$.component.instances[{index}]"))


def _rules(entry: Mapping[str, Any], path: str) -> Iterator[ConfigIssue]:
    mode = entry.get("mode", "poll")
    if mode == "poll":
        if "pollGroups" not in entry:
            yield ConfigIssue(f"{path}.pollGroups", "a poll instance requires pollGroups")
        if "io" in entry:
            yield ConfigIssue(f"{path}.io", "a poll instance must not have io (push mode only)")
    else:
        if "io" not in entry:
            yield ConfigIssue(f"{path}.io", "a push instance requires io")
        if entry.get("adapter", "ethernet-ip") != "ethernet-ip":
            yield ConfigIssue(f"{path}.adapter", "push mode runs on the ethernet-ip adapter only")
        if "pollGroups" in entry:
            yield ConfigIssue(f"{path}.pollGroups", "a push instance must not have pollGroups")
    port = _connection(entry["connection"]).port
    if not 0 < port <= _MAX_PORT:
        yield ConfigIssue(f"{path}.connection.endpoint", f"port {port} is not in 1..{_MAX_PORT}")
    security = entry["connection"].get("security") or {}
    if mode == "push" and security.get("mode") == "tls":
        yield ConfigIssue(
            f"{path}.connection.security.mode", "push mode runs on plaintext UDP only, not tls"
        )
    yield from _security_rules(security, f"{path}.connection.security")
    signal_ids: set[str] = set()
    names: set[str] = set()
    for g, group in enumerate(entry.get("pollGroups") or []):
        for s, signal in enumerate(group["signals"]):
            at = f"{path}.pollGroups[{g}].signals[{s}]"
            yield from _unique(signal["name"], names, f"{at}.name", "signal name")
            yield from _unique(signal["tagPath"], signal_ids, f"{at}.tagPath", "tagPath")
            yield from _numeric_only(signal, at, ("scale", "offset", "deadband"))
    io = entry.get("io")
    if io is not None:
        yield from _io_rules(io, f"{path}.io", names, signal_ids)
        if (io.get("output") or {}).get("realTimeFormat", "header32") == "header32":
            signal_ids.add(run_signal_id(io["assemblies"]["output"]))
    inputs = set()
    if io is not None:
        instance = io["assemblies"]["input"]
        inputs = {assembly_signal_id(instance, field) for field in io["input"]["signals"]}
    for a, allowed in enumerate((entry.get("writes") or {}).get("allow", [])):
        if allowed in inputs:
            yield ConfigIssue(
                f"{path}.writes.allow[{a}]",
                f"{allowed!r} is an input (T-to-O) field: only output fields are writable",
            )
        elif allowed not in signal_ids:
            yield ConfigIssue(
                f"{path}.writes.allow[{a}]", f"{allowed!r} is not a signal id of this instance"
            )


def _unique(value: str, seen: set[str], path: str, what: str) -> Iterator[ConfigIssue]:
    if value in seen:
        yield ConfigIssue(path, f"duplicate {what} {value!r}: it must be unique per device")
    seen.add(value)


def _numeric_only(field: Mapping[str, Any], path: str, keys: tuple[str, ...]) -> Iterator[Any]:
    if field["type"] == "BOOL":
        for key in keys:
            if key in field:
                yield ConfigIssue(f"{path}.{key}", "applies to numeric types only, not BOOL")


def _io_rules(
    io: Mapping[str, Any], path: str, names: set[str], signal_ids: set[str]
) -> Iterator[ConfigIssue]:
    for direction in ("input", "output"):
        block = io.get(direction)
        if block is None:
            continue
        size = block.get("sizeBytes", 0)
        instance = io["assemblies"][direction]
        fields = block.get("signals") or []
        if direction == "output" and size == 0 and fields:
            yield ConfigIssue(f"{path}.output.signals", "a heartbeat output (sizeBytes 0) has none")
        for f, field in enumerate(fields):
            at = f"{path}.{direction}.signals[{f}]"
            yield from _unique(field["name"], names, f"{at}.name", "signal name")
            yield from _numeric_only(field, at, ("scale", "valueOffset", "deadband"))
            if "bit" in field and (field["type"] != "BOOL" or "arrayCount" in field):
                yield ConfigIssue(f"{at}.bit", "bit applies to a single BOOL only")
            end = field["offset"] + _field_bytes(field)
            if end > size:
                yield ConfigIssue(
                    f"{at}.offset", f"the field ends at byte {end}, outside sizeBytes {size}"
                )
            signal_ids.add(assembly_signal_id(instance, field))


def _field_bytes(field: Mapping[str, Any]) -> int:
    count = field.get("arrayCount")
    return field_bytes(field["type"], None if count is None else int(count), bit="bit" in field)


def assembly_signal_id(instance: int, field: Mapping[str, Any]) -> str:
    """The stable id of an assembly field: ``a<instance>/<offset>/<type>[.<bit>]``."""
    bit = f".{field['bit']}" if "bit" in field else ""
    return f"a{instance}/{field['offset']}/{field['type']}{bit}"


def run_signal_id(output_instance: int) -> str:
    """The writable pseudo-field that switches a header32 O-to-T connection's run/idle bit."""
    return f"a{output_instance}/run"


def _security_rules(security: Mapping[str, Any], path: str) -> Iterator[ConfigIssue]:
    client = security.get("client") or {}
    client_styles = [
        style for style, keys in _CLIENT_STYLES.items() if any(key in client for key in keys)
    ]
    if len(client_styles) > 1:
        yield ConfigIssue(
            f"{path}.client",
            f"the client identity mixes sourcing styles ({', '.join(client_styles)}): use one",
        )
    for style in ("file", "inline"):
        keys = _CLIENT_STYLES[style]
        if style in client_styles and not all(key in client for key in keys):
            yield ConfigIssue(f"{path}.client", f"{' and '.join(keys)} go together")
    ca = security.get("ca") or {}
    ca_styles = [key for key in _CA_STYLES if key in ca]
    if len(ca_styles) > 1:
        yield ConfigIssue(
            f"{path}.ca", f"the CA mixes sourcing styles ({', '.join(ca_styles)}): use one"
        )
    if security.get("mode") == "tls":
        if not client_styles:
            yield ConfigIssue(f"{path}.client", "tls requires a client identity")
        bundle_ca = "certSecret" in client  # a certSecret bundle may carry caPem
        if security.get("verifyPeer", True) and not ca_styles and not bundle_ca:
            yield ConfigIssue(f"{path}.ca", "tls with verifyPeer requires trust anchors")
    suites = security.get("cipherSuites")
    if suites is not None:
        yield from _suite_rules(suites, f"{path}.cipherSuites")
    est = security.get("est") or {}
    if est.get("enabled") and client_styles != ["vault"] and "into" not in est:
        # Only a certSecret bundle is a destination EST can rewrite as a whole.
        yield ConfigIssue(
            f"{path}.est.into",
            "a client identity that is not a client.certSecret bundle (files, inline "
            "$secret or none) needs an explicit into destination",
        )


def _suite_rules(suites: list[str], path: str) -> Iterator[ConfigIssue]:
    if not suites:
        yield ConfigIssue(path, "an empty allow-list allows no cipher suite")
        return
    from unskit.pki.tls import cipher_suite_names  # the Rust core's suite table

    known = cipher_suite_names()
    for index, name in enumerate(suites):
        if name.strip().upper() not in known:
            yield ConfigIssue(
                f"{path}[{index}]",
                f"{name!r} is not an available suite: only AEAD suites (TLS 1.3, TLS 1.2 "
                "ECDHE with AES-GCM or ChaCha20-Poly1305), by IANA or rustls name",
            )


def _instance(
    entry: Mapping[str, Any],
    global_defaults: Mapping[str, Any],
    timing: Timing,
    path: str,
    implicit_io: Mapping[str, Any],
) -> InstanceSpec:
    device_defaults = entry.get("defaults") or {}
    connection = _connection(entry["connection"])
    unavailable = None

    def resolved(key: str, builtin: Any, *layers: Mapping[str, Any]) -> Any:
        for layer in (*layers, device_defaults, global_defaults):
            if key in layer:
                return layer[key]
        return builtin

    groups: list[PollGroupSpec] = []
    for g, group in enumerate(entry.get("pollGroups") or []):
        interval = resolved("pollIntervalMs", BUILTIN_POLL_INTERVAL_MS, group)
        signals = [
            SignalSpec(
                id=signal["tagPath"],
                name=signal["name"],
                type=signal["type"],
                array_count=signal.get("arrayCount"),
                scale=signal.get("scale"),
                offset=signal.get("offset"),
                deadband=Deadband(**(signal.get("deadband") or {})),
                publish_mode=PublishMode(
                    resolved("publishMode", BUILTIN_PUBLISH_MODE, signal, group)
                ),
                batch_ms=resolved("batchMs", BUILTIN_BATCH_MS, signal, group),
            )
            for signal in group["signals"]
        ]
        for signal in signals:
            if signal.type == "BOOL" and signal.array_count is not None:
                _log.warning(
                    "instance %s: BOOL array %s is experimental (packed replies are unpacked "
                    "to %d booleans)",
                    entry["id"],
                    signal.id,
                    signal.array_count,
                )
        groups.append(PollGroupSpec(group.get("id", f"group-{g + 1}"), interval, signals))
    push = None
    if "io" in entry:
        push = PushSettings(
            io=entry["io"],
            publish_mode=resolved("publishMode", BUILTIN_PUBLISH_MODE),
            batch_ms=resolved("batchMs", BUILTIN_BATCH_MS),
            udp_port=implicit_io.get("udpPort", IMPLICIT_IO_PORT),
            bind_address=implicit_io.get("bindAddress", IMPLICIT_IO_BIND),
            multicast_interface=implicit_io.get(
                "multicastInterface", IMPLICIT_IO_MULTICAST_INTERFACE
            ),
        )
    return InstanceSpec(
        id=entry["id"],
        adapter=entry.get("adapter", "ethernet-ip"),
        endpoint=connection.endpoint,
        poll_groups=groups,
        writes_allow=frozenset((entry.get("writes") or {}).get("allow", [])),
        timing=timing,
        entry=entry,
        unavailable=unavailable,
        settings=push,
    )


def push_settings(spec: InstanceSpec) -> PushSettings:
    """The push-mode settings `parse_component` put on a push instance."""
    if not isinstance(spec.settings, PushSettings):
        raise TypeError(f"instance {spec.id} is not a push instance")
    return spec.settings


def security_mode(entry: Mapping[str, Any]) -> str:
    """The instance's connection.security.mode: plaintext (the default) or tls."""
    security = entry["connection"].get("security") or {}
    return str(security.get("mode", "plaintext"))


def _connection(connection: Mapping[str, Any]) -> CipConnection:
    endpoint: str = connection["endpoint"]
    port = CIP_TLS_PORT if security_mode({"connection": connection}) == "tls" else CIP_PORT
    host = endpoint
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif ":" in endpoint:
        host, _, text = endpoint.rpartition(":")
        port = int(text)
    return CipConnection(host, port, connection.get("slot"), bool(connection.get("connected")))


def cip_connection(spec: InstanceSpec) -> CipConnection:
    """The connection settings of a parsed instance."""
    return _connection(spec.entry["connection"])
