"""`unskit validate` and `unskit vault`, run as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.mosquitto import Mosquitto
from tests.support.tiers import server_fixture

from .documents import ANY_COMPONENT_SCHEMA, DELETE, THING, base_document, patched

# Every test here runs the CLI as a process.
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

SECRET_VALUE = "cli-s3cret-do-not-print"


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("UNSKIT_", "AWS_IOT_", "KUBERNETES_"))
    }
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "unskit.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )


def validate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`unskit validate` of a TOKEN document: its component section is any object."""
    return run("validate", *args, "--schema", ANY_COMPONENT_SCHEMA, env=env)


def test_validate_valid_document_exits_0(write_json: Callable[..., Path]) -> None:
    path = write_json(base_document())
    result = validate("-c", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"OK: {path} is valid on HOST")
    assert result.stderr == ""


def test_validate_with_thing_shows_identity(write_json: Callable[..., Path]) -> None:
    path = write_json(base_document())
    result = validate("-c", str(path), "-t", THING)
    assert result.returncode == 0, result.stderr
    assert f"identity site/line/device = plant-1/line-4/{THING}" in result.stdout


def test_validate_thing_from_environment(write_json: Callable[..., Path]) -> None:
    path = write_json(base_document())
    result = validate("-c", str(path), env={"AWS_IOT_THING_NAME": "gg-thing"})
    assert result.returncode == 0, result.stderr
    assert "plant-1/line-4/gg-thing" in result.stdout


def test_validate_prints_every_error_with_its_path_and_exits_2(
    write_json: Callable[..., Path],
) -> None:
    document = patched(
        {
            "messaging": {"local": {"port": "1883"}, "requestTimeoutSeconds": -5},
            "identity": {"device": "x"},
            "metricEmission": {"targetConfig": {"topic": "m"}},
        }
    )
    path = write_json(document)
    result = validate("-c", str(path), "-t", THING)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == f"{path}: 4 configuration errors"
    paths = [line.split(":")[0].strip() for line in lines[1:]]
    assert paths == [
        "$.identity.device",
        "$.messaging.local.port",
        "$.messaging.requestTimeoutSeconds",
        "$.metricEmission.targetConfig.topic",
    ]


def test_validate_missing_local_broker_names_both_ways_out(
    write_json: Callable[..., Path],
) -> None:
    path = write_json(patched({"messaging": DELETE}))
    result = validate("-c", str(path))
    assert result.returncode == 2
    assert "$.messaging.local: is required" in result.stderr
    assert '"host": "embedded"' in result.stderr
    assert '"port"' in result.stderr


def test_validate_malformed_json_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"component": {}, }')
    result = validate("-c", str(path))
    assert result.returncode == 2
    assert "$: malformed JSON at line 1" in result.stderr


def test_validate_missing_file_exits_2(tmp_path: Path) -> None:
    result = validate("-c", str(tmp_path / "absent.json"))
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_validate_unknown_platform_exits_2(write_json: Callable[..., Path]) -> None:
    result = validate("-c", str(write_json(base_document())), "--platform", "MAINFRAME")
    assert result.returncode == 2
    assert "--platform" in result.stderr


def test_validate_bad_thing_name_exits_2(write_json: Callable[..., Path]) -> None:
    result = validate("-c", str(write_json(base_document())), "-t", "a/b")
    assert result.returncode == 2
    assert "-t/--thing: must be one non-empty topic level" in result.stderr


def test_validate_cluster_mounted_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(base_document()))
    result = validate("-c", str(tmp_path), "--platform", "CLUSTER", "-t", THING)
    assert result.returncode == 0, result.stderr
    assert "valid on CLUSTER" in result.stdout


def test_validate_edge_runtime_without_local_broker(write_json: Callable[..., Path]) -> None:
    # The local link is then the runtime's IPC bus; elsewhere the key is required.
    path = write_json(patched({"messaging": DELETE}))
    assert validate("-c", str(path), "--platform", "EDGE_RUNTIME").returncode == 0
    result = validate("-c", str(path), "--platform", "HOST")
    assert result.returncode == 2
    assert "$.messaging.local: is required" in result.stderr


