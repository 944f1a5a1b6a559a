"""The opcua-adapter's configuration: schema, the rules a schema cannot say, resolution order,
security defaults and path templates. No I/O."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from unskit.config.loader import resolve_config
from unskit.config.model import ComponentConfig
from unskit.config.platform import Platform
from unskit.config.secrets import SecretRef
from unskit.config.templates import path_template_variables, render_path_template
from unskit.errors import ConfigError
from unskit.opcua.config import (
    SECURITY_POLICIES,
    TOKEN,
    ClientCertificate,
    OpcUaSettings,
    Pkcs11Key,
    ServerCertificatePin,
    UserToken,
    component_schema,
    opcua_settings,
    parse_component,
)
from unskit.southbound.component import Candidate, SouthboundComponent
from unskit.southbound.driver import InstanceSpec, Timing

EXAMPLE = Path(__file__).parents[2] / "examples" / "opcua-adapter.json"
ENDPOINT = "opc.tcp://127.0.0.1:4840/unskit/"
FILE_CERT = {"source": "file", "certPath": "/etc/ua/cert.der", "keyPath": "/etc/ua/key.pem"}
AT = "$.component.instances[1]"


def instance(instance_id: str = "line1", **settings: Any) -> dict[str, Any]:
    return {"id": instance_id, "connection": {"endpoint": ENDPOINT}, **settings}


def with_connection(instance_id: str = "bad", **connection: Any) -> dict[str, Any]:
    return instance(instance_id, connection={"endpoint": ENDPOINT, **connection})


def config(*instances: dict[str, Any], document: Any = None, **component: Any) -> ComponentConfig:
    full = {
        "component": {"instances": list(instances), **component},
        "messaging": {"local": {"host": "127.0.0.1", "port": 1883}},
        **(document or {}),
    }
    return resolve_config(
        full,
        thing="gw",
        platform=Platform.HOST,
        component_schema=component_schema(),
        default_component=TOKEN,
    )


def parse(*instances: dict[str, Any], **component: Any) -> Candidate:
    return parse_component(config(*instances, **component))


def only(*instances: dict[str, Any], **component: Any) -> InstanceSpec:
    candidate = parse(*instances, **component)
    assert candidate.skipped == []
    (spec,) = candidate.specs
    return spec


def settings_of(entry: dict[str, Any], **component: Any) -> OpcUaSettings:
    return opcua_settings(only(entry, **component))


def skipped_paths(entry: dict[str, Any], document: Any = None) -> dict[str, str]:
    """The issues of `entry` (second in the list) by path; the first, valid one still runs."""
    candidate = parse_component(config(instance("good"), entry, document=document))
    assert [spec.id for spec in candidate.specs] == ["good"], "the valid instance still runs"
    (skipped,) = candidate.skipped
    assert skipped.issues
    return {issue.path: issue.message for issue in skipped.issues}


# -- defaults ---------------------------------------------------------------------------------


def test_a_minimal_entry_gets_every_default() -> None:
    entry = instance()
    spec = only(entry)
    assert (spec.id, spec.adapter, spec.endpoint) == ("line1", "opcua", ENDPOINT)
    assert tuple(spec.poll_groups) == ()
    assert spec.writes_allow == frozenset()
    assert spec.entry == entry
    assert spec.unavailable is None
    assert spec.timing == Timing(stale_signal_secs=30)
    settings = opcua_settings(spec)
    assert settings is spec.settings
    assert settings.subscriptions == ()
    assert settings.batch_ms == 1000
    assert settings.writes_any is False
    connection = settings.connection
    assert (connection.endpoint, connection.security_policy, connection.message_mode) == (
        ENDPOINT,
        "None",
        "None",
    )
    assert connection.secure is False
    assert (connection.application_uri, connection.user, connection.client_certificate) == (
        None,
        None,
        None,
    )
    assert (connection.trust.pki_dir, connection.trust.server_certificate) == ("pki/line1", None)


def test_a_subscription_and_matcher_get_every_default() -> None:
    settings = settings_of(instance(subscriptions=[{"include": [{}]}, {}]))
    first, second = settings.subscriptions
    assert uuid.UUID(first.id).version == 4
    assert uuid.UUID(second.id).version == 4
    assert first.id != second.id, "each subscription gets its own random id"
    assert first.publish_interval_ms == 1000.0
    assert (first.exclude, second.include, second.exclude) == ((), (), ())
    (matcher,) = first.include
    assert matcher.path == "$.component.instances[0].subscriptions[0].include[0]"
    assert (matcher.namespace_uri, matcher.namespace, matcher.match.pattern) == (None, 0, ".*")
    assert (matcher.sampling_rate_ms, matcher.queue_size) == (0.0, 100)
    assert (matcher.deadband.type, matcher.deadband.value) == ("None", 0.0)


def test_matcher_keys_are_carried() -> None:
    matcher = {
        "namespaceUri": "urn:unskit:sim",
        "namespace": 3,
        "match": "^Temp",
        "deadband": {"type": "Percent", "value": 2.5},
    }
    settings = settings_of(
        instance(subscriptions=[{"id": "s", "include": [matcher], "exclude": [{"match": "x"}]}])
    )
    (subscription,) = settings.subscriptions
    assert subscription.id == "s"
    (include,) = subscription.include
    assert (include.namespace_uri, include.namespace, include.match.pattern) == (
        "urn:unskit:sim",
        3,
        "^Temp",
    )
    assert (include.deadband.type, include.deadband.value) == ("Percent", 2.5)
    assert [m.match.pattern for m in subscription.exclude] == ["x"]
    assert subscription.exclude[0].path.endswith(".subscriptions[0].exclude[0]")


def test_global_timing_thresholds_and_metrics_are_mapped() -> None:
    spec = only(
        instance(),
        **{
            "global": {
                "timing": {
                    "connectMs": 1500,
                    "requestTimeoutMs": 700,
                    "reconnectBackoffMinMs": 2000,
                    "reconnectBackoffMaxMs": 1000,
                    "keepaliveProbeIntervalMs": 9000,
                },
                "healthThresholds": {"staleSignalSecs": 7},
                "metrics": {"metricsIntervalSecs": 15},
            }
        },
    )
    assert spec.timing == Timing(
        connect_ms=1500,
        request_timeout_ms=700,
        reconnect_backoff_min_ms=2000,
        reconnect_backoff_max_ms=2000,  # raised to the minimum
        stale_signal_secs=7,
        keepalive_probe_interval_ms=9000,
        metrics_interval_secs=15,
    )


# -- resolution order -------------------------------------------------------------------------

LAYERS = ("own", "instance", "global", "builtin")
VALUES = {"own": 7, "instance": 5, "global": 3}


def _layered(key: str, top: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An entry and component with `key` set at `top` and every layer below it."""
    present = LAYERS[LAYERS.index(top) :]
    own = {key: VALUES["own"]} if "own" in present else {}
    # publishIntervalMs sits on the subscription, the other two on the matcher.
    on_subscription = key == "publishIntervalMs"
    subscription = {**own, "include": [{}]} if on_subscription else {"include": [own]}
    entry = instance(subscriptions=[subscription])
    if "instance" in present:
        entry["defaults"] = {key: VALUES["instance"]}
    component = {"global": {"defaults": {key: VALUES["global"]}}} if "global" in present else {}
    return entry, component


