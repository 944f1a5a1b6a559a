"""The resolved model: defaults, identity, topic root, the envelope stamp."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from types import MappingProxyType

import pytest

from unskit import Identity, MessageBuilder
from unskit.config import ComponentConfig, Platform, Secret, resolve_config
from unskit.config.messaging import OverflowPolicy, ReconnectConfig
from unskit.config.model import (
    HealthConfig,
    LoggingConfig,
    MetricEmissionConfig,
    MetricTarget,
    build_config,
    log_level,
    parse_size,
)
from unskit.envelope import EnvelopeStamp
from unskit.errors import ConfigError

from .documents import DELETE, THING, TOKEN, patched

MINIMAL = {"component": {}, "messaging": {"local": {"host": "broker.local"}}}


def _config(document: dict, platform: Platform = Platform.HOST, **kw: object) -> ComponentConfig:
    return resolve_config(
        document,
        thing=THING,
        platform=platform,
        default_component=TOKEN,
        **kw,  # type: ignore[arg-type]
    )


def test_minimal_document_gets_every_default() -> None:
    config = _config(MINIMAL)
    assert config.hierarchy.levels == ("device",)
    assert config.identity == Identity("device", THING, TOKEN)
    assert dict(config.identity_values) == {"device": THING}
    assert dict(config.tags) == {}
    assert config.topic.root == "uns"
    assert config.topic.include_root is False
    assert config.topics.base == f"uns/{THING}/{TOKEN}"
    messaging = config.messaging
    assert messaging.request_timeout_seconds == 30.0
    assert messaging.northbound is None
    assert messaging.local is not None
    assert messaging.local.host == "broker.local"
    assert messaging.local.port == 1883
    assert messaging.local.client_id == f"{THING}-{TOKEN}"
    assert (messaging.local.qos.publish, messaging.local.qos.subscribe) == (1, 1)
    assert messaging.local.tls is False
    assert messaging.local.embedded is False
    assert config.credentials is None
    assert config.metric_emission.enabled is True
    assert config.metric_emission.target is MetricTarget.LOG
    assert config.metric_emission.destination == "local"
    assert config.metric_emission.interval_seconds == 60.0
    assert config.metric_emission == MetricEmissionConfig()
    assert config.heartbeat.enabled is True
    assert config.heartbeat.interval_seconds == 60.0
    assert config.logging.level == "INFO"
    assert config.logging.format == "%(asctime)s [%(levelname)s] %(name)s: %(message)s"
    assert config.logging.json is False
    assert dict(config.logging.loggers) == {}
    files = config.logging.file_logging
    assert (files.enabled, files.file_path, files.max_file_size, files.backup_count) == (
        False,
        None,
        10 * 1024**2,
        5,
    )
    assert config.logging.global_control is False
    assert config.logging.library_level is None
    assert config.logging.effective_library_level == "WARNING"
    assert config.logging == LoggingConfig()
    health = config.health
    assert (health.enabled, health.enabled_explicitly_set, health.port) == (None, False, 8081)
    assert config.health_enabled is False
    assert health == HealthConfig()
    assert (health.liveness_path, health.readiness_path, health.startup_path) == (
        "/livez",
        "/readyz",
        "/startupz",
    )


def test_identity_joins_levels_and_values_with_the_thing_last() -> None:
    config = _config(
        patched(
            {
                "hierarchy": {"levels": ["enterprise", "site", "line", "device"]},
                "identity": {"enterprise": "acme", "site": "plant-1", "line": "line-4"},
            }
        )
    )
    assert config.identity.hier == "enterprise/site/line/device"
    assert config.identity.path == "acme/plant-1/line-4/gw-01"
    assert config.identity.component == TOKEN
    assert config.identity.instance is None
    assert config.identity.device == THING


def test_component_token_from_document_wins_over_builtin() -> None:
    config = resolve_config(
        patched({"component": {"token": "ethernet-ip-adapter"}}),
        thing=THING,
        platform=Platform.HOST,
        default_component="builtin",
    )
    assert config.component_token == "ethernet-ip-adapter"
    assert config.identity.component == "ethernet-ip-adapter"


def test_config_is_an_envelope_stamp_for_the_message_builder() -> None:
    config = _config(patched({"tags": {"owner": "ops", "costCenter": "42"}}))
    stamp: EnvelopeStamp = config
    message = MessageBuilder("reading", "1", stamp).instance("cam-1").body({"v": 1}).build()
    assert message.identity == Identity("site/line/device", "plant-1/line-4/gw-01", TOKEN, "cam-1")
    assert dict(message.tags) == {"owner": "ops", "costCenter": "42"}
    component_scope = MessageBuilder("reading", "1", config).build()
    assert component_scope.identity == config.identity


def test_include_root_inserts_first_hierarchy_value_after_root() -> None:
    config = _config(patched({"topic": {"includeRoot": True, "root": "factory/uns"}}))
    assert config.topics.base == f"factory/uns/plant-1/{THING}/{TOKEN}"
    assert config.topics.topic("data", instance="cam-1") == (
        f"factory/uns/plant-1/{THING}/{TOKEN}/cam-1/data"
    )


def test_topic_base_without_include_root() -> None:
    config = _config(patched({}))
    assert config.topics.topic("evt", instance="i") == f"uns/{THING}/{TOKEN}/i/evt"


def test_config_is_frozen_all_the_way_down() -> None:
    config = _config(patched({"component": {"instances": [{"id": "a"}]}}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.thing_name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.tags["owner"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        config.component["token"] = "x"  # type: ignore[index]
    assert config.component["instances"][0]["id"] == "a"
    assert isinstance(config.component["instances"], tuple)


def test_loaded_document_is_a_private_copy() -> None:
    document = patched({})
    config = _config(document)
    document["tags"]["owner"] = "changed"
    document["component"]["instances"].append({"id": "late"})
    assert config.tags["owner"] == "ops"
    assert config.component["instances"] == ()


@pytest.mark.parametrize(
    ("platform", "section", "enabled", "explicit"),
    [
        (Platform.HOST, {}, False, False),
        (Platform.EDGE_RUNTIME, {}, False, False),
        (Platform.CLUSTER, {}, True, False),
        (Platform.CLUSTER, {"enabled": False}, False, True),
        (Platform.HOST, {"enabled": True}, True, True),
    ],
)
def test_health_enablement_follows_explicit_then_platform(
    platform: Platform, section: dict, enabled: bool, explicit: bool
) -> None:
    config = _config(patched({"health": section}), platform)
    assert config.health_enabled is enabled
    assert config.health.enabled_for(config.platform) is enabled
    assert config.health.enabled_explicitly_set is explicit


def test_health_keys_are_read() -> None:
    health = _config(
        patched(
            {
                "health": {
                    "port": 0,
                    "livenessPath": "/l",
                    "readinessPath": "/r",
                    "startupPath": "/s",
                }
            }
        )
    ).health
    assert (health.port, health.liveness_path, health.readiness_path, health.startup_path) == (
        0,
        "/l",
        "/r",
        "/s",
    )


@pytest.mark.parametrize(
    ("section", "effective"),
    [
        ({"libraryLevel": "info"}, "INFO"),
        ({"libraryLevel": "DEBUG", "level": "ERROR"}, "DEBUG"),
        ({"level": "ERROR"}, "ERROR"),
        ({"level": "DEBUG"}, "WARNING"),
    ],
)
def test_logging_library_level(section: dict, effective: str) -> None:
    assert _config(patched({"logging": section})).logging.effective_library_level == effective


@pytest.mark.parametrize(
    ("platform", "section", "effective"),
    [
        (Platform.HOST, {}, "%(asctime)s [%(levelname)s] %(name)s: %(message)s"),
        (Platform.CLUSTER, {}, "json"),
        (Platform.CLUSTER, {"python_format": "%(message)s"}, "%(message)s"),
        (Platform.HOST, {"python_format": "JSON"}, "JSON"),
        (Platform.CLUSTER, {"java_format": "%m%n"}, "json"),
    ],
)
def test_logging_format_precedence(platform: Platform, section: dict, effective: str) -> None:
    logging_config = _config(patched({"logging": section}), platform).logging
    assert logging_config.format == effective
    assert logging_config.json is (effective.lower() == "json")


def test_logging_keys_are_read_and_levels_normalised() -> None:
    logging_config = _config(
        patched(
            {
                "logging": {
                    "level": "debug",
                    "loggers": {"paho.mqtt": "warn"},
                    "fileLogging": {
                        "enabled": True,
                        "filePath": "/var/log/c.log",
                        "maxFileSize": "512KB",
                        "backupCount": 2,
                    },
                    "globalControl": True,
                }
            }
        )
    ).logging
    assert logging_config.level == "DEBUG"
    assert log_level(logging_config.level) == logging.DEBUG
    assert dict(logging_config.loggers) == {"paho.mqtt": "WARN"}
    assert log_level(logging_config.loggers["paho.mqtt"]) == logging.WARNING
    assert isinstance(logging_config.loggers, MappingProxyType)
    assert logging_config.file_logging.enabled is True
    assert logging_config.file_logging.file_path == "/var/log/c.log"
    assert logging_config.file_logging.max_file_size == 512 * 1024
    assert logging_config.file_logging.backup_count == 2
    assert logging_config.global_control is True


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10MB", 10 * 1024**2),
        ("512 KB", 512 * 1024),
        ("1gb", 1024**3),
        ("4096", 4096),
        ("7B", 7),
        ("1.5MB", 3 * 512 * 1024),
        ("10MiB", 10 * 1024**2),
        ("2M", 2 * 1024**2),
        ("0", 0),
        (4096, 4096),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("ten")


def test_broker_keys_tls_and_secrets() -> None:
    document = patched(
        {
            "credentials": {"vaultPath": "v.json", "keyFile": "k"},
            "messaging": {
                "local": {
                    "clientId": "cid",
                    "qos": {"publish": 0, "subscribe": 2},
                    "credentials": {"caPath": "ca.pem", "certPath": "c.pem", "keyPath": "k.pem"},
                    "port": DELETE,
                },
                "northbound": {
                    "endpoint": "iot.example.com",
                    "credentials": {
                        "caPath": "nb-ca.pem",
                        "certPath": "nb.pem",
                        "keyPath": "nb.key",
                    },
                },
                "requestTimeoutSeconds": 0,
            },
        }
    )
    messaging = _config(document).messaging
    local = messaging.local
    assert local is not None
    assert (local.client_id, local.qos.publish, local.qos.subscribe) == ("cid", 0, 2)
    assert local.tls
    assert local.mutual_tls
    assert local.port == 8883
    assert local.credentials.ca_path == "ca.pem"
    northbound = messaging.northbound
    assert northbound is not None
    assert northbound.host == "iot.example.com"
    assert northbound.port == 8883
    assert northbound.mutual_tls
    assert messaging.request_timeout_seconds == 0.0


def test_store_and_forward_is_off_by_default() -> None:
    document = patched({"messaging": {"northbound": {"host": "nb.example.com"}}})
    northbound = _config(document).messaging.northbound
    assert northbound is not None
    assert northbound.store_and_forward is None
    document = patched(
        {"messaging": {"northbound": {"host": "nb", "storeAndForward": {"enabled": False}}}}
    )
    northbound = _config(document).messaging.northbound
    assert northbound is not None
    assert northbound.store_and_forward is None


def test_store_and_forward_defaults_to_the_state_directory(tmp_path: Path) -> None:
    document = patched(
        {
            "messaging": {"northbound": {"host": "nb", "storeAndForward": {"enabled": True}}},
            "commands": {"stateDir": str(tmp_path), "durableSync": True},
        }
    )
    config = _config(document)
    assert config.messaging.northbound is not None
    outbox = config.messaging.northbound.store_and_forward
    assert outbox is not None
    thing, token = config.thing_name, config.component_token
    assert outbox.path == tmp_path / thing / token / "outbox.sqlite3"
    assert outbox.synchronous_full
    assert (outbox.max_bytes, outbox.max_age_seconds) == (64 * 1024 * 1024, 7 * 24 * 3600)
    assert outbox.overflow is OverflowPolicy.DROP_OLDEST
    assert (outbox.replay_messages_per_second, outbox.max_in_flight) == (0, 1000)


def test_store_and_forward_keys_are_read() -> None:
    section = {
        "enabled": True,
        "path": "/var/lib/edge/out.db",
        "maxBytes": 1_000_000,
        "maxAgeSeconds": 0,
        "overflow": "refuseNewest",
        "replayMessagesPerSecond": 250,
        "maxInFlight": 50,
    }
    document = patched({"messaging": {"northbound": {"host": "nb", "storeAndForward": section}}})
    northbound = _config(document).messaging.northbound
    assert northbound is not None
    outbox = northbound.store_and_forward
    assert outbox is not None
    assert outbox.path == Path("/var/lib/edge/out.db")
    assert not outbox.synchronous_full
    assert (outbox.max_bytes, outbox.max_age_seconds, outbox.overflow) == (
        1_000_000,
        0,
        OverflowPolicy.REFUSE_NEWEST,
    )
    assert (outbox.replay_messages_per_second, outbox.max_in_flight) == (250, 50)


def test_keepalive_defaults_to_30_s_and_is_read_per_broker() -> None:
    document = patched(
        {"messaging": {"local": {"keepAliveSeconds": 3}, "northbound": {"endpoint": "nb.local"}}}
    )
    messaging = _config(document).messaging
    assert messaging.local is not None
    assert messaging.local.keepalive_seconds == 3
    assert messaging.northbound is not None
    assert messaging.northbound.keepalive_seconds == 30


def test_reconnect_and_publish_degraded_age_default_and_are_read_per_broker() -> None:
    document = patched(
        {
            "messaging": {
                "local": {
                    "reconnect": {"initialDelaySeconds": 0.25, "maxDelaySeconds": 2},
                    "publishDegradedAfterSeconds": 5,
                },
                "northbound": {"endpoint": "nb.local", "reconnect": {"maxDelaySeconds": 60}},
            }
        }
    )
    messaging = _config(document).messaging
    assert messaging.local is not None
    assert messaging.local.reconnect == ReconnectConfig(0.25, 2.0)
    assert messaging.local.publish_degraded_after_seconds == 5.0
    assert messaging.northbound is not None
    assert messaging.northbound.reconnect == ReconnectConfig(0.5, 60.0)
    assert messaging.northbound.publish_degraded_after_seconds == 30.0
    default = _config(MINIMAL).messaging.local
    assert default is not None
    assert default.reconnect == ReconnectConfig(0.5, 4.0)
    assert default.publish_degraded_after_seconds == 30.0


@pytest.mark.parametrize(
    ("initial", "most", "words"),
    [
        (0.0, 4.0, "initialDelaySeconds must be above 0"),
        (0.5, float("nan"), "maxDelaySeconds must be above 0"),
        (0.5, 1e12, "at most 3600 s"),
        (5.0, 4.0, "initialDelaySeconds must be at most maxDelaySeconds"),
    ],
)
def test_a_reconnect_built_in_code_is_checked(initial: float, most: float, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        ReconnectConfig(initial, most)


@pytest.mark.parametrize("value", [0, 65536, 2.5, "30"])
def test_a_keepalive_out_of_range_names_its_key(value: object) -> None:
    document = patched({"messaging": {"local": {"keepAliveSeconds": value}}})
    with pytest.raises(ConfigError, match="keepAliveSeconds"):
        _config(document)


def test_inline_password_becomes_a_secret() -> None:
    document = patched(
        {"messaging": {"local": {"credentials": {"username": "u", "password": "pw-inline"}}}}
    )
    local = _config(document).messaging.local
    assert local is not None
    assert local.credentials.password == Secret("pw-inline")
    assert "pw-inline" not in repr(local)


def test_embedded_broker() -> None:
    local = _config(patched({"messaging": {"local": {"host": "embedded", "port": DELETE}}}))
    assert local.messaging.local is not None
    assert local.messaging.local.embedded is True
    assert local.messaging.local.port == 1883


def test_edge_runtime_without_local_broker_takes_the_ipc_bus() -> None:
    messaging = _config(patched({"messaging": DELETE}), Platform.EDGE_RUNTIME).messaging
    assert messaging.local is None
    assert messaging.ipc
    assert messaging.local_ipc is not None
    assert messaging.local_ipc.client_id.startswith(f"{THING}-")


def test_an_ipc_local_link_reads_its_keys() -> None:
    local = {"type": "ipc", "receiveOwnMessages": False, "qos": {"publish": 0}}
    local |= {"host": DELETE, "port": DELETE}  # the base document's broker
    messaging = _config(patched({"messaging": {"local": local}}), Platform.HOST).messaging
    assert messaging.local is None
    assert messaging.local_ipc is not None
    assert messaging.local_ipc.receive_own_messages is False
    assert messaging.local_ipc.qos.publish == 0
    assert messaging.local_ipc.qos.subscribe == 1


def test_a_runtime_northbound_link_reads_its_keys() -> None:
    northbound = {
        "type": "runtime",
        "qos": {"publish": 0},
        "publishDegradedAfterSeconds": 5,
        "storeAndForward": {"enabled": True, "maxInFlight": 7},
    }
    messaging = _config(
        patched({"messaging": {"northbound": northbound}}), Platform.EDGE_RUNTIME
    ).messaging
    assert messaging.northbound is None
    assert messaging.has_northbound
    runtime = messaging.northbound_runtime
    assert runtime is not None
    assert messaging.northbound_settings is runtime
    assert (runtime.qos.publish, runtime.qos.subscribe) == (0, 1)
    assert runtime.publish_degraded_after_seconds == 5
    assert runtime.store_and_forward is not None
    assert runtime.store_and_forward.max_in_flight == 7
    assert runtime.store_and_forward.path.name == "outbox.sqlite3"


def test_without_a_type_the_northbound_link_is_a_broker() -> None:
    northbound = {"host": "cloud.example", "port": 8883}
    messaging = _config(patched({"messaging": {"northbound": northbound}})).messaging
    assert messaging.northbound_runtime is None
    assert messaging.northbound is not None
    assert messaging.northbound_settings is messaging.northbound


def test_metric_emission_reads_every_target_option() -> None:
    metrics = _config(
        patched(
            {
                "metricEmission": {
                    "enabled": False,
                    "target": "messaging",
                    "intervalSeconds": 15,
                    "targetConfig": {
                        "destination": "cloud",
                        "namespace": "plant",
                        "host": "127.0.0.1",
                        "port": 9100,
                        "path": "/m",
                    },
                }
            }
        )
    ).metric_emission
    assert (metrics.enabled, metrics.target, metrics.interval_seconds) == (False, "messaging", 15.0)
    assert metrics.target is MetricTarget.MESSAGING
    assert isinstance(metrics.interval_seconds, float)
    assert metrics.destination == "cloud"
    assert metrics.namespace == "plant"
    assert (metrics.host, metrics.port, metrics.path) == ("127.0.0.1", 9100, "/m")


def test_metric_emission_defaults_apply_to_target_options() -> None:
    metrics = _config(patched({"metricEmission": {"target": "scrape"}})).metric_emission
    assert metrics.target is MetricTarget.SCRAPE
    assert (metrics.host, metrics.port, metrics.path) == ("0.0.0.0", 9464, "/metrics")
    assert metrics.namespace == "unskit"


def test_sections_are_built_by_their_one_parser() -> None:
    document = patched(
        {
            "health": {"enabled": True, "port": 0},
            "logging": {"level": "warn", "fileLogging": {"maxFileSize": "1KB"}},
            "metricEmission": {"target": "cloudmon", "targetConfig": {"namespace": "ns"}},
        }
    )
    config = _config(document, Platform.CLUSTER)
    assert config.health == HealthConfig.from_section(document["health"])
    assert config.logging == LoggingConfig.from_section(document["logging"], Platform.CLUSTER)
    assert config.metric_emission == MetricEmissionConfig.from_section(document["metricEmission"])


def test_a_schema_valid_value_a_section_refuses_is_a_config_error() -> None:
    # Built without the schema (which also refuses it): the section's own check still holds.
    document = patched({"logging": {"fileLogging": {"backupCount": 0}}})
    with pytest.raises(ConfigError) as caught:
        build_config(document, thing=THING, platform=Platform.HOST, component_token=TOKEN)
    [issue] = caught.value.issues
    assert issue.path == "$.logging.fileLogging.backupCount"
    assert "at least 1" in issue.message


def test_heartbeat_and_credentials_sections() -> None:
    config = _config(
        patched(
            {
                "heartbeat": {"enabled": False, "intervalSeconds": 5},
                "credentials": {"vaultPath": "/v.json", "keyEnv": "MY_KEY"},
            }
        )
    )
    assert (config.heartbeat.enabled, config.heartbeat.interval_seconds) == (False, 5.0)
    assert config.credentials is not None
    assert (config.credentials.vault_path, config.credentials.key_file) == ("/v.json", None)
    assert config.credentials.key_env == "MY_KEY"


def test_identity_values_and_tags_are_read_only_mappings() -> None:
    config = _config(patched({}))
    for mapping in (config.identity_values, config.tags):
        assert isinstance(mapping, MappingProxyType)
        with pytest.raises(TypeError):
            mapping["x"] = "y"  # type: ignore[index]


def test_equal_documents_give_equal_configs() -> None:
    assert _config(patched({})) == _config(patched({}))
    assert _config(patched({})) != _config(patched({"tags": {"owner": "other"}}))


def _endpoints(endpoints: object, **local: object) -> dict:
    return patched(
        {"messaging": {"local": {"host": DELETE, "port": DELETE, "endpoints": endpoints, **local}}}
    )


def test_an_endpoint_list_gives_the_first_broker_and_the_failover_order() -> None:
    document = _endpoints(
        ["mqtt://n1.local:1884", "mqtt://n2.local", "mqtt://[::1]:1885"], failoverGraceSeconds=4
    )
    local = _config(document).messaging.local
    assert local is not None
    assert (local.host, local.port) == ("n1.local", 1884)
    assert local.failover == (("n2.local", 1883), ("::1", 1885))
    assert local.addresses[0] == ("n1.local", 1884)
    assert local.failover_grace_seconds == 4


def test_tls_endpoints_default_to_8883() -> None:
    document = _endpoints(
        ["mqtts://n1.local", "mqtts://n2.local:9883"], credentials={"caPath": "/etc/ca.pem"}
    )
    local = _config(document).messaging.local
    assert local is not None
    assert local.addresses == (("n1.local", 8883), ("n2.local", 9883))
    assert local.tls


def test_one_host_has_no_failover() -> None:
    local = _config(MINIMAL).messaging.local
    assert local is not None
    assert local.failover == ()
    assert local.addresses == (("broker.local", 1883),)


@pytest.mark.parametrize(
    ("endpoints", "local", "path", "message"),
    [
        ([], {}, "$.messaging.local.endpoints", "must not be empty"),
        (["n1.local:1883"], {}, "$.messaging.local.endpoints[0]", "mqtt://"),
        (["mqtt://n1.local:0"], {}, "$.messaging.local.endpoints[0]", ">= 1"),
        (["mqtt://n1.local/x"], {}, "$.messaging.local.endpoints[0]", "no path"),
        (["mqtt://:1883"], {}, "$.messaging.local.endpoints[0]", "no host"),
        (
            ["mqtt://n1.local", "mqtt://N1.local:1883"],
            {},
            r"$.messaging.local.endpoints[1]",
            r"repeats endpoints\[0\]",
        ),
        (
            ["mqtts://n1.local", "mqtt://n2.local"],
            {"credentials": {"caPath": "/etc/ca.pem"}},
            "$.messaging.local.endpoints",
            "mixes mqtt:// and mqtts://",
        ),
        (["mqtts://n1.local"], {}, "$.messaging.local.endpoints[0]", "needs credentials.caPath"),
        (
            ["mqtt://n1.local"],
            {"credentials": {"caPath": "/etc/ca.pem"}},
            "$.messaging.local.endpoints[0]",
            "use mqtts://",
        ),
        (["mqtt://n1.local"], {"host": "n0.local"}, "$.messaging.local", "not both"),
        (
            ["mqtt://n1.local"],
            {"failoverGraceSeconds": -1},
            "$.messaging.local.failoverGraceSeconds",
            ">= 0",
        ),
    ],
    ids=[
        "empty",
        "no-scheme",
        "port-0",
        "path",
        "no-host",
        "duplicate",
        "mixed-tls",
        "tls-without-ca",
        "plaintext-with-ca",
        "host-and-endpoints",
        "negative-grace",
    ],
)
def test_a_bad_endpoint_list_is_refused_with_its_path(
    endpoints: object, local: dict, path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _config(_endpoints(endpoints, **local))
    issues = [(issue.path, issue.message) for issue in refused.value.issues]
    assert any(p.startswith(path) and re.search(message, m) for p, m in issues), issues


def test_the_northbound_broker_takes_an_endpoint_list_too() -> None:
    document = patched(
        {"messaging": {"northbound": {"endpoints": ["mqtt://c1.local", "mqtt://c2.local"]}}}
    )
    northbound = _config(document).messaging.northbound
    assert northbound is not None
    assert northbound.addresses == (("c1.local", 1883), ("c2.local", 1883))