def test_run_on_edge_runtime_outside_the_runtime_exits_2(write_json: Callable[..., Path]) -> None:
    # IPC, but no nucleus handed this process its variables: one line naming them.
    path = write_json({"component": {}, "messaging": {}})
    result = run("run", "echo", "-c", str(path), "-t", THING, "--platform", "EDGE_RUNTIME")
    assert result.returncode == 2, result.stderr
    assert "IPC variables are not set" in result.stderr
    assert "SVCUID" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_refuses_to_leave_the_component_section_unchecked(
    write_json: Callable[..., Path],
) -> None:
    no_token = write_json(patched({"component": {"token": DELETE}}), "no-token.json")
    result = run("validate", "-c", str(no_token), "-t", THING)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--component: is required" in result.stderr
    assert "installed: camera-adapter, echo, ethernet-ip-adapter, file-egress" in result.stderr

    # TOKEN names no installed component: its schema must be given.
    not_installed = write_json(base_document(), "not-installed.json")
    result = run("validate", "-c", str(not_installed), "-t", THING)
    assert result.returncode == 2
    assert "$.component.token: unknown component 'test-component'" in result.stderr
    assert "--schema FILE" in result.stderr
    result = run("validate", "-c", str(not_installed), "--component", "nope")
    assert result.returncode == 2
    assert "--component: unknown component 'nope'" in result.stderr


def test_validate_infers_the_component_from_its_token(write_json: Callable[..., Path]) -> None:
    echo = {"component": {"token": "echo"}, "messaging": {"local": {"host": "embedded"}}}
    result = run("validate", "-c", str(write_json(echo)), "-t", THING)
    assert result.returncode == 0, result.stderr
    assert "$.component checked as echo ($.component.token)" in result.stdout
    # The inferred component's schema really checks the section.
    echo["component"]["colour"] = "red"
    result = run("validate", "-c", str(write_json(echo)), "-t", THING)
    assert result.returncode == 2
    assert "$.component.colour: unknown key" in result.stderr


def test_call_with_the_embedded_host_of_the_examples_says_where_that_broker_is() -> None:
    args = ("-c", str(EXAMPLES / "echo.json"), "-t", THING, "--component", "echo")
    for extra in ((), ("--broker", "embedded")):
        result = run("call", "echo", "{}", *args, *extra, "--connect-timeout", "30")
        assert result.returncode == 2, result.stdout + result.stderr
        assert '$.messaging.local.host: is "embedded"' in result.stderr
        assert "`unskit run` or `unskit demo`" in result.stderr
        assert "--broker HOST:PORT" in result.stderr
        assert "Traceback" not in result.stderr


def test_call_reaches_an_example_component_with_broker(broker: Mosquitto, tmp_path: Path) -> None:
    address = f"127.0.0.1:{broker.plain_port}"
    config = ("-c", str(EXAMPLES / "echo.json"), "-t", THING, "--broker", address)
    # The component runs the example with a probe port of its own: 8081 may be taken.
    document = json.loads((EXAMPLES / "echo.json").read_text())
    document["health"]["port"] = 0
    (tmp_path / "echo.json").write_text(json.dumps(document))
    command = [sys.executable, "-m", "unskit.cli", "run", "echo", "-c", str(tmp_path / "echo.json")]
    command += ["-t", THING, "--broker", address]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as echo:
        try:
            assert echo.stderr is not None
            for line in echo.stderr:
                if "echo running" in line:
                    break
            else:
                raise AssertionError("echo did not start")
            body = json.dumps({"hello": "world"})
            result = run("call", "echo", body, *config, "--component", "echo", "--timeout", "20")
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout) == {"hello": "world"}
        finally:
            echo.terminate()
            echo.wait(30)


def test_validate_with_component_schema(write_json: Callable[..., Path], tmp_path: Path) -> None:
    schema = tmp_path / "component.schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["global"]}))
    path = write_json(base_document())
    result = run("validate", "-c", str(path), "--schema", str(schema))
    assert result.returncode == 2
    assert "$.component.global: is required" in result.stderr


def test_validate_unknown_option_is_a_usage_error() -> None:
    result = run("validate", "--bogus")
    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_demo_is_a_command() -> None:
    # The demo itself runs in tests/demo; without --duration it would run until Ctrl-C.
    result = run("demo", "--help")
    assert result.returncode == 0, result.stderr
    assert "--duration" in result.stdout


@server_fixture
def vault_files(tmp_path: Path) -> tuple[str, str]:
    key_file = tmp_path / "vault.key"
    result = run("vault", "keygen", "--key-file", str(key_file))
    assert result.returncode == 0, result.stderr
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    return str(tmp_path / "vault.json"), str(key_file)