@pytest.mark.parametrize("top", LAYERS)
@pytest.mark.parametrize(
    ("key", "builtin", "read"),
    [
        ("publishIntervalMs", 1000, lambda s: s.publish_interval_ms),
        ("samplingRateMs", 0, lambda s: s.include[0].sampling_rate_ms),
        ("queueSize", 100, lambda s: s.include[0].queue_size),
    ],
    ids=["publishIntervalMs", "samplingRateMs", "queueSize"],
)
def test_resolution_order(key: str, builtin: int, read: Any, top: str) -> None:
    """matcher (subscription for publishIntervalMs) > instance > global > built-in."""
    entry, component = _layered(key, top)
    (subscription,) = settings_of(entry, **component).subscriptions
    assert read(subscription) == VALUES.get(top, builtin)


@pytest.mark.parametrize(
    ("entry_settings", "component", "expected"),
    [
        ({}, {}, 1000),
        ({}, {"global": {"defaults": {"publishIntervalMs": 400}}}, 400),
        ({"defaults": {"publishIntervalMs": 250.7}}, {}, 250),
        # A subscription's own interval is not the instance's.
        ({"subscriptions": [{"publishIntervalMs": 50}]}, {}, 1000),
        ({"defaults": {"publishIntervalMs": 250}, "publish": {"batchMs": 0}}, {}, 0),
        ({"publish": {"batchMs": 5000}}, {}, 5000),
    ],
    ids=["built-in", "global", "instance", "not-subscription", "explicit-0", "explicit"],
)
def test_batch_ms_defaults_to_the_instance_publish_interval(
    entry_settings: dict[str, Any], component: dict[str, Any], expected: int
) -> None:
    assert settings_of(instance(**entry_settings), **component).batch_ms == expected


