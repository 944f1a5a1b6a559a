"""The framework's configuration rules a JSON Schema cannot say, each issue naming its JSON path.

The schema owns shape (types, ranges, enums, required keys, patterns); this module owns the
rest: rules across keys or sections (identity against the hierarchy, distinct probe paths,
port 0 only for the embedded broker), rules on a value's meaning (a %-style format that
`logging` accepts, a size above zero, a finite interval) and the `$secret` rules.
`configuration_issues` runs them all on a document; `validate_document` runs it after the
schema. `SECTION_RULES` holds the ones of the sections that also check themselves when
built in code (`HealthConfig`, `LoggingConfig`, `MetricEmissionConfig`).

Every function tolerates a malformed document (the schema reports the shape); messages are
built from the rule, never from the offending value.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from unskit.config._paths import json_path
from unskit.config.messaging import DEFAULT_RECONNECT_MAX_DELAY_SECONDS, parse_endpoint
from unskit.config.platform import Platform
from unskit.config.secrets import FIELD_KEY, SECRET_KEY, find_secret_refs, secret_objects
from unskit.config.values import (
    DEFAULT_HEALTH_PORT,
    DEFAULT_LEVELS,
    DEFAULT_LIVENESS_PATH,
    DEFAULT_READINESS_PATH,
    DEFAULT_SCRAPE_PORT,
    DEFAULT_STARTUP_PATH,
    EMBEDDED_HOST,
    JSON_FORMAT,
    parse_size,
)
from unskit.errors import ConfigIssue

__all__ = [
    "SECTION_RULES",
    "configuration_issues",
    "directory_problem",
    "health_issues",
    "logging_issues",
    "messaging_issues",
    "metric_emission_issues",
]

_LEVEL = re.compile(r"^[A-Za-z0-9_-]+$")
_PROBE_PATHS = {
    "livenessPath": DEFAULT_LIVENESS_PATH,
    "readinessPath": DEFAULT_READINESS_PATH,
    "startupPath": DEFAULT_STARTUP_PATH,
}


def configuration_issues(
    document: Mapping[str, Any], platform: Platform = Platform.HOST
) -> list[ConfigIssue]:
    """Every framework rule the schema cannot say that `document` breaks."""
    issues: list[ConfigIssue] = []
    levels = _levels(document)
    if levels is not None:
        issues += _identity_issues(document.get("identity"), levels)
        issues += _tag_issues(document.get("tags"), levels)
        issues += _topic_issues(document.get("topic"), levels)
    issues += messaging_issues(document.get("messaging"), platform)
    for name, rules in SECTION_RULES.items():
        issues += rules(document.get(name))
    issues += _metric_destination_issues(document)
    issues += _port_clash_issues(document, platform)
    issues += _location_issues(document)
    issues += _secret_issues(document)
    return issues


def _block(document: Mapping[str, Any], *names: str) -> Mapping[str, Any]:
    """The object at `names`, or {} where the document has none (or the schema's fault)."""
    block: object = document
    for name in names:
        block = block.get(name) if isinstance(block, Mapping) else None
    return block if isinstance(block, Mapping) else {}


def _metric_destination_issues(document: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    metrics = _block(document, "metricEmission")
    if metrics.get("enabled", True) is False or metrics.get("target") != "messaging":
        return
    destination = _block(metrics, "targetConfig").get("destination")
    if destination == "cloud" and not _block(document, "messaging", "northbound"):
        yield ConfigIssue(
            json_path(("metricEmission", "targetConfig", "destination")),
            'is "cloud", which publishes on messaging.northbound, and there is none: '
            'configure messaging.northbound or use "local"',
        )


def _port_clash_issues(document: Mapping[str, Any], platform: Platform) -> Iterator[ConfigIssue]:
    """The scrape endpoint and the probe server cannot share a port (both bind any address)."""
    metrics = _block(document, "metricEmission")
    if metrics.get("enabled", True) is False or metrics.get("target") != "scrape":
        return
    health = _block(document, "health")
    enabled = health.get("enabled")
    if not (enabled if isinstance(enabled, bool) else platform is Platform.CLUSTER):
        return
    scrape_port = _block(metrics, "targetConfig").get("port", DEFAULT_SCRAPE_PORT)
    health_port = health.get("port", DEFAULT_HEALTH_PORT)
    # Port 0 is any free port: two of them never clash.
    if isinstance(scrape_port, int) and scrape_port != 0 and scrape_port == health_port:
        yield ConfigIssue(
            json_path(("metricEmission", "targetConfig", "port")),
            f"must differ from health.port (both are {scrape_port}): the scrape endpoint and "
            "the probe server each bind their own port",
        )


def _location_issues(document: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    """A directory the component creates or a file it opens, where a file is in the way."""
    state_dir = _block(document, "commands").get("stateDir")
    if isinstance(state_dir, str) and (problem := directory_problem(state_dir)):
        yield ConfigIssue(json_path(("commands", "stateDir")), f"cannot be a directory: {problem}")
    files = _block(document, "logging", "fileLogging")
    file_path = files.get("filePath")
    if files.get("enabled") is True and isinstance(file_path, str):
        at = json_path(("logging", "fileLogging", "filePath"))
        if os.path.isdir(file_path):
            yield ConfigIssue(at, "cannot be opened: it is a directory; name the log file")
        elif problem := directory_problem(os.path.dirname(os.path.abspath(file_path))):
            yield ConfigIssue(at, f"cannot be opened: its folder cannot be made ({problem})")


def directory_problem(path: str) -> str | None:
    """Why `path` cannot be (or become) a directory, when a file is in the way; else None.

    Only what the file system already shows: a directory that does not exist yet is
    created at start, and whether it can be is found there."""
    current = os.path.abspath(path)
    while True:
        if os.path.exists(current):
            return None if os.path.isdir(current) else f"{current} is a file"
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _levels(document: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The hierarchy levels, or None when the hierarchy is itself broken (already reported)."""
    hierarchy = document.get("hierarchy")
    if hierarchy is None:
        return DEFAULT_LEVELS
    if not isinstance(hierarchy, Mapping):
        return None
    levels = hierarchy.get("levels", DEFAULT_LEVELS)
    if (
        not isinstance(levels, (list, tuple))
        or not levels
        or not all(isinstance(level, str) and _LEVEL.match(level) for level in levels)
        or len(set(levels)) != len(levels)
    ):
        return None
    return tuple(levels)


def _identity_issues(identity: object, levels: tuple[str, ...]) -> Iterator[ConfigIssue]:
    section = identity if isinstance(identity, Mapping) else {}
    device = levels[-1]
    for key in section:
        if key == device:
            yield ConfigIssue(
                json_path(("identity", key)),
                "is the last hierarchy level, the device: its value is the thing name "
                "(-t/--thing), never configured in identity",
            )
        elif key not in levels:
            yield ConfigIssue(
                json_path(("identity", key)),
                f"is not a declared hierarchy level (levels: {', '.join(levels)})",
            )
    if identity is not None and not isinstance(identity, Mapping):
        return
    for level in levels[:-1]:
        if level not in section:
            yield ConfigIssue(
                json_path(("identity", level)),
                f"is required: every hierarchy level except the last ({device!r}) needs a value",
            )


def _tag_issues(tags: object, levels: tuple[str, ...]) -> Iterator[ConfigIssue]:
    if not isinstance(tags, Mapping):
        return
    for key in tags:
        if key in levels:
            yield ConfigIssue(
                json_path(("tags", key)),
                f"is a hierarchy level: location keys belong in identity, not tags "
                f"(levels: {', '.join(levels)})",
            )


def _topic_issues(topic: object, levels: tuple[str, ...]) -> Iterator[ConfigIssue]:
    if isinstance(topic, Mapping) and topic.get("includeRoot") is True and len(levels) < 2:
        yield ConfigIssue(
            json_path(("topic", "includeRoot")),
            "needs a hierarchy of at least two levels: the first hierarchy value is inserted "
            "after the root, and with one level that value is the device itself",
        )


def messaging_issues(
    messaging: object, platform: Platform = Platform.HOST
) -> Iterator[ConfigIssue]:
    """The ``messaging`` rules: a local link on every platform (on the edge runtime its IPC
    bus when none is given), an IPC link without MQTT settings, port 0 only when embedded,
    no TLS with the embedded broker, a northbound broker that is never the embedded one, a
    reconnect backoff whose first delay is at most its longest; a northbound link over the
    runtime's cloud MQTT proxy without broker settings."""
    if messaging is not None and not isinstance(messaging, Mapping):
        return
    section = messaging or {}
    local = section.get("local")
    if local is None and platform is not Platform.EDGE_RUNTIME:
        yield ConfigIssue(
            json_path(("messaging", "local")),
            'is required: give the local broker as {"host": ..., "port": ...}, or '
            '{"host": "embedded"} to start the in-process broker (only on the edge runtime '
            'is the default the IPC bus; elsewhere {"type": "ipc"} selects it)',
        )
    ipc = isinstance(local, Mapping) and local.get("type") == "ipc"
    if ipc:
        assert isinstance(local, Mapping)
        yield from _ipc_issues(local)
        local = None  # the MQTT rules below are not for it
    if isinstance(local, Mapping) and local.get("port") == 0 and local.get("host") != EMBEDDED_HOST:
        yield ConfigIssue(
            json_path(("messaging", "local", "port")),
            'must be >= 1: port 0 (any free port) is allowed only with "host": "embedded"',
        )
    if isinstance(local, Mapping) and local.get("host") == EMBEDDED_HOST:
        credentials = local.get("credentials")
        if isinstance(credentials, Mapping) and "caPath" in credentials:
            # The in-process broker listens in plaintext: a TLS handshake with it never ends.
            yield ConfigIssue(
                json_path(("messaging", "local", "credentials", "caPath")),
                'cannot be used with "host": "embedded": the embedded broker listens in '
                "plaintext on 127.0.0.1, so a TLS connection to it would never succeed",
            )
    northbound = section.get("northbound")
    runtime = isinstance(northbound, Mapping) and northbound.get("type") == "runtime"
    if runtime:
        assert isinstance(northbound, Mapping)
        yield from _runtime_northbound_issues(northbound)
    # The MQTT rules below are only for the links that are MQTT brokers.
    roles = [r for r, skipped in (("local", ipc), ("northbound", runtime)) if not skipped]
    for role in roles:
        block = section.get(role)
        if isinstance(block, Mapping) and isinstance(block.get("endpoints"), list):
            yield from _endpoint_issues(block, role)
        if isinstance(block, Mapping):
            yield from _host_issues(block, role)
            yield from _reconnect_issues(block.get("reconnect"), role)
    if isinstance(northbound, Mapping) and not runtime:
        if EMBEDDED_HOST in (northbound.get("host"), northbound.get("endpoint")):
            yield ConfigIssue(
                json_path(("messaging", "northbound", "host")),
                'cannot be "embedded": the northbound broker is a remote broker',
            )
        if northbound.get("port") == 0:
            yield ConfigIssue(json_path(("messaging", "northbound", "port")), "must be >= 1")


#: The keys of an IPC local link; the others (host, port, credentials, ...) are MQTT's.
IPC_KEYS = frozenset(
    {"type", "receiveOwnMessages", "qos", "reconnect", "publishDegradedAfterSeconds"}
)


def _ipc_issues(local: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    """An IPC link takes no MQTT settings (the nucleus's socket and token come from the
    runtime) and no QoS 2 (the bus has none)."""
    for key in local:
        if key not in IPC_KEYS:
            yield ConfigIssue(
                json_path(("messaging", "local", key)),
                'is an MQTT setting and cannot be used with "type": "ipc" (the edge '
                "runtime's IPC bus takes only " + ", ".join(sorted(IPC_KEYS)) + ")",
            )
    qos = local.get("qos")
    if isinstance(qos, Mapping):
        for key in ("publish", "subscribe"):
            if qos.get(key) == 2:
                yield ConfigIssue(
                    json_path(("messaging", "local", "qos", key)),
                    "must be 0 or 1: the edge runtime's IPC bus has no QoS 2",
                )
    yield from _reconnect_issues(local.get("reconnect"), "local")


#: The keys of a northbound link over the edge runtime's cloud MQTT proxy.
RUNTIME_NORTHBOUND_KEYS = frozenset(
    {"type", "qos", "reconnect", "publishDegradedAfterSeconds", "storeAndForward"}
)


def _runtime_northbound_issues(northbound: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    """A northbound link over the runtime's proxy takes no broker settings (the nucleus
    connects to its own cloud endpoint with the device's certificate) and no QoS 2."""
    for key in northbound:
        if key not in RUNTIME_NORTHBOUND_KEYS:
            yield ConfigIssue(
                json_path(("messaging", "northbound", key)),
                'is an MQTT setting and cannot be used with "type": "runtime" (the edge '
                "runtime's cloud MQTT proxy takes only "
                + ", ".join(sorted(RUNTIME_NORTHBOUND_KEYS))
                + "; the nucleus's own configuration names the cloud endpoint and certificate)",
            )
    qos = northbound.get("qos")
    if isinstance(qos, Mapping):
        for key in ("publish", "subscribe"):
            if qos.get(key) == 2:
                yield ConfigIssue(
                    json_path(("messaging", "northbound", "qos", key)),
                    "must be 0 or 1: the edge runtime's cloud MQTT proxy has no QoS 2",
                )
    yield from _reconnect_issues(northbound.get("reconnect"), "northbound")


def _host_issues(block: Mapping[str, Any], role: str) -> Iterator[ConfigIssue]:
    """`host` and `endpoint` name a host: a URL or a ``host:port`` there would be dialled
    as a host name, and fail on every attempt."""
    for key in ("host", "endpoint"):
        value = block.get(key)
        if not isinstance(value, str):
            continue
        name, colon, port = value.rpartition(":")
        if "://" in value:
            yield ConfigIssue(
                json_path(("messaging", role, key)),
                'is a host name, not a URL: give a URL in "endpoints" (a list of '
                "mqtt://host[:port] or mqtts://host[:port])",
            )
        elif colon and port.isdigit() and ":" not in name:  # an IPv6 address has several
            yield ConfigIssue(
                json_path(("messaging", role, key)),
                'is a host name without a port: give the port in "port"',
            )


def _reconnect_issues(reconnect: object, role: str) -> Iterator[ConfigIssue]:
    """A reconnect block's first delay is at most its longest (the schema bounds each)."""
    if not isinstance(reconnect, Mapping):
        return
    initial = reconnect.get("initialDelaySeconds")
    most = reconnect.get("maxDelaySeconds", DEFAULT_RECONNECT_MAX_DELAY_SECONDS)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (initial, most))
    if numbers and initial > most:
        given = "maxDelaySeconds"
        if "maxDelaySeconds" not in reconnect:
            given += f" (default {DEFAULT_RECONNECT_MAX_DELAY_SECONDS:g})"
        yield ConfigIssue(
            json_path(("messaging", role, "reconnect", "initialDelaySeconds")),
            f"must be at most {given}: the backoff starts at the first delay and grows to "
            "the longest",
        )


def _endpoint_issues(block: Mapping[str, Any], role: str) -> Iterator[ConfigIssue]:
    """An endpoint list: each a valid URL, none twice, one scheme for all, and that scheme
    agreeing with credentials.caPath (TLS is never half on, nor silently off)."""
    seen: dict[tuple[str, int], int] = {}
    schemes: set[bool] = set()
    has_ca = isinstance(block.get("credentials"), Mapping) and "caPath" in block["credentials"]
    for index, text in enumerate(block["endpoints"]):
        path = json_path(("messaging", role, "endpoints", index))
        if not isinstance(text, str):
            continue  # the schema names it
        try:
            endpoint = parse_endpoint(text)
        except ValueError as error:
            yield ConfigIssue(path, str(error))
            continue
        if endpoint.host == EMBEDDED_HOST:
            yield ConfigIssue(path, 'the embedded broker is "host": "embedded", not a list')
        address = (endpoint.host.lower(), endpoint.port)
        if address in seen:
            yield ConfigIssue(path, f"repeats endpoints[{seen[address]}] ({endpoint})")
        seen.setdefault(address, index)
        schemes.add(endpoint.tls)
        if endpoint.tls and not has_ca:
            yield ConfigIssue(path, "mqtts:// needs credentials.caPath to verify the broker")
        elif not endpoint.tls and has_ca:
            yield ConfigIssue(
                path, "mqtt:// is plaintext, but credentials.caPath asks for TLS: use mqtts://"
            )
    if len(schemes) > 1:
        yield ConfigIssue(
            json_path(("messaging", role, "endpoints")),
            "mixes mqtt:// and mqtts://: a failover must not change the link's security",
        )


def health_issues(health: object) -> Iterator[ConfigIssue]:
    """The ``health`` rule: the three probe paths differ."""
    if not isinstance(health, Mapping):
        return
    # Two probes on one path would leave one of them unreachable.
    seen: dict[str, str] = {}
    for key, default in _PROBE_PATHS.items():
        path = health.get(key, default)
        if not isinstance(path, str):
            continue
        if path in seen:
            yield ConfigIssue(
                json_path(("health", key)), f"must differ from {seen[path]} (both are {path})"
            )
        else:
            seen[path] = key


def logging_issues(section: object) -> Iterator[ConfigIssue]:
    """The ``logging`` rules: a format the standard library accepts, a size above zero."""
    if not isinstance(section, Mapping):
        return
    text = section.get("python_format")
    if isinstance(text, str) and text.strip().lower() != JSON_FORMAT:
        try:
            formatter = logging.Formatter(text, validate=True)
        except ValueError:
            yield ConfigIssue(
                json_path(("logging", "python_format")),
                'must be a %-style logging format such as "%(asctime)s %(message)s", or "json"',
            )
        else:
            # The shape check passes %(nosuchfield)s and %(message)d; formatting a record
            # finds them here rather than as a "--- Logging error ---" on every line.
            try:
                probe = logging.LogRecord("unskit", logging.INFO, __file__, 1, "probe", (), None)
                formatter.format(probe)
            except (KeyError, ValueError, TypeError):
                yield ConfigIssue(
                    json_path(("logging", "python_format")),
                    "cannot format a log record: name only fields every record has "
                    "(asctime, levelname, name, message, thread, ...) with a conversion "
                    "that fits them",
                )
    files = section.get("fileLogging")
    size = files.get("maxFileSize") if isinstance(files, Mapping) else None
    if isinstance(size, str):
        try:
            too_small = parse_size(size) <= 0
        except ValueError:
            too_small = False  # the schema's pattern reports the shape
        if too_small:
            # RotatingFileHandler never rotates at 0, which would make the limit a no-op.
            yield ConfigIssue(
                json_path(("logging", "fileLogging", "maxFileSize")),
                "must be greater than zero (a file never rotates at 0)",
            )


def metric_emission_issues(section: object) -> Iterator[ConfigIssue]:
    """The ``metricEmission`` rule: a finite interval."""
    if not isinstance(section, Mapping):
        return
    interval = section.get("intervalSeconds")
    # NaN and infinity (which JSON and YAML parsers here read) pass every JSON Schema bound.
    if isinstance(interval, float) and not math.isfinite(interval):
        yield ConfigIssue(
            json_path(("metricEmission", "intervalSeconds")), "must be a finite number > 0"
        )


#: Section name -> its rules; a section built in code runs these after its schema.
SECTION_RULES: Mapping[str, Callable[[object], Iterator[ConfigIssue]]] = {
    "health": health_issues,
    "logging": logging_issues,
    "metricEmission": metric_emission_issues,
}


def _secret_issues(document: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    for parts, obj in secret_objects(document):
        extra = sorted(set(obj) - {SECRET_KEY, FIELD_KEY})
        for key in extra:
            yield ConfigIssue(
                json_path((*parts, key)),
                f'unknown key in a $secret reference (allowed: "{SECRET_KEY}", "{FIELD_KEY}")',
            )
        name = obj[SECRET_KEY]
        if not isinstance(name, str) or not name:
            yield ConfigIssue(
                json_path((*parts, SECRET_KEY)), "must be a non-empty string: the vault secret name"
            )
        if FIELD_KEY in obj and (not isinstance(obj[FIELD_KEY], str) or not obj[FIELD_KEY]):
            yield ConfigIssue(
                json_path((*parts, FIELD_KEY)), "must be a non-empty string: a field of the secret"
            )
    if document.get("credentials") is None:
        for path, _ in find_secret_refs(document):
            yield ConfigIssue(
                path,
                "is a $secret reference, which needs the credentials section "
                "(the encrypted vault it resolves from)",
            )