@pytest.mark.slow
def test_vault_put_list_get_round_trip(vault_files: tuple[str, str]) -> None:
    vault, key = vault_files
    common = ("--vault", vault, "--key-file", key)
    put = run("vault", "put", "broker-password", *common, stdin=SECRET_VALUE + "\n")
    assert put.returncode == 0, put.stderr
    assert SECRET_VALUE not in put.stdout + put.stderr
    bundle = json.dumps({"certPem": "CERT", "keyPem": "KEY"})
    assert run("vault", "put", "plc", "--json", *common, stdin=bundle).returncode == 0

    listed = run("vault", "list", *common)
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == ["broker-password", "plc"]

    hidden = run("vault", "get", "broker-password", *common)
    assert hidden.returncode == 0
    assert SECRET_VALUE not in hidden.stdout
    assert "--reveal" in hidden.stdout

    shown = run("vault", "get", "broker-password", "--reveal", *common)
    assert shown.returncode == 0
    assert shown.stdout == SECRET_VALUE + "\n"

    field = run("vault", "get", "plc", "--field", "keyPem", "--reveal", *common)
    assert field.stdout == "KEY\n"

    assert run("vault", "delete", "plc", *common).returncode == 0
    assert run("vault", "list", *common).stdout.splitlines() == ["broker-password"]


def test_vault_key_from_environment(vault_files: tuple[str, str]) -> None:
    vault, key = vault_files
    env = {"UNSKIT_VAULT_KEY": Path(key).read_text().strip()}
    assert run("vault", "put", "a", "--vault", vault, stdin="x", env=env).returncode == 0
    assert run("vault", "list", "--vault", vault, env=env).stdout == "a\n"


def test_vault_wrong_key_exits_2(vault_files: tuple[str, str], tmp_path: Path) -> None:
    vault, key = vault_files
    run("vault", "put", "a", "--vault", vault, "--key-file", key, stdin=SECRET_VALUE)
    other = tmp_path / "other.key"
    assert run("vault", "keygen", "--key-file", str(other)).returncode == 0
    result = run("vault", "get", "a", "--reveal", "--vault", vault, "--key-file", str(other))
    assert result.returncode == 2
    assert "wrong key" in result.stderr
    assert SECRET_VALUE not in result.stdout + result.stderr


def test_vault_tampered_file_exits_2(vault_files: tuple[str, str]) -> None:
    vault, key = vault_files
    run("vault", "put", "a", "--vault", vault, "--key-file", key, stdin=SECRET_VALUE)
    outer = json.loads(Path(vault).read_text())
    outer["ciphertext"] = ("A" if outer["ciphertext"][0] != "A" else "B") + outer["ciphertext"][1:]
    Path(vault).write_text(json.dumps(outer))
    result = run("vault", "list", "--vault", vault, "--key-file", key)
    assert result.returncode == 2
    assert "failed authentication" in result.stderr


def test_vault_keygen_refuses_to_overwrite(vault_files: tuple[str, str]) -> None:
    _, key = vault_files
    before = Path(key).read_text()
    result = run("vault", "keygen", "--key-file", key)
    assert result.returncode == 2
    assert "exists" in result.stderr
    assert Path(key).read_text() == before


def test_vault_get_unknown_name_exits_2(vault_files: tuple[str, str]) -> None:
    vault, key = vault_files
    result = run("vault", "get", "nope", "--vault", vault, "--key-file", key)
    assert result.returncode == 2
    assert "no secret named 'nope'" in result.stderr


@pytest.mark.slow
def test_vault_put_keeps_versions_and_retire_drops_them(vault_files: tuple[str, str]) -> None:
    from unskit.config import Vault, VaultKey

    vault, key = vault_files
    common = ("--vault", vault, "--key-file", key)
    assert run("vault", "put", "trust", *common, stdin="old-root").returncode == 0
    kept = run("vault", "put", "trust", "--keep-versions", "1", *common, stdin="new-root")
    assert kept.returncode == 0, kept.stderr
    opened = Vault(vault, VaultKey.from_file(key))
    assert opened.versions("trust") == ["new-root", "old-root"]
    retired = run("vault", "retire", "trust", *common)
    assert retired.returncode == 0, retired.stderr
    assert "retired 1" in retired.stdout
    assert opened.versions("trust") == ["new-root"]