# -- writes -----------------------------------------------------------------------------------


def test_a_wildcard_allows_every_write() -> None:
    spec = only(instance(writes={"allow": ["*"]}))
    assert opcua_settings(spec).writes_any is True
    assert spec.writes_allow == frozenset({"*"})


def test_an_allow_list_names_stable_ids() -> None:
    allow = ["ns=2;s=Setpoint", "ns=0;i=2258", "ns=4;g=72962b91-fa75-4ae6-8d28-b404dc7daf63"]
    spec = only(instance(writes={"allow": allow}))
    assert opcua_settings(spec).writes_any is False
    assert spec.writes_allow == frozenset(allow)


# -- security ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [p for p in SECURITY_POLICIES if p != "None"])
def test_message_mode_none_is_upgraded_under_a_secure_policy(policy: str) -> None:
    for given in ({}, {"messageMode": "None"}):
        connection = settings_of(
            with_connection("a", securityPolicy=policy, clientCertificate=FILE_CERT, **given)
        ).connection
        assert (connection.security_policy, connection.message_mode) == (policy, "SignAndEncrypt")
        assert connection.secure


def test_message_mode_sign_is_kept_under_a_secure_policy() -> None:
    connection = settings_of(
        with_connection(
            "a",
            securityPolicy="Basic256Sha256",
            messageMode="Sign",
            clientCertificate=FILE_CERT,
            applicationUri="urn:gw:unskit",
        )
    ).connection
    assert (connection.message_mode, connection.application_uri) == ("Sign", "urn:gw:unskit")


