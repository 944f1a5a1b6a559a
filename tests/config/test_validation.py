"""Every schema and cross-section rule: a bad document names the JSON path and the rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from unskit.config import Platform, load_schema, parse_document, resolve_config, validate_document
from unskit.errors import ConfigError, ConfigIssue

from .documents import DELETE, THING, TOKEN, base_document, patched

SECRET = {"$secret": "broker-login", "field": "password"}
VAULT = {"vaultPath": "/var/lib/unskit/vault.json", "keyFile": "/etc/unskit/vault.key"}


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _issues(document: Any, platform: Platform = Platform.HOST) -> list[ConfigIssue]:
    try:
        if isinstance(document, str):
            name = "config.yaml" if document.startswith("#yaml") else "config.json"
            document = parse_document(document, name)
        resolve_config(document, thing=THING, platform=platform, default_component=TOKEN)
    except ConfigError as exc:
        return list(exc.issues)
    pytest.fail("the document was accepted")


# (document or JSON text, platform, expected path, words the message must contain)
BAD: list[tuple[str, Any, Platform, str, tuple[str, ...]]] = [
    (
        "malformed-json",
        '{"component": {}, "tags": {"a": "b",}}',
        Platform.HOST,
        "$",
        ("malformed JSON", "line 1"),
    ),
    ("duplicate-key", '{"component": {}, "component": {}}', Platform.HOST, "$", ("appears twice",)),
    ("malformed-yaml", "#yaml\ncomponent: [unclosed\n", Platform.HOST, "$", ("malformed YAML",)),
    ("not-an-object", "[1, 2]", Platform.HOST, "$", ("must be an object",)),
    ("unknown-top-level-key", patched({"loging": {}}), Platform.HOST, "$.loging", ("unknown key",)),
    (
        "unknown-broker-key",
        patched({"messaging": {"local": {"prot": 1}}}),
        Platform.HOST,
        "$.messaging.local.prot",
        ("unknown key", "allowed", "port"),
    ),
    (
        "port-wrong-type",
        patched({"messaging": {"local": {"port": "1883"}}}),
        Platform.HOST,
        "$.messaging.local.port",
        ("must be an integer", "not a string"),
    ),
    (
        "port-out-of-range",
        patched({"messaging": {"local": {"port": 70000}}}),
        Platform.HOST,
        "$.messaging.local.port",
        ("<= 65535",),
    ),
    (
        "port-zero-needs-embedded",
        patched({"messaging": {"local": {"port": 0}}}),
        Platform.HOST,
        "$.messaging.local.port",
        ("embedded",),
    ),
    (
        "host-missing",
        patched({"messaging": {"local": {"host": DELETE}}}),
        Platform.HOST,
        "$.messaging.local",
        ("needs a broker address", '"host" or "endpoints"'),
    ),
    (
        "request-timeout-negative",
        patched({"messaging": {"requestTimeoutSeconds": -1}}),
        Platform.HOST,
        "$.messaging.requestTimeoutSeconds",
        (">= 0",),
    ),
    (
        "qos-publish-too-high",
        patched({"messaging": {"local": {"qos": {"publish": 3}}}}),
        Platform.HOST,
        "$.messaging.local.qos.publish",
        ("<= 2",),
    ),
    (
        "qos-subscribe-negative",
        patched({"messaging": {"local": {"qos": {"subscribe": -1}}}}),
        Platform.HOST,
        "$.messaging.local.qos.subscribe",
        (">= 0",),
    ),
    (
        "qos-unknown-key",
        patched({"messaging": {"local": {"qos": {"both": 1}}}}),
        Platform.HOST,
        "$.messaging.local.qos.both",
        ("unknown key",),
    ),
    (
        "cert-without-key",
        patched({"messaging": {"local": {"credentials": {"certPath": "c"}}}}),
        Platform.HOST,
        "$.messaging.local.credentials.keyPath",
        ("required alongside certPath",),
    ),
    (
        "password-wrong-shape",
        patched({"messaging": {"local": {"credentials": {"password": 7}}}}),
        Platform.HOST,
        "$.messaging.local.credentials.password",
        ("string or a $secret reference",),
    ),
    (
        "messaging-local-missing",
        patched({"messaging": {"local": DELETE}}),
        Platform.HOST,
        "$.messaging.local",
        ('"host"', '"port"', '"embedded"'),
    ),
    (
        "messaging-missing-on-cluster",
        patched({"messaging": DELETE}),
        Platform.CLUSTER,
        "$.messaging.local",
        ('"host"', '"embedded"'),
    ),
    (
        "northbound-without-address",
        patched({"messaging": {"northbound": {"port": 8883}}}),
        Platform.HOST,
        "$.messaging.northbound",
        ("needs a broker address", '"endpoints"'),
    ),
    (
        "northbound-host-and-endpoint",
        patched({"messaging": {"northbound": {"host": "a", "endpoint": "b"}}}),
        Platform.HOST,
        "$.messaging.northbound",
        ("not both",),
    ),
    (
        "store-and-forward-unknown-key",
        patched({"messaging": {"northbound": {"host": "a", "storeAndForward": {"maxMB": 1}}}}),
        Platform.HOST,
        "$.messaging.northbound.storeAndForward.maxMB",
        (),
    ),
    (
        "store-and-forward-overflow",
        patched(
            {"messaging": {"northbound": {"host": "a", "storeAndForward": {"overflow": "drop"}}}}
        ),
        Platform.HOST,
        "$.messaging.northbound.storeAndForward.overflow",
        ("dropOldest", "refuseNewest"),
    ),
    (
        "store-and-forward-max-bytes",
        patched({"messaging": {"northbound": {"host": "a", "storeAndForward": {"maxBytes": 100}}}}),
        Platform.HOST,
        "$.messaging.northbound.storeAndForward.maxBytes",
        ("65536",),
    ),
    (
        "store-and-forward-pace",
        patched(
            {
                "messaging": {
                    "northbound": {"host": "a", "storeAndForward": {"replayMessagesPerSecond": -1}}
                }
            }
        ),
        Platform.HOST,
        "$.messaging.northbound.storeAndForward.replayMessagesPerSecond",
        (),
    ),
    (
        "store-and-forward-in-flight",
        patched(
            {"messaging": {"northbound": {"host": "a", "storeAndForward": {"maxInFlight": 0}}}}
        ),
        Platform.HOST,
        "$.messaging.northbound.storeAndForward.maxInFlight",
        (),
    ),
    (
        "store-and-forward-enabled-type",
        patched(
            {"messaging": {"northbound": {"host": "a", "storeAndForward": {"enabled": "yes"}}}}
        ),
        Platform.HOST,
        "$.messaging.northbound.storeAndForward.enabled",
        (),
    ),
    (
        "store-and-forward-on-local",
        patched({"messaging": {"local": {"storeAndForward": {"enabled": True}}}}),
        Platform.HOST,
        "$.messaging.local.storeAndForward",
        (),
    ),
    (
        "northbound-embedded",
        patched({"messaging": {"northbound": {"host": "embedded"}}}),
        Platform.HOST,
        "$.messaging.northbound.host",
        ("remote broker",),
    ),
    # Spec 1: username/password go only to a plaintext local broker; on the northbound link
    # they were accepted and then never sent.
    *[
        (
            f"northbound-{key}",
            patched({"messaging": {"northbound": {"host": "a", "credentials": {key: "x"}}}}),
            Platform.HOST,
            f"$.messaging.northbound.credentials.{key}",
            ("refused on the northbound link", "plaintext local broker", "caPath"),
        )
        for key in ("username", "password")
    ],
    (
        "embedded-broker-with-tls",
        patched(
            {
                "messaging": {
                    "local": {"host": "embedded", "port": DELETE, "credentials": {"caPath": "c"}}
                }
            }
        ),
        Platform.HOST,
        "$.messaging.local.credentials.caPath",
        ("embedded", "plaintext"),
    ),
    # A URL or host:port where a host name belongs was dialled as a host name, forever.
    *[
        (
            f"{role}-{key}-{name}",
            patched({"messaging": {role: {key: value}}}),
            Platform.HOST,
            f"$.messaging.{role}.{key}",
            words,
        )
        for role, key in [("local", "host"), ("northbound", "host"), ("northbound", "endpoint")]
        for name, value, words in [
            ("url", "mqtts://broker.example:8883", ("not a URL", '"endpoints"')),
            ("with-port", "broker.example:8883", ('"port"',)),
        ]
    ],
    *[
        (
            f"{role}-reconnect-{name}",
            patched({"messaging": {role: {"host": "a", "reconnect": block}}}),
            Platform.HOST,
            f"$.messaging.{role}.reconnect{key}",
            words,
        )
        for role in ("local", "northbound")
        for name, block, key, words in [
            ("initial-zero", {"initialDelaySeconds": 0}, ".initialDelaySeconds", ()),
            ("initial-negative", {"initialDelaySeconds": -1}, ".initialDelaySeconds", ()),
            ("max-zero", {"maxDelaySeconds": 0}, ".maxDelaySeconds", ()),
            ("max-unbounded", {"maxDelaySeconds": 1e12}, ".maxDelaySeconds", ("3600",)),
            (
                "initial-above-max",
                {"initialDelaySeconds": 3, "maxDelaySeconds": 2},
                ".initialDelaySeconds",
                ("at most maxDelaySeconds",),
            ),
            (
                "initial-above-default-max",
                {"initialDelaySeconds": 10},
                ".initialDelaySeconds",
                ("at most maxDelaySeconds (default 4)",),
            ),
            ("unknown-key", {"jitter": False}, ".jitter", ("unknown key",)),
            ("not-an-object", 5, "", ("an object",)),
        ]
    ],
    *[
        (
            f"{role}-publish-degraded-after-{name}",
            patched({"messaging": {role: {"host": "a", "publishDegradedAfterSeconds": value}}}),
            Platform.HOST,
            f"$.messaging.{role}.publishDegradedAfterSeconds",
            (),
        )
        for role in ("local", "northbound")
        for name, value in [("zero", 0), ("unbounded", 1e12), ("text", "30")]
    ],
    (
        "component-missing",
        patched({"component": DELETE}),
        Platform.HOST,
        "$.component",
        ("is required",),
    ),
    (
        "component-not-object",
        patched({"component": [1]}),
        Platform.HOST,
        "$.component",
        ("must be an object",),
    ),
    (
        "component-token-not-a-topic-level",
        patched({"component": {"token": "a/b"}}),
        Platform.HOST,
        "$.component.token",
        ("topic level",),
    ),
    (
        "level-pattern",
        patched({"hierarchy": {"levels": ["site", "line 4", "device"]}}),
        Platform.HOST,
        "$.hierarchy.levels[1]",
        ("pattern", "^[A-Za-z0-9_-]+$"),
    ),
    (
        "levels-unique",
        patched({"hierarchy": {"levels": ["site", "line", "site"]}}),
        Platform.HOST,
        "$.hierarchy.levels[2]",
        ("unique",),
    ),
    (
        "levels-empty",
        patched({"hierarchy": {"levels": []}}),
        Platform.HOST,
        "$.hierarchy.levels",
        ("must not be empty",),
    ),
    (
        "hierarchy-unknown-key",
        patched({"hierarchy": {"depth": 3}}),
        Platform.HOST,
        "$.hierarchy.depth",
        ("unknown key",),
    ),
    (
        "identity-key-is-last-level",
        patched({"identity": {"device": "gw-02"}}),
        Platform.HOST,
        "$.identity.device",
        ("last hierarchy level", "thing name"),
    ),
    (
        "identity-key-undeclared",
        patched({"identity": {"area": "north"}}),
        Platform.HOST,
        "$.identity.area",
        ("not a declared hierarchy level",),
    ),
    (
        "identity-value-missing",
        patched({"identity": {"line": DELETE}}),
        Platform.HOST,
        "$.identity.line",
        ("is required", "every hierarchy level except the last"),
    ),
    (
        "identity-value-not-a-level",
        patched({"identity": {"site": "plant/1"}}),
        Platform.HOST,
        "$.identity.site",
        ("topic level",),
    ),
    (
        "identity-without-hierarchy",
        patched({"hierarchy": DELETE, "identity": {"line": DELETE}}),
        Platform.HOST,
        "$.identity.site",
        ("not a declared hierarchy level",),
    ),
    (
        "tag-is-location-key",
        patched({"tags": {"site": "plant-2"}}),
        Platform.HOST,
        "$.tags.site",
        ("hierarchy level", "identity, not tags"),
    ),
    (
        "tag-device-key",
        patched({"tags": {"device": "x"}}),
        Platform.HOST,
        "$.tags.device",
        ("hierarchy level",),
    ),
    (
        "tag-value-not-string",
        patched({"tags": {"owner": 5}}),
        Platform.HOST,
        "$.tags.owner",
        ("must be a string",),
    ),
    (
        "tag-key-name",
        patched({"tags": {"bad key": "x"}}),
        Platform.HOST,
        "$.tags['bad key']",
        ("key name", "pattern"),
    ),
    (
        "include-root-wrong-type",
        patched({"topic": {"includeRoot": "yes"}}),
        Platform.HOST,
        "$.topic.includeRoot",
        ("must be a boolean",),
    ),
    (
        "include-root-single-level",
        patched({"hierarchy": DELETE, "identity": DELETE, "topic": {"includeRoot": True}}),
        Platform.HOST,
        "$.topic.includeRoot",
        ("at least two levels",),
    ),
    (
        "topic-root-wildcard",
        patched({"topic": {"root": "uns/#"}}),
        Platform.HOST,
        "$.topic.root",
        ("topic levels",),
    ),
    (
        "metric-topic-refused",
        patched({"metricEmission": {"target": "messaging", "targetConfig": {"topic": "m/x"}}}),
        Platform.HOST,
        "$.metricEmission.targetConfig.topic",
        ("not allowed", "mints the metric topic", "destination"),
    ),
    (
        "metric-target-unknown",
        patched({"metricEmission": {"target": "prometheus"}}),
        Platform.HOST,
        "$.metricEmission.target",
        ("one of", '"scrape"'),
    ),
    (
        "metric-destination-unknown",
        patched({"metricEmission": {"targetConfig": {"destination": "edge"}}}),
        Platform.HOST,
        "$.metricEmission.targetConfig.destination",
        ("one of", '"local"', '"cloud"'),
    ),
    (
        "metric-interval-zero",
        patched({"metricEmission": {"intervalSeconds": 0}}),
        Platform.HOST,
        "$.metricEmission.intervalSeconds",
        ("> 0",),
    ),
    (
        "health-port-range",
        patched({"health": {"port": 65536}}),
        Platform.HOST,
        "$.health.port",
        ("<= 65535",),
    ),
    (
        "health-enabled-type",
        patched({"health": {"enabled": "true"}}),
        Platform.HOST,
        "$.health.enabled",
        ("must be a boolean",),
    ),
    (
        "health-path-relative",
        patched({"health": {"livenessPath": "livez"}}),
        Platform.HOST,
        "$.health.livenessPath",
        ("starting with '/'",),
    ),
    (
        "health-unknown-key",
        patched({"health": {"host": "0.0.0.0"}}),
        Platform.HOST,
        "$.health.host",
        ("unknown key",),
    ),
    (
        "health-paths-distinct",
        patched({"health": {"readinessPath": "/livez"}}),
        Platform.HOST,
        "$.health.readinessPath",
        ("must differ from livenessPath",),
    ),
    (
        "python-format-invalid",
        patched({"logging": {"python_format": "{timestamp} {level} {message}"}}),
        Platform.HOST,
        "$.logging.python_format",
        ("%-style logging format",),
    ),
    (
        "log-format-names-a-field-no-record-has",
        patched({"logging": {"python_format": "%(nosuchfield)s %(message)s"}}),
        Platform.HOST,
        "$.logging.python_format",
        ("cannot format a log record",),
    ),
    (
        "log-format-conversion-does-not-fit",
        patched({"logging": {"python_format": "%(message)d"}}),
        Platform.HOST,
        "$.logging.python_format",
        ("cannot format a log record",),
    ),
    (
        "file-size-zero",
        patched({"logging": {"fileLogging": {"maxFileSize": "0MB"}}}),
        Platform.HOST,
        "$.logging.fileLogging.maxFileSize",
        ("greater than zero",),
    ),
    (
        "metric-target-config-unknown-key",
        patched({"metricEmission": {"targetConfig": {"prot": 9100}}}),
        Platform.HOST,
        "$.metricEmission.targetConfig.prot",
        ("unknown key", "namespace"),
    ),
    (
        "metric-scrape-port-range",
        patched({"metricEmission": {"target": "scrape", "targetConfig": {"port": 99999}}}),
        Platform.HOST,
        "$.metricEmission.targetConfig.port",
        ("<= 65535",),
    ),
    (
        "topic-root-dollar",
        patched({"topic": {"root": "$SYS"}}),
        Platform.HOST,
        "$.topic.root",
        ("leading '$'",),
    ),
    (
        "log-level-unknown",
        patched({"logging": {"level": "LOUD"}}),
        Platform.HOST,
        "$.logging.level",
        ("log level",),
    ),
    (
        "logger-level-unknown",
        patched({"logging": {"loggers": {"paho": "LOUD"}}}),
        Platform.HOST,
        "$.logging.loggers.paho",
        ("log level",),
    ),
    (
        "library-level-unknown",
        patched({"logging": {"libraryLevel": "QUIET"}}),
        Platform.HOST,
        "$.logging.libraryLevel",
        ("log level",),
    ),
    (
        "file-logging-needs-path",
        patched({"logging": {"fileLogging": {"enabled": True}}}),
        Platform.HOST,
        "$.logging.fileLogging.filePath",
        ("is required",),
    ),
    (
        "file-size-format",
        patched({"logging": {"fileLogging": {"maxFileSize": "10 parsecs"}}}),
        Platform.HOST,
        "$.logging.fileLogging.maxFileSize",
        ("10MB",),
    ),
    (
        "backup-count-negative",
        patched({"logging": {"fileLogging": {"backupCount": -1}}}),
        Platform.HOST,
        "$.logging.fileLogging.backupCount",
        (">= 1",),
    ),
    (
        "backup-count-zero",
        patched({"logging": {"fileLogging": {"backupCount": 0}}}),
        Platform.HOST,
        "$.logging.fileLogging.backupCount",
        (">= 1",),
    ),
    (
        "heartbeat-interval-zero",
        patched({"heartbeat": {"intervalSeconds": 0}}),
        Platform.HOST,
        "$.heartbeat.intervalSeconds",
        ("> 0",),
    ),
    (
        "credentials-need-vault-path",
        patched({"credentials": {"keyFile": "k"}}),
        Platform.HOST,
        "$.credentials.vaultPath",
        ("is required",),
    ),
    (
        "credentials-key-env-name",
        patched({"credentials": {**VAULT, "keyEnv": "1X"}}),
        Platform.HOST,
        "$.credentials.keyEnv",
        ("pattern",),
    ),
    (
        "secret-needs-vault",
        patched({"messaging": {"local": {"credentials": {"username": "u", "password": SECRET}}}}),
        Platform.HOST,
        "$.messaging.local.credentials.password",
        ("credentials section",),
    ),
    (
        "secret-in-component-needs-vault",
        patched({"component": {"plc": {"key": {"$secret": "plc-key"}}}}),
        Platform.HOST,
        "$.component.plc.key",
        ("credentials section",),
    ),
    (
        "secret-ref-extra-key",
        patched({"credentials": VAULT, "component": {"cert": {"$secret": "c", "fields": "x"}}}),
        Platform.HOST,
        "$.component.cert.fields",
        ("unknown key in a $secret reference",),
    ),
    (
        "secret-ref-empty-name",
        patched({"credentials": VAULT, "component": {"cert": {"$secret": ""}}}),
        Platform.HOST,
        "$.component.cert['$secret']",
        ("non-empty string",),
    ),
    # Issue 36: an integer key given as a number with a zero fraction reached a socket
    # ("127.0.0.1:18837.0"), paho (struct.error) or the probe server (TypeError).
    (
        "broker-port-with-a-fraction",
        patched({"messaging": {"local": {"port": 18837.0}}}),
        Platform.HOST,
        "$.messaging.local.port",
        ("must be an integer", "without a decimal point"),
    ),
    (
        "keepalive-with-a-fraction",
        patched({"messaging": {"local": {"keepAliveSeconds": 30.0}}}),
        Platform.HOST,
        "$.messaging.local.keepAliveSeconds",
        ("must be an integer",),
    ),
    (
        "health-port-with-a-fraction",
        patched({"health": {"port": 18903.0}}),
        Platform.HOST,
        "$.health.port",
        ("must be an integer",),
    ),
    (
        "scrape-port-with-a-fraction",
        patched({"metricEmission": {"target": "scrape", "targetConfig": {"port": 9464.0}}}),
        Platform.HOST,
        "$.metricEmission.targetConfig.port",
        ("must be an integer",),
    ),
    # A duration beyond its unit's ceiling killed a thread with OverflowError.
    (
        "heartbeat-interval-beyond-the-ceiling",
        patched({"heartbeat": {"intervalSeconds": 1e12}}),
        Platform.HOST,
        "$.heartbeat.intervalSeconds",
        ("must be <= 315360000", "10 years"),
    ),
    (
        "metric-interval-beyond-the-ceiling",
        patched({"metricEmission": {"intervalSeconds": 1e300}}),
        Platform.HOST,
        "$.metricEmission.intervalSeconds",
        ("must be <= 315360000",),
    ),
    (
        "request-timeout-beyond-the-ceiling",
        patched({"messaging": {"requestTimeoutSeconds": 1e12}}),
        Platform.HOST,
        "$.messaging.requestTimeoutSeconds",
        ("must be <= 315360000",),
    ),
    (
        "component-duration-beyond-the-ceiling",
        patched({"component": {"timing": {"connectMs": 2**31}}}),
        Platform.HOST,
        "$.component.timing.connectMs",
        ("must be <= 2147483647", "24.8 days"),
    ),
    (
        "metrics-to-the-cloud-without-a-northbound-broker",
        patched(
            {"metricEmission": {"target": "messaging", "targetConfig": {"destination": "cloud"}}}
        ),
        Platform.HOST,
        "$.metricEmission.targetConfig.destination",
        ("messaging.northbound", "there is none"),
    ),
    (
        "scrape-port-is-the-health-port",
        patched(
            {
                "metricEmission": {"target": "scrape", "targetConfig": {"port": 18903}},
                "health": {"enabled": True, "port": 18903},
            }
        ),
        Platform.HOST,
        "$.metricEmission.targetConfig.port",
        ("must differ from health.port",),
    ),
    (
        "scrape-port-is-the-cluster-default-health-port",
        patched({"metricEmission": {"target": "scrape", "targetConfig": {"port": 8081}}}),
        Platform.CLUSTER,
        "$.metricEmission.targetConfig.port",
        ("must differ from health.port",),
    ),
    (
        "json-nested-too-deep",
        '{"component": {}, "tags": ' + '{"a": ' * 1000 + "1" + "}" * 1001,
        Platform.HOST,
        "$",
        ("nests deeper than 64 levels",),
    ),
    (
        "yaml-nested-too-deep",
        "#yaml\ncomponent: " + "[" * 1000 + "]" * 1000 + "\n",
        Platform.HOST,
        "$",
        ("nests deeper than 64 levels",),
    ),
    (
        "document-nested-too-deep",
        patched({"component": {"x": _nested(200)}}),
        Platform.HOST,
        "$.component.x" + ".a" * 62,
        ("nests deeper than 64 levels",),
    ),
]


@pytest.mark.parametrize(
    ("document", "platform", "path", "words"),
    [pytest.param(doc, platform, path, words, id=name) for name, doc, platform, path, words in BAD],
)
def test_bad_document_names_path_and_rule(
    document: Any, platform: Platform, path: str, words: tuple[str, ...]
) -> None:
    issues = _issues(document, platform)
    at_path = [issue for issue in issues if issue.path == path]
    assert at_path, f"no issue at {path}; got {issues}"
    assert any(all(word in issue.message for word in words) for issue in at_path), at_path


def test_base_document_is_valid() -> None:
    assert validate_document(base_document()) == []


@pytest.mark.parametrize("name", [row[0] for row in BAD if not isinstance(row[1], str)])
def test_each_bad_row_differs_from_valid_only_by_its_fault(name: str) -> None:
    # Guards the table: a row must not also break an unrelated rule by accident.
    row = next(r for r in BAD if r[0] == name)
    issues = _issues(row[1], row[2])
    assert {issue.path for issue in issues} == {row[3]}, issues


def test_all_errors_are_collected_not_just_the_first() -> None:
    document = patched(
        {
            "messaging": {"local": {"port": "x", "qos": {"publish": 9}}},
            "identity": {"device": "d"},
            "health": {"port": -1},
            "metricEmission": {"targetConfig": {"topic": "t"}},
        }
    )
    paths = [issue.path for issue in _issues(document)]
    assert paths == sorted(
        [
            "$.health.port",
            "$.identity.device",
            "$.messaging.local.port",
            "$.messaging.local.qos.publish",
            "$.metricEmission.targetConfig.topic",
        ]
    )


def test_error_text_lists_every_path() -> None:
    document = patched({"messaging": {"local": {"port": "x"}}, "tags": {"site": "s"}})
    with pytest.raises(ConfigError) as caught:
        resolve_config(document, thing=THING, platform=Platform.HOST, source="plant.json")
    text = str(caught.value)
    assert "2 configuration errors in plant.json" in text
    assert "$.messaging.local.port: must be an integer" in text
    assert "$.tags.site: is a hierarchy level" in text


@pytest.mark.parametrize("host", ["::1", "fe80::1", "broker.example", "10.0.0.7", "embedded"])
def test_a_host_name_or_address_is_valid(host: str) -> None:
    document = patched({"messaging": {"local": {"host": host, "port": DELETE}}})
    assert validate_document(document) == []


def test_embedded_host_is_valid_without_port() -> None:
    document = patched({"messaging": {"local": {"host": "embedded", "port": DELETE}}})
    assert validate_document(document) == []


def test_embedded_host_may_ask_for_any_free_port() -> None:
    document = patched({"messaging": {"local": {"host": "embedded", "port": 0}}})
    assert validate_document(document) == []


@pytest.mark.parametrize("platform", list(Platform))
def test_a_local_link_is_needed_off_the_edge_runtime(platform: Platform) -> None:
    # On EDGE_RUNTIME the local link defaults to the runtime's IPC bus.
    issues = validate_document(patched({"messaging": DELETE}), platform=platform)
    if platform is Platform.EDGE_RUNTIME:
        assert issues == []
    else:
        assert [i.path for i in issues] == ["$.messaging.local"]
        assert '{"type": "ipc"}' in issues[0].message


@pytest.mark.parametrize(
    ("local", "path", "says"),
    [
        ({"type": "ipc", "host": "h"}, "$.messaging.local.host", "is an MQTT setting"),
        ({"type": "ipc", "qos": {"publish": 2}}, "$.messaging.local.qos.publish", "no QoS 2"),
        ({"type": "ipc", "qos": {"subscribe": 2}}, "$.messaging.local.qos.subscribe", "no QoS 2"),
        ({"type": "ipc", "receiveOwnMessages": "yes"}, "$.messaging.local.receiveOwnMessages", ""),
        ({"type": "amqp", "host": "h"}, "$.messaging.local.type", ""),
    ],
)
def test_a_bad_ipc_local_link_names_its_key(local: dict[str, object], path: str, says: str) -> None:
    issues = validate_document(patched({"messaging": {"local": local}}))
    assert path in [i.path for i in issues]
    assert says in next(i.message for i in issues if i.path == path)


def test_an_ipc_local_link_is_valid_on_every_platform() -> None:
    local = {"type": "ipc", "receiveOwnMessages": False, "qos": {"publish": 0}}
    local |= {"host": DELETE, "port": DELETE}  # the base document's broker
    for platform in Platform:
        assert validate_document(patched({"messaging": {"local": local}}), platform=platform) == []


@pytest.mark.parametrize(
    ("northbound", "path", "says"),
    [
        ({"type": "runtime", "host": "h"}, "$.messaging.northbound.host", "is an MQTT setting"),
        ({"type": "runtime", "clientId": "c"}, "$.messaging.northbound.clientId", "MQTT setting"),
        (
            {"type": "runtime", "credentials": {"caPath": "/ca"}},
            "$.messaging.northbound.credentials",
            'cannot be used with "type": "runtime"',
        ),
        ({"type": "runtime", "qos": {"publish": 2}}, "$.messaging.northbound.qos.publish", "QoS 2"),
        (
            {"type": "runtime", "receiveOwnMessages": True},
            "$.messaging.northbound.receiveOwnMessages",
            "",
        ),
        ({"type": "ipc"}, "$.messaging.northbound.type", ""),
        (
            {"type": "runtime", "reconnect": {"initialDelaySeconds": 9, "maxDelaySeconds": 1}},
            "$.messaging.northbound.reconnect.initialDelaySeconds",
            "at most",
        ),
    ],
)
def test_a_bad_runtime_northbound_link_names_its_key(
    northbound: dict[str, object], path: str, says: str
) -> None:
    issues = validate_document(patched({"messaging": {"northbound": northbound}}))
    assert path in [i.path for i in issues]
    assert says in next(i.message for i in issues if i.path == path)


def test_a_runtime_northbound_link_needs_no_broker_address() -> None:
    northbound = {
        "type": "runtime",
        "qos": {"publish": 0, "subscribe": 1},
        "reconnect": {"initialDelaySeconds": 1},
        "publishDegradedAfterSeconds": 5,
        "storeAndForward": {"enabled": True},
    }
    for platform in Platform:
        document = patched({"messaging": {"northbound": northbound}})
        assert validate_document(document, platform=platform) == []


def test_a_northbound_broker_still_needs_its_address() -> None:
    issues = validate_document(patched({"messaging": {"northbound": {"type": "mqtt"}}}))
    assert [i.path for i in issues] == ["$.messaging.northbound"]
    assert '"type": "runtime"' in issues[0].message


def test_type_key_of_local_broker_is_accepted() -> None:
    document = patched({"messaging": {"local": {"type": "mqtt"}}})
    assert validate_document(document) == []


def test_secret_reference_with_vault_is_valid() -> None:
    document = patched(
        {
            "credentials": VAULT,
            "messaging": {"local": {"credentials": {"username": "u", "password": SECRET}}},
        }
    )
    assert validate_document(document) == []


def test_target_config_keeps_target_specific_keys() -> None:
    document = patched({"metricEmission": {"target": "scrape", "targetConfig": {"port": 9100}}})
    assert validate_document(document) == []


def test_schema_keyword_is_allowed_at_top_level() -> None:
    document = patched({"$schema": "urn:unskit:schema:framework:1"})
    assert validate_document(document) == []


def test_framework_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = load_schema("framework.schema.json")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert set(schema["properties"]) == {
        "$schema",
        "component",
        "tags",
        "hierarchy",
        "identity",
        "topic",
        "messaging",
        "credentials",
        "metricEmission",
        "logging",
        "heartbeat",
        "commands",
        "health",
    }


def test_component_schema_validates_the_component_section() -> None:
    component_schema = {
        "type": "object",
        "required": ["instances"],
        "properties": {
            "token": {"type": "string"},
            "instances": {"type": "array", "items": {"type": "object", "required": ["id"]}},
            "key": {"$ref": "urn:unskit:schema:framework:1#/$defs/secretRef"},
        },
    }
    document = patched({"component": {"instances": [{"name": "x"}], "key": {"$secret": 5}}})
    paths = {issue.path for issue in validate_document(document, component_schema=component_schema)}
    assert "$.component.instances[0].id" in paths
    assert "$.component.key['$secret']" in paths


def test_missing_thing_name_is_an_error_naming_the_ways_to_give_it() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config(base_document(), thing=None, platform=Platform.HOST)
    (issue,) = caught.value.issues
    assert issue.path == "-t/--thing"
    assert "UNSKIT_THING_NAME" in issue.message
    assert "AWS_IOT_THING_NAME" in issue.message


def test_thing_name_must_be_one_topic_level() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config(base_document(), thing="a/b", platform=Platform.HOST)
    assert [i.path for i in caught.value.issues] == ["-t/--thing"]


def test_component_token_falls_back_to_builtin_and_is_required_without_one() -> None:
    document = patched({"component": {"token": DELETE}})
    config = resolve_config(
        document, thing=THING, platform=Platform.HOST, default_component="camera-adapter"
    )
    assert config.component_token == "camera-adapter"
    with pytest.raises(ConfigError) as caught:
        resolve_config(document, thing=THING, platform=Platform.HOST)
    assert [i.path for i in caught.value.issues] == ["$.component.token"]


def test_json_text_errors_do_not_echo_document_text() -> None:
    text = json.dumps({"component": {}}).replace("}", ", 'hunter2-in-text'}", 1)
    with pytest.raises(ConfigError) as caught:
        parse_document(text, "c.json")
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("heartbeat", "intervalSeconds"),
        ("messaging", "requestTimeoutSeconds"),
        ("commands", "idempotencyRetentionHours"),
        ("commands", "cursorTtlSeconds"),
    ],
)
def test_a_non_finite_number_is_refused_with_its_path(section: str, key: str, value: str):
    document = patched({section: {key: 1.5}})
    text = json.dumps(document).replace("1.5", value)
    issues = _issues(text)
    assert [str(i) for i in issues] == [
        f"$.{section}.{key}: must be a finite number, not {float(value)!r}"
    ]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN", ".Inf"])
def test_a_non_finite_yaml_number_is_refused_anywhere(value: str):
    text = "#yaml\n" + json.dumps(patched({"component": {"instances": [{"limit": 1.5}]}}))
    issues = _issues(text.replace("1.5", value))
    assert [i.path for i in issues] == ["$.component.instances[0].limit"]
    assert "must be a finite number" in issues[0].message


def test_a_log_file_where_a_directory_or_under_a_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for file_path, words in (
        (tmp_path, "cannot be opened: it is a directory; name the log file"),
        (blocker / "c.log", f"cannot be opened: its folder cannot be made ({blocker} is a file)"),
    ):
        files = {"enabled": True, "filePath": str(file_path)}
        issues = _issues(patched({"logging": {"fileLogging": files}}))
        assert ConfigIssue("$.logging.fileLogging.filePath", words) in issues, issues
    # Disabled, the path is not opened, so it is not checked.
    files = {"enabled": False, "filePath": str(tmp_path)}
    assert validate_document(patched({"logging": {"fileLogging": files}})) == []
