"""The ethernet-ip-adapter's configuration: schema, the rules a schema cannot say, precedence
and connection defaults. No I/O."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unskit.cip.component import EthernetIpAdapter
from unskit.cip.config import parse_component, push_settings
from unskit.config.loader import resolve_config
from unskit.config.platform import Platform
from unskit.errors import ConfigError
from unskit.southbound.driver import PublishMode


def signal(name: str = "speed", **settings: Any) -> dict[str, Any]:
    return {"name": name, "tagPath": name.title(), "type": "REAL", **settings}


def poll_instance(instance_id: str = "plc-1", *signals: dict[str, Any], **settings: Any):
    return {
        "id": instance_id,
        "connection": {"endpoint": "127.0.0.1"},
        "pollGroups": [{"signals": list(signals) or [signal()]}],
        **settings,
    }


def push_instance(**io: Any) -> dict[str, Any]:
    return {
        "id": "io-1",
        "mode": "push",
        "connection": {"endpoint": "127.0.0.1"},
        "io": {
            "rpiMs": 10,
            "assemblies": {"input": 100, "output": 150},
            "input": {
                "sizeBytes": 8,
                "signals": [{"name": "level", "offset": 0, "type": "DINT"}],
            },
            **io,
        },
    }


def config(*instances: dict[str, Any], **component: Any):
    document = {
        "component": {"instances": list(instances), **component},
        "messaging": {"local": {"host": "127.0.0.1", "port": 1883}},
    }
    return resolve_config(
        document,
        thing="gw",
        platform=Platform.HOST,
        component_schema=EthernetIpAdapter.schema,
        default_component=EthernetIpAdapter.token,
    )


def skipped_issues(entry: dict[str, Any]) -> list[str]:
    candidate = parse_component(config(poll_instance("good"), entry))
    assert [spec.id for spec in candidate.specs] == ["good"], "the valid instance still runs"
    (skipped,) = candidate.skipped
    return [str(issue) for issue in skipped.issues]


COMPONENT = ("--component", "ethernet-ip-adapter")

BAD_INSTANCES = [
    (
        "string type",
        poll_instance("p", signal(type="STRING")),
        "$.component.instances[1].pollGroups[0].signals[0].type",
    ),
    (
        "structure type",
        poll_instance("p", signal(type="UDT_Motor")),
        "$.component.instances[1].pollGroups[0].signals[0].type",
    ),
    (
        "multi-dimensional array",
        poll_instance("p", signal(tagPath="Grid[1,2]")),
        "$.component.instances[1].pollGroups[0].signals[0].tagPath",
    ),
    (
        "arrayCount 0",
        poll_instance("p", signal(arrayCount=0)),
        "$.component.instances[1].pollGroups[0].signals[0].arrayCount",
    ),
    (
        "arrayCount 65536",
        poll_instance("p", signal(arrayCount=65536)),
        "$.component.instances[1].pollGroups[0].signals[0].arrayCount",
    ),
    (
        "scale on BOOL",
        poll_instance("p", signal(type="BOOL", scale=2)),
        "$.component.instances[1].pollGroups[0].signals[0].scale",
    ),
    (
        "deadband on BOOL",
        poll_instance("p", signal(type="BOOL", deadband={"type": "absolute", "value": 1})),
        "$.component.instances[1].pollGroups[0].signals[0].deadband",
    ),
    (
        "negative deadband",
        poll_instance("p", signal(deadband={"type": "absolute", "value": -1})),
        "$.component.instances[1].pollGroups[0].signals[0].deadband.value",
    ),
    (
        "duplicate signal name",
        poll_instance("p", signal("a"), signal("a", tagPath="Other")),
        "$.component.instances[1].pollGroups[0].signals[1].name",
    ),
    (
        "duplicate tagPath",
        poll_instance("p", signal("a", tagPath="T"), signal("b", tagPath="T")),
        "$.component.instances[1].pollGroups[0].signals[1].tagPath",
    ),
    (
        "name not kebab",
        poll_instance("p", signal("Speed_1")),
        "$.component.instances[1].pollGroups[0].signals[0].name",
    ),
    ("unknown key", poll_instance("p", colour="red"), "$.component.instances[1]"),
    ("slot 256", {**poll_instance("p"), "connection": {"endpoint": "h", "slot": 256}}, "slot"),
    (
        "port out of range",
        {**poll_instance("p"), "connection": {"endpoint": "h:70000"}},
        "$.component.instances[1].connection.endpoint",
    ),
    (
        "port 65535 (pycomm3 refuses it)",
        {**poll_instance("p"), "connection": {"endpoint": "h:65535"}},
        "$.component.instances[1].connection.endpoint",
    ),
    ("poll without pollGroups", {"id": "p", "connection": {"endpoint": "h"}}, "pollGroups"),
    ("poll with io", {**poll_instance("p"), "io": push_instance()["io"]}, "instances[1].io"),
    ("push without io", {"id": "p", "mode": "push", "connection": {"endpoint": "h"}}, ".io"),
    (
        "push with pollGroups",
        {**push_instance(), "pollGroups": [{"signals": [signal()]}]},
        "instances[1].pollGroups",
    ),
    (
        "push with tls",
        {
            **push_instance(),
            "connection": {
                "endpoint": "h",
                "security": {"mode": "tls", "client": {"certSecret": "id"}},
            },
        },
        "security.mode",
    ),
    (
        "mixed client credential styles",
        poll_instance(
            "p",
            connection={
                "endpoint": "h",
                "security": {"client": {"certSecret": "id", "certFile": "/c", "keyFile": "/k"}},
            },
        ),
        "security.client",
    ),
    (
        "mixed CA styles",
        poll_instance(
            "p",
            connection={"endpoint": "h", "security": {"ca": {"secret": "ca", "file": "/ca"}}},
        ),
        "security.ca",
    ),
    (
        "tls without a client identity",
        poll_instance("p", connection={"endpoint": "h", "security": {"mode": "tls"}}),
        "security.client",
    ),
    (
        "tls verifying without trust anchors",
        poll_instance(
            "p",
            connection={
                "endpoint": "h",
                "security": {"mode": "tls", "client": {"certFile": "/c", "keyFile": "/k"}},
            },
        ),
        "security.ca",
    ),
    (
        "est enabled without server",
        poll_instance("p", connection={"endpoint": "h", "security": {"est": {"enabled": True}}}),
        "security.est",
    ),
    (
        "est over plain http",
        poll_instance(
            "p",
            connection={"endpoint": "h", "security": {"est": {"server": "http://est"}}},
        ),
        "security.est.server",
    ),
    (
        "write allow-list naming no signal",
        poll_instance("p", writes={"allow": ["Nope"]}),
        "writes.allow[0]",
    ),
    (
        "field outside sizeBytes",
        push_instance(
            input={"sizeBytes": 4, "signals": [{"name": "x", "offset": 2, "type": "DINT"}]}
        ),
        "io.input.signals[0].offset",
    ),
    (
        "bit on a non-BOOL field",
        push_instance(
            input={"sizeBytes": 4, "signals": [{"name": "x", "offset": 0, "type": "INT", "bit": 1}]}
        ),
        "io.input.signals[0].bit",
    ),
    (
        "heartbeat output with signals",
        push_instance(
            output={"sizeBytes": 0, "signals": [{"name": "y", "offset": 0, "type": "SINT"}]}
        ),
        "io.output.signals",
    ),
    (
        "deadband on an output field",
        push_instance(
            output={
                "sizeBytes": 2,
                "signals": [
                    {"name": "y", "offset": 0, "type": "INT", "deadband": {"type": "none"}}
                ],
            }
        ),
        "io.output.signals[0]",
    ),
    ("bad timeoutMultiplier", push_instance(timeoutMultiplier=5), "io.timeoutMultiplier"),
]


@pytest.mark.parametrize(
    ("entry", "path"), [row[1:] for row in BAD_INSTANCES], ids=[row[0] for row in BAD_INSTANCES]
)
def test_a_malformed_instance_is_skipped_with_its_json_path(entry, path) -> None:
    issues = skipped_issues(entry)
    assert issues, "at least one issue"
    assert any(path in issue for issue in issues), issues


def test_a_valid_push_instance_parses_with_its_io_and_socket_settings() -> None:
    candidate = parse_component(
        config(
            poll_instance("good"),
            push_instance(),
            **{
                "global": {
                    "implicitIo": {
                        "udpPort": 0,
                        "bindAddress": "127.0.0.1",
                        "multicastInterface": "127.0.0.1",
                    }
                }
            },
        )
    )
    assert candidate.skipped == []
    push = next(spec for spec in candidate.specs if spec.id == "io-1")
    settings = push_settings(push)
    assert (settings.udp_port, settings.bind_address) == (0, "127.0.0.1")
    assert settings.multicast_interface == "127.0.0.1"
    assert settings.io["assemblies"] == {"input": 100, "output": 150}
    assert (settings.publish_mode, settings.batch_ms) == ("onChange", 0)
    assert push.poll_groups == []


def test_the_class1_socket_defaults_to_udp_2222_on_every_address() -> None:
    (_, push) = parse_component(config(poll_instance("good"), push_instance())).specs
    assert (push_settings(push).udp_port, push_settings(push).bind_address) == (2222, "0.0.0.0")


@pytest.mark.parametrize(
    ("allow", "accepted", "message"),
    [
        ("a150/0/INT", True, ""),
        ("a150/run", True, ""),
        ("a100/0/DINT", False, "input (T-to-O) field"),
        ("a150/2/INT", False, "not a signal id"),
    ],
)
def test_push_writes_allow_output_fields_and_run_only(allow, accepted, message) -> None:
    entry = push_instance(
        output={"sizeBytes": 2, "signals": [{"name": "y", "offset": 0, "type": "INT"}]}
    )
    entry["writes"] = {"allow": [allow]}
    candidate = parse_component(config(poll_instance("good"), entry))
    if accepted:
        assert candidate.skipped == []
    else:
        (skipped,) = candidate.skipped
        assert skipped.issues[0].path == "$.component.instances[1].writes.allow[0]"
        assert message in skipped.issues[0].message


def test_a_heartbeat_or_modeless_output_has_no_run_field() -> None:
    entry = push_instance(output={"sizeBytes": 0, "realTimeFormat": "heartbeat"})
    entry["writes"] = {"allow": ["a150/run"]}
    (skipped,) = parse_component(config(poll_instance("good"), entry)).skipped
    assert "not a signal id" in skipped.reason


def test_push_mode_needs_the_ethernet_ip_adapter() -> None:
    issues = skipped_issues({**push_instance(), "adapter": "sim"})
    assert any("adapter" in issue and "ethernet-ip adapter only" in issue for issue in issues)


def test_duplicate_ids_the_first_wins() -> None:
    first = poll_instance("plc-1", signal("first"))
    candidate = parse_component(config(first, poll_instance("plc-1", signal("second"))))
    assert [s.name for s in candidate.specs[0].signals()] == ["first"]
    assert candidate.skipped[0].issues[0].path == "$.component.instances[1].id"


@pytest.mark.parametrize(
    ("component", "path"),
    [
        ({"global": {"defaults": {"pollIntervalMs": 0}}}, "$.component.global.defaults"),
        ({"global": {"timing": {"connectMs": "5s"}}}, "$.component.global.timing.connectMs"),
        ({"global": {"colour": 1}}, "$.component.global"),
        ({"instances": []}, "$.component.instances"),
    ],
)
def test_a_malformed_global_section_rejects_the_document(component, path) -> None:
    document: dict[str, Any] = {"instances": [poll_instance()], **component}
    with pytest.raises(ConfigError) as raised:
        config(*document.pop("instances"), **document)
    assert any(issue.path.startswith(path) for issue in raised.value.issues), raised.value


def test_precedence_signal_group_device_global_builtin() -> None:
    entry = poll_instance(
        "plc-1",
        defaults={"pollIntervalMs": 300, "batchMs": 50},
    )
    entry["pollGroups"] = [
        {"id": "g1", "pollIntervalMs": 100, "publishMode": "always", "signals": [signal("a")]},
        {"signals": [signal("b")]},
    ]
    bare = poll_instance("plc-2")
    global_ = {"defaults": {"publishMode": "always", "batchMs": 20}}
    candidate = parse_component(config(entry, bare, **{"global": global_}))
    one, two = candidate.specs
    g1, g2 = one.poll_groups
    assert (g1.id, g1.interval_ms) == ("g1", 100), "group over device"
    assert (g2.id, g2.interval_ms) == ("group-2", 300), "device over built-in"
    assert g1.signals[0].publish_mode is PublishMode.ALWAYS
    assert g1.signals[0].batch_ms == 50, "device over global"
    (bare_group,) = two.poll_groups
    assert bare_group.interval_ms == 5000, "built-in"
    assert bare_group.signals[0].publish_mode is PublishMode.ALWAYS, "global over built-in"
    assert bare_group.signals[0].batch_ms == 20


@pytest.mark.parametrize(
    ("connection", "endpoint"),
    [
        ({"endpoint": "10.1.2.3"}, "10.1.2.3:44818"),
        ({"endpoint": "plc.local:2222"}, "plc.local:2222"),
        ({"endpoint": "[::1]"}, "[::1]:44818"),
        (
            {
                "endpoint": "10.1.2.3",
                "security": {
                    "mode": "tls",
                    "client": {"certSecret": "bundle-with-ca"},
                },
            },
            "10.1.2.3:2221",
        ),
    ],
)
def test_endpoint_default_ports(connection, endpoint) -> None:
    entry = poll_instance("plc-1")
    entry["connection"] = connection
    (spec,) = parse_component(config(entry)).specs
    assert spec.endpoint == endpoint


def test_timing_thresholds_and_metrics_come_from_global() -> None:
    global_ = {
        "timing": {"connectMs": 700, "reconnectBackoffMinMs": 10, "reconnectBackoffMaxMs": 90},
        "thresholds": {"staleSignalSecs": 9},
        "metrics": {"metricsIntervalSecs": 7},
    }
    (spec,) = parse_component(config(poll_instance(), **{"global": global_})).specs
    assert spec.timing.connect_ms == 700
    assert spec.timing.request_timeout_ms == 2000, "built-in"
    assert (spec.timing.reconnect_backoff_min_ms, spec.timing.reconnect_backoff_max_ms) == (10, 90)
    assert spec.timing.stale_signal_secs == 9
    assert spec.timing.metrics_interval_secs == 7


def test_bool_arrays_warn_that_they_are_experimental(caplog) -> None:
    parse_component(config(poll_instance("plc-1", signal(type="BOOL", arrayCount=16))))
    assert "experimental" in caplog.text


def _string_type(entry: dict[str, Any]) -> str:
    entry["pollGroups"][0]["signals"][0]["type"] = "STRING"
    return "$.component.instances[0].pollGroups[0].signals[0].type"


def _cbc_suite(entry: dict[str, Any]) -> str:
    entry["connection"]["security"] = {
        "mode": "tls",
        "client": {"certSecret": "bundle"},
        "cipherSuites": ["TLS_AES_128_GCM_SHA256", "TLS_RSA_WITH_AES_128_CBC_SHA"],
    }
    return "$.component.instances[0].connection.security.cipherSuites[1]: 'TLS_RSA_WITH"


@pytest.mark.integration
@pytest.mark.parametrize("breaks", [_string_type, _cbc_suite], ids=["malformed", "tls-suite"])
def test_validate_reports_an_instance_that_would_not_run_with_its_path(
    tmp_path: Path, breaks
) -> None:
    example = Path(__file__).parents[2] / "examples" / "ethernet-ip-adapter.json"
    document = json.loads(example.read_text())
    broken = copy.deepcopy(document)
    expected = breaks(broken["component"]["instances"][0])
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    result = subprocess.run(
        [sys.executable, "-m", "unskit.cli", "validate", "-c", str(path), "-t", "gw", *COMPONENT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr


def test_a_tls_instance_parses_on_port_2221() -> None:
    security = {"mode": "tls", "client": {"certSecret": "bundle"}}
    tls = poll_instance("plc-tls", connection={"endpoint": "10.0.0.9", "security": security})
    document = config(poll_instance("good"), tls)
    good, secured = parse_component(document).specs
    assert good.unavailable is None
    assert secured.unavailable is None
    assert secured.endpoint == "10.0.0.9:2221"
    assert EthernetIpAdapter.configuration_issues(document) == []