def test_an_unknown_policy_falls_back_to_none_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="unskit.opcua.config"):
        connection = settings_of(with_connection("a", securityPolicy="Basic128Rsa15")).connection
    assert (connection.security_policy, connection.message_mode) == ("None", "None")
    (record,) = [r for r in caplog.records if "securityPolicy" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "$.component.instances[0].connection.securityPolicy" in record.getMessage()
    assert "'Basic128Rsa15'" in record.getMessage()
    assert "falling back to None" in record.getMessage()


def test_a_known_policy_logs_no_fallback(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="unskit.opcua.config"):
        settings_of(with_connection("a", securityPolicy="None"))
    assert caplog.records == []


def test_an_inline_user_token_stays_out_of_repr() -> None:
    user = settings_of(
        with_connection("a", user={"username": "operator", "password": "s3cret-pw"})
    ).connection.user
    assert user == UserToken("operator", "s3cret-pw")
    assert "s3cret-pw" not in repr(user)


VAULT = {"credentials": {"vaultPath": "/nonexistent/vault.enc"}}


def test_a_vault_user_token_reads_username_and_password_of_one_secret() -> None:
    spec = parse_component(
        config(with_connection("a", user={"source": "vault", "secret": "ua-user"}), document=VAULT)
    ).specs[0]
    assert opcua_settings(spec).connection.user == UserToken(
        SecretRef("ua-user", "username"), SecretRef("ua-user", "password")
    )


def test_an_inline_user_may_take_secret_references() -> None:
    user = {"username": "operator", "password": {"$secret": "ua-pw"}}
    spec = parse_component(config(with_connection("a", user=user), document=VAULT)).specs[0]
    assert opcua_settings(spec).connection.user == UserToken("operator", SecretRef("ua-pw"))


def test_a_secret_reference_without_credentials_is_refused_with_its_path() -> None:
    user = {"username": "operator", "password": {"$secret": "ua-pw"}}
    with pytest.raises(ConfigError) as caught:
        config(with_connection("a", user=user))
    assert "$.component.instances[0].connection.user.password" in {
        issue.path for issue in caught.value.issues
    }


def test_vault_sourced_certificate_and_pin() -> None:
    entry = with_connection(
        "a",
        securityPolicy="Aes256_Sha256_RsaPss",
        clientCertificate={"source": "vault", "secret": "ua-bundle"},
        trust={"serverCertificate": {"source": "vault", "secret": "ua-server"}},
    )
    connection = opcua_settings(parse_component(config(entry, document=VAULT)).specs[0]).connection
    assert connection.client_certificate == ClientCertificate(
        "vault", secret=SecretRef("ua-bundle")
    )
    assert connection.trust.server_certificate == ServerCertificatePin(
        "vault", secret=SecretRef("ua-server", "caPem")
    )
    entry["connection"]["trust"]["serverCertificate"]["field"] = "serverPem"
    connection = opcua_settings(parse_component(config(entry, document=VAULT)).specs[0]).connection
    assert connection.trust.server_certificate == ServerCertificatePin(
        "vault", secret=SecretRef("ua-server", "serverPem")
    )


def test_pkcs11_key_defaults() -> None:
    certificate = {"source": "pkcs11", "modulePath": "/usr/lib/softhsm/libsofthsm2.so"}
    for extra, expected in (
        (
            {"keyLabel": "ua", "pinEnv": "UA_PIN"},
            Pkcs11Key("/usr/lib/softhsm/libsofthsm2.so", 0, None, "UA_PIN", "ua", "ua"),
        ),
        (
            {"keyLabel": "ua", "pin": "1234", "slotIndex": 2, "certLabel": "ua-cert"},
            Pkcs11Key("/usr/lib/softhsm/libsofthsm2.so", 2, "1234", None, "ua", "ua-cert"),
        ),
    ):
        connection = settings_of(
            with_connection(
                "a",
                securityPolicy="Basic256Sha256",
                clientCertificate={**certificate, **extra},
            )
        ).connection
        assert connection.client_certificate == ClientCertificate("pkcs11", pkcs11=expected)
        assert "1234" not in repr(connection)


# -- path templates ---------------------------------------------------------------------------

TEMPLATED = {
    "hierarchy": {"levels": ["site", "device"]},
    "identity": {"site": "plant-1"},
    "tags": {"line": "l7", "ThingName": "shadowed"},
}


def test_path_templates_are_rendered() -> None:
    entry = with_connection(
        "cell-2",
        securityPolicy="Basic256Sha256",
        clientCertificate={
            "source": "file",
            "certPath": "certs/{ThingName}/{InstanceId}.der",
            "keyPath": "certs/{line}/{ComponentName}.pem",
        },
        trust={
            "pkiDir": "pki/{ComponentFullName}/{InstanceId}",
            "serverCertificate": {"source": "file", "path": "pins/{line}/{InstanceId}.der"},
        },
    )
    connection = opcua_settings(
        parse_component(config(entry, document=TEMPLATED, token="ua")).specs[0]
    ).connection
    assert connection.client_certificate == ClientCertificate(
        "file", cert_path="certs/gw/cell-2.der", key_path="certs/l7/ua.pem"
    )
    # A built-in variable wins over a tag of the same name.
    assert connection.trust.pki_dir == "pki/plant-1/gw/ua/cell-2"
    assert connection.trust.server_certificate == ServerCertificatePin(
        "file", path="pins/l7/cell-2.der"
    )


def test_template_variables() -> None:
    variables = path_template_variables(config(instance(), document=TEMPLATED), "line1")
    assert variables == {
        "ThingName": "gw",
        "ComponentName": "opcua-adapter",
        "ComponentFullName": "plant-1/gw/opcua-adapter",
        "InstanceId": "line1",
        "line": "l7",
    }
    assert "InstanceId" not in path_template_variables(config(instance()))


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("pki/{Instance}", "unknown template variable {Instance}"),
        ("pki/{}", "unknown template variable {}"),
        ("pki/{InstanceId", "brace"),
        ("pki/InstanceId}", "brace"),
    ],
)
def test_a_bad_template_is_refused_with_its_path(template: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        render_path_template(template, {"InstanceId": "a"}, "$.x.pkiDir")
    (issue,) = caught.value.issues
    assert issue.path == "$.x.pkiDir"
    assert message in issue.message


# -- rules, each with its JSON path -----------------------------------------------------------

SECURE = {"securityPolicy": "Basic256Sha256"}
C = f"{AT}.connection"
S = f"{AT}.subscriptions[0]"

BAD_INSTANCES = [
    ("typo key", instance("bad", subscription=[]), [f"{AT}.subscription"]),
    ("typo in connection", with_connection(securitypolicy="None"), [f"{C}.securitypolicy"]),
    (
        "typo in a matcher",
        instance("bad", subscriptions=[{"include": [{"namespaceURI": "urn:x"}]}]),
        [f"{S}.include[0].namespaceURI"],
    ),
    ("id not kebab", instance("Line_1"), [f"{AT}.id"]),
    ("no connection", {"id": "bad"}, [f"{C}"]),
    ("no endpoint", {"id": "bad", "connection": {}}, [f"{C}.endpoint"]),
    ("not opc.tcp", with_connection(endpoint="http://h:4840/"), [f"{C}.endpoint"]),
    ("port 0", with_connection(endpoint="opc.tcp://h:0/"), [f"{C}.endpoint"]),
    ("port 70000", with_connection(endpoint="opc.tcp://h:70000/"), [f"{C}.endpoint"]),
    ("message mode enum", with_connection(messageMode="Encrypt"), [f"{C}.messageMode"]),
    (
        "invalid include regex",
        instance("bad", subscriptions=[{"include": [{}, {"match": "Temp[0-"}]}]),
        [f"{S}.include[1].match"],
    ),
    (
        "invalid exclude regex",
        instance("bad", subscriptions=[{"id": "x"}, {"exclude": [{"match": "(a"}]}]),
        [f"{AT}.subscriptions[1].exclude[0].match"],
    ),
    (
        "duplicate subscription id",
        instance("bad", subscriptions=[{"id": "a"}, {"id": "a"}]),
        [f"{AT}.subscriptions[1].id"],
    ),
    (
        "queueSize 0",
        instance("bad", subscriptions=[{"include": [{"queueSize": 0}]}]),
        [f"{S}.include[0].queueSize"],
    ),
    (
        "negative samplingRateMs",
        instance("bad", defaults={"samplingRateMs": -1}),
        [f"{AT}.defaults.samplingRateMs"],
    ),
    (
        "publishIntervalMs 0",
        instance("bad", subscriptions=[{"publishIntervalMs": 0}]),
        [f"{S}.publishIntervalMs"],
    ),
    (
        "deadband type case",
        instance("bad", subscriptions=[{"include": [{"deadband": {"type": "absolute"}}]}]),
        [f"{S}.include[0].deadband.type"],
    ),
    (
        "percent deadband over 100",
        instance(
            "bad", subscriptions=[{"include": [{"deadband": {"type": "Percent", "value": 101}}]}]
        ),
        [f"{S}.include[0].deadband.value"],
    ),
    ("batchMs negative", instance("bad", publish={"batchMs": -1}), [f"{AT}.publish.batchMs"]),
    (
        "allow-list id in another form",
        instance("bad", writes={"allow": ["ns=2;s=A", "nsu=urn:x;s=B"]}),
        [f"{AT}.writes.allow[1]"],
    ),
    ("secure without a certificate", with_connection(**SECURE), [f"{C}.clientCertificate"]),
    (
        "certificate under None",
        with_connection(clientCertificate=FILE_CERT),
        [f"{C}.clientCertificate"],
    ),
    ("applicationUri under None", with_connection(applicationUri="urn:x"), [f"{C}.applicationUri"]),
    ("Sign under None", with_connection(messageMode="Sign"), [f"{C}.messageMode"]),
    (
        "SignAndEncrypt under an unknown policy",
        with_connection(securityPolicy="Basic256", messageMode="SignAndEncrypt"),
        [f"{C}.messageMode"],
    ),
    (
        "user mixing inline and vault",
        with_connection(user={"username": "u", "password": "p", "source": "vault", "secret": "s"}),
        [f"{C}.user"],
    ),
    (
        "user password with a vault source",
        with_connection(user={"password": "p", "source": "vault", "secret": "s"}),
        [f"{C}.user"],
    ),
    ("user without password", with_connection(user={"username": "u"}), [f"{C}.user.password"]),
    ("vault user without secret", with_connection(user={"source": "vault"}), [f"{C}.user.secret"]),
    ("empty user", with_connection(user={}), [f"{C}.user"]),
    (
        "certificate mixing file and pkcs11",
        with_connection(**SECURE, clientCertificate={**FILE_CERT, "modulePath": "/m.so"}),
        [f"{C}.clientCertificate.modulePath"],
    ),
    (
        "certificate mixing vault and file",
        with_connection(
            **SECURE,
            clientCertificate={"source": "vault", "secret": "b", "certPath": "/c"},
        ),
        [f"{C}.clientCertificate.certPath"],
    ),
    (
        "file certificate without keyPath",
        with_connection(**SECURE, clientCertificate={"source": "file", "certPath": "/c"}),
        [f"{C}.clientCertificate.keyPath"],
    ),
    (
        "certificate without source",
        with_connection(**SECURE, clientCertificate={"certPath": "/c", "keyPath": "/k"}),
        [f"{C}.clientCertificate.source"],
    ),
    (
        "pkcs11 with pin and pinEnv",
        with_connection(
            **SECURE,
            clientCertificate={
                "source": "pkcs11",
                "modulePath": "/m.so",
                "keyLabel": "k",
                "pin": "1234",
                "pinEnv": "PIN",
            },
        ),
        [f"{C}.clientCertificate.pinEnv"],
    ),
    (
        "pkcs11 without pin or pinEnv",
        with_connection(
            **SECURE,
            clientCertificate={"source": "pkcs11", "modulePath": "/m.so", "keyLabel": "k"},
        ),
        [f"{C}.clientCertificate.pin"],
    ),
    (
        "pkcs11 without keyLabel",
        with_connection(
            **SECURE,
            clientCertificate={"source": "pkcs11", "modulePath": "/m.so", "pinEnv": "PIN"},
        ),
        [f"{C}.clientCertificate.keyLabel"],
    ),
    (
        "pin file with a vault secret",
        with_connection(
            trust={"serverCertificate": {"source": "file", "path": "/p", "secret": "s"}}
        ),
        [f"{C}.trust.serverCertificate.secret"],
    ),
    (
        "pin file with a field",
        with_connection(
            trust={"serverCertificate": {"source": "file", "path": "/p", "field": "f"}}
        ),
        [f"{C}.trust.serverCertificate.field"],
    ),
    (
        "pin file without path",
        with_connection(trust={"serverCertificate": {"source": "file"}}),
        [f"{C}.trust.serverCertificate.path"],
    ),
    (
        "unknown variable in pkiDir",
        with_connection(trust={"pkiDir": "pki/{Thing}"}),
        [f"{C}.trust.pkiDir"],
    ),
    (
        "unknown variable in certPath",
        with_connection(**SECURE, clientCertificate={**FILE_CERT, "certPath": "{Cert}.der"}),
        [f"{C}.clientCertificate.certPath"],
    ),
    (
        "unknown variable in the pin path",
        with_connection(trust={"serverCertificate": {"source": "file", "path": "{Pin}"}}),
        [f"{C}.trust.serverCertificate.path"],
    ),
]


@pytest.mark.parametrize(
    ("entry", "paths"),
    [pytest.param(entry, paths, id=name) for name, entry, paths in BAD_INSTANCES],
)
def test_a_malformed_instance_is_skipped_with_its_path(
    entry: dict[str, Any], paths: list[str]
) -> None:
    assert sorted(skipped_paths(entry, document=VAULT)) == sorted(paths)


WITHOUT_VAULT = [
    (
        "vault user without credentials",
        with_connection(user={"source": "vault", "secret": "u"}),
        [f"{C}.user.source"],
    ),
    (
        "vault certificate without credentials",
        with_connection(**SECURE, clientCertificate={"source": "vault", "secret": "b"}),
        [f"{C}.clientCertificate.source"],
    ),
    (
        "vault pin without credentials",
        with_connection(trust={"serverCertificate": {"source": "vault", "secret": "s"}}),
        [f"{C}.trust.serverCertificate.source"],
    ),
]


@pytest.mark.parametrize(
    ("entry", "paths"),
    [pytest.param(entry, paths, id=name) for name, entry, paths in WITHOUT_VAULT],
)
def test_a_vault_source_needs_the_credentials_section(
    entry: dict[str, Any], paths: list[str]
) -> None:
    issues = skipped_paths(entry)
    assert sorted(issues) == sorted(paths)
    assert all("credentials section" in message for message in issues.values())
    assert parse_component(config(entry, document=VAULT)).skipped == []


def test_the_fallback_is_named_when_an_unknown_policy_meets_a_secure_only_key() -> None:
    issues = skipped_paths(with_connection(securityPolicy="Basic256", clientCertificate=FILE_CERT))
    assert "'Basic256' is not one this build speaks" in issues[f"{C}.clientCertificate"]


def test_a_duplicate_id_is_skipped_and_the_first_wins() -> None:
    first = instance("line1", defaults={"publishIntervalMs": 10})
    candidate = parse(first, instance("line1"))
    (spec,) = candidate.specs
    assert spec.entry == first
    (skipped,) = candidate.skipped
    assert [(i.path, i.message) for i in skipped.issues] == [
        ("$.component.instances[1].id", "duplicate id: the first entry wins")
    ]


def test_no_valid_instance_leaves_no_spec() -> None:
    candidate = parse(instance("Bad_1"), with_connection("bad-2", messageMode="Sign"))
    assert candidate.specs == []
    assert [skipped.id for skipped in candidate.skipped] == ["Bad_1", "bad-2"]


def test_an_empty_instance_list_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        config()
    assert "$.component.instances" in {issue.path for issue in caught.value.issues}


def test_a_global_typo_rejects_the_document() -> None:
    with pytest.raises(ConfigError) as caught:
        config(instance(), **{"global": {"defaults": {"publishInterval": 5}}})
    assert [issue.path for issue in caught.value.issues] == [
        "$.component.global.defaults.publishInterval"
    ]


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        (instance(subscriptions=[{"include": [{"topic": "x/y"}]}]), "include[0].topic"),
        (with_connection("line1", trust={"autoTrustServerCert": True}), "autoTrustServerCert"),
    ],
    ids=["matcher topic", "autoTrustServerCert"],
)
def test_ignored_keys_are_accepted_with_a_warning(entry: dict[str, Any], key: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="unskit.opcua.config"):
        only(entry)
    (record,) = caplog.records
    assert key in record.getMessage()
    assert "ignored" in record.getMessage()