def _example(name: str, tmp_path: Path, patch: Callable[[dict[str, Any]], None]) -> Path:
    document = json.loads((EXAMPLES / name).read_text())
    patch(document["component"])
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def _archive_into_source(component: dict[str, Any]) -> None:
    instance = component["instances"][0]
    instance["onComplete"]["archiveDir"] = instance["source"]["path"]


def _level_with_snappy(component: dict[str, Any]) -> None:
    component["compression"] = {"codec": "snappy", "level": 3}


def _invalid_regex(component: dict[str, Any]) -> None:
    component["instances"][0]["subscriptions"][0]["include"][0]["match"] = "(unclosed"


@pytest.mark.parametrize(
    ("example", "patch", "path"),
    [
        pytest.param(
            "file-egress.json",
            _archive_into_source,
            "$.component.instances[0].onComplete.archiveDir",
            id="egress-archive-dir-is-the-source",
        ),
        pytest.param(
            "signal-recorder.json",
            _level_with_snappy,
            "$.component.compression.level",
            id="recorder-zstd-level-with-snappy",
        ),
        pytest.param(
            "opcua-adapter.json",
            _invalid_regex,
            "$.component.instances[0].subscriptions[0].include[0].match",
            id="opcua-invalid-regex",
        ),
    ],
)
def test_validate_without_a_thing_runs_the_component_rules(
    tmp_path: Path, example: str, patch: Callable[[dict[str, Any]], None], path: str
) -> None:
    # Issue 36: without -t, validate said OK to what `unskit run` refuses.
    config = _example(example, tmp_path, patch)
    result = run("validate", "-c", str(config))
    assert result.returncode == 2, result.stdout
    assert path in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_without_a_thing_says_the_rules_ran_with_a_placeholder(tmp_path: Path) -> None:
    config = _example("file-egress.json", tmp_path, lambda component: None)
    result = run("validate", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert "placeholder thing name" in result.stdout
    assert "-t/--thing" in result.stdout


def test_validate_with_an_invalid_schema_names_the_option(
    write_json: Callable[..., Path], tmp_path: Path
) -> None:
    schema = tmp_path / "bad.schema.json"
    schema.write_text(json.dumps({"type": "objekt"}))
    result = run("validate", "-c", str(write_json(base_document())), "--schema", str(schema))
    assert result.returncode == 2
    assert "--schema: is not a valid JSON Schema" in result.stderr
    assert "Traceback" not in result.stderr
    schema.write_text('{"not": ' * 5000 + "{}" + "}" * 5000)
    result = run("validate", "-c", str(write_json(base_document())), "--schema", str(schema))
    assert result.returncode == 2
    assert "--schema: nests too deep" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_refuses_a_state_dir_that_is_a_file(
    write_json: Callable[..., Path], tmp_path: Path
) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("")
    for state_dir in (blocker, blocker / "sub"):
        path = write_json(patched({"commands": {"stateDir": str(state_dir)}}))
        result = validate("-c", str(path), "-t", THING)
        assert result.returncode == 2, result.stdout
        assert f"$.commands.stateDir: cannot be a directory: {blocker} is a file" in result.stderr


def _recorder_level(component: dict[str, Any]) -> None:
    component["compression"] = {"codec": "zstd", "level": 22.0}


def _egress_concurrency(component: dict[str, Any]) -> None:
    component["instances"][0]["egress"][0]["maxConcurrentFiles"] = 2.0


@pytest.mark.parametrize(
    ("example", "patch", "path"),
    [
        pytest.param(
            "signal-recorder.json",
            _recorder_level,
            "$.component.compression.level",
            id="recorder-zstd-level",
        ),
        pytest.param(
            "file-egress.json",
            _egress_concurrency,
            "$.component.instances[0].egress[0].maxConcurrentFiles",
            id="egress-max-concurrent-files",
        ),
    ],
)
def test_validate_refuses_an_integer_key_written_with_a_fraction(
    tmp_path: Path, example: str, patch: Callable[[dict[str, Any]], None], path: str
) -> None:
    # Issue 36: 22.0 failed every Parquet write at run; 2.0 a TypeError at start.
    config = _example(example, tmp_path, patch)
    for thing in ((), ("-t", THING)):
        result = run("validate", "-c", str(config), *thing)
        assert result.returncode == 2, result.stdout
        assert f"{path}: must be an integer, written without a decimal point" in result.stderr


def test_validate_refuses_a_document_nested_too_deep(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"component": ' + '{"a": ' * 1000 + "1" + "}" * 1001)
    shallow_but_deep = tmp_path / "deep.yaml"
    shallow_but_deep.write_text("component:\n  x: " + "[" * 500 + "]" * 500 + "\n")
    for path in (deep, shallow_but_deep):
        result = run("validate", "-c", str(path), "--component", "echo")
        assert result.returncode == 2, result.stdout
        assert "nests deeper than 64 levels" in result.stderr
        assert "Traceback" not in result.stderr


def test_version_prints_the_version_and_exits_0() -> None:
    result = run("--version")
    assert result.returncode == 0, result.stderr
    from unskit import __version__

    assert result.stdout.strip() == f"unskit {__version__}"


def test_run_help_lists_the_installed_components() -> None:
    result = run("run", "--help")
    assert result.returncode == 0, result.stderr
    for name in ("camera-adapter", "echo", "ethernet-ip-adapter", "file-egress"):
        assert f"\n  {name}\n" in result.stdout
    # After NAME, --help is the component's own.
    result = run("run", "echo", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: unskit run echo" in result.stdout


def test_a_directory_on_host_says_to_use_the_cluster_platform(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(base_document()))
    result = run("validate", "-c", str(tmp_path), "--component", "echo")
    assert result.returncode == 2
    assert "$: is a directory" in result.stderr
    assert "--platform CLUSTER" in result.stderr


def test_yaml_text_in_a_json_file_hints_that_the_suffix_chooses_the_parser(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.json"
    path.write_text("# a comment\ncomponent:\n  token: echo\n")
    result = run("validate", "-c", str(path))
    assert result.returncode == 2
    assert "malformed JSON" in result.stderr
    assert "looks like YAML" in result.stderr
    assert ".yaml or .yml" in result.stderr
    # Malformed JSON that is no YAML gets no such hint.
    path.write_text('{"component": }')
    result = run("validate", "-c", str(path))
    assert "malformed JSON" in result.stderr
    assert "YAML" not in result.stderr


def test_call_without_a_component_names_the_flag(write_json: Callable[..., Path]) -> None:
    path = write_json(patched({"component": {"token": DELETE}}))
    result = run("call", "status", "-c", str(path), "-t", THING, "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert "--component: is required" in result.stderr
    assert "$.component.token" not in result.stderr


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        (
            {"messaging": {"local": {"host": "127.0.0.1", "port": 18837.0}}},
            "$.messaging.local.port",
        ),
        (
            {"messaging": {"local": {"keepAliveSeconds": 30.0}}},
            "$.messaging.local.keepAliveSeconds",
        ),
        ({"health": {"enabled": True, "port": 18903.0}}, "$.health.port"),
        ({"heartbeat": {"intervalSeconds": 1e12}}, "$.heartbeat.intervalSeconds"),
        ({"logging": {"python_format": "%(nosuchfield)s %(message)s"}}, "$.logging.python_format"),
        (
            {"metricEmission": {"target": "messaging", "targetConfig": {"destination": "cloud"}}},
            "$.metricEmission.targetConfig.destination",
        ),
    ],
)
def test_run_refuses_what_validate_refuses_in_one_line(
    write_json: Callable[..., Path], patch: dict[str, Any], path: str
) -> None:
    # Issue 36: each of these validated and then reconnected forever, killed a thread or
    # ended in a traceback; now both commands refuse it with its path, nothing started.
    echo = {"component": {}, "messaging": {"local": {"host": "embedded", "port": 0}}}
    config = write_json(patched(patch, echo))
    checked = run("validate", "-c", str(config), "--component", "echo")
    assert checked.returncode == 2, checked.stdout
    assert path in checked.stderr
    result = run("run", "echo", "-c", str(config), "-t", THING)
    assert result.returncode == 2, result.stderr
    assert path in result.stderr
    assert "Traceback" not in result.stderr
    assert "starting echo" not in result.stderr


def test_validate_refuses_an_unknown_config_source(write_json: Callable[..., Path]) -> None:
    path = write_json(base_document())
    result = validate("-c", str(path), "--config-source", "BLOB")
    assert result.returncode == 2
    assert "--config-source" in result.stderr
    assert "'BLOB'" in result.stderr