def test_opcua_settings_refuses_a_spec_of_another_adapter() -> None:
    with pytest.raises(TypeError, match="no OpcUaSettings"):
        opcua_settings(InstanceSpec("x", "sim", "h", ()))


def test_the_example_parses_as_documented() -> None:
    document = json.loads(EXAMPLE.read_text())
    candidate = parse_component(
        resolve_config(
            document,
            thing="gw-01",
            platform=Platform.HOST,
            component_schema=component_schema(),
            default_component=TOKEN,
        )
    )
    assert candidate.skipped == []
    (spec,) = candidate.specs
    assert (spec.id, spec.endpoint) == ("line1", "opc.tcp://127.0.0.1:4840/unskit/")
    assert spec.writes_allow == frozenset({"ns=2;s=Setpoint"})
    (subscription,) = opcua_settings(spec).subscriptions
    assert [m.namespace_uri for m in subscription.include] == ["urn:unskit:sim"]
    assert [m.match.pattern for m in subscription.exclude] == ["^Setpoint$"]


def test_configuration_issues_reports_skipped_entries_through_the_base_class() -> None:
    class Parser(SouthboundComponent):
        token = TOKEN
        schema = component_schema()

        def parse(self, config: ComponentConfig) -> Candidate:
            return parse_component(config)

    issues = Parser.configuration_issues(
        config(instance(), with_connection("bad", messageMode="Sign"))
    )
    assert [issue.path for issue in issues] == [f"{C}.messageMode"]
