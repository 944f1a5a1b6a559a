"""Sources by platform, document parsing, thing name and config path resolution."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from unskit.config import (
    CONFIG_SOURCE_ENV,
    ComponentConfig,
    ConfigLoader,
    FileConfigProvider,
    FileSource,
    MountedDirSource,
    Platform,
    RuntimeConfigSource,
    SourceKind,
    add_config_arguments,
    load_config,
    open_source,
    parse_document,
    resolve_thing_name,
    source_kind_for,
)
from unskit.errors import ConfigError

from .documents import DELETE, THING, TOKEN, base_document, patched


@pytest.mark.parametrize(
    ("platform", "kind"),
    [
        (Platform.HOST, SourceKind.FILE),
        (Platform.CLUSTER, SourceKind.MOUNTED_DIR),
        (Platform.EDGE_RUNTIME, SourceKind.RUNTIME_CONFIG),
    ],
)
def test_source_by_platform(platform: Platform, kind: SourceKind, tmp_path: Path) -> None:
    assert source_kind_for(platform) is kind
    source = open_source(platform, tmp_path / "config.json")
    assert source.kind is kind


def test_edge_runtime_default_provider_is_file_backed(tmp_path: Path) -> None:
    source = open_source(Platform.EDGE_RUNTIME, tmp_path / "c.json")
    assert isinstance(source, RuntimeConfigSource)
    assert isinstance(source.provider, FileConfigProvider)


def test_default_locations_by_platform() -> None:
    assert open_source(Platform.HOST).location == "config.json"
    assert open_source(Platform.CLUSTER).location == "/etc/unskit/config"


def test_host_loads_a_json_file(write_json: Callable[..., Path]) -> None:
    path = write_json(base_document())
    config = load_config(path, thing=THING, platform="HOST")
    assert config.platform is Platform.HOST
    assert config.identity.path == f"plant-1/line-4/{THING}"
    assert config.source == str(path)


def test_host_file_is_not_watched(write_json: Callable[..., Path]) -> None:
    loader = ConfigLoader(write_json(base_document()), thing=THING, platform=Platform.HOST)
    loader.load()
    assert isinstance(loader.source, FileSource)
    assert loader.watch(lambda _: None) is None


def test_yaml_document_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "component:\n  token: yaml-component\n"
        "tags:\n  commissioned: 2024-01-01\n"
        "messaging:\n  local:\n    host: embedded\n"
    )
    config = load_config(path, thing=THING, platform=Platform.HOST)
    assert config.component_token == "yaml-component"
    # A YAML date stays the string it is in JSON; tags are strings.
    assert config.tags["commissioned"] == "2024-01-01"


def test_yaml_duplicate_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="appears twice"):
        parse_document("component: {}\ncomponent: {}\n", "c.yml")


def test_yaml_non_string_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="keys must be strings"):
        parse_document("component: {}\ntags:\n  1: one\n", "c.yaml")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.json", thing=THING, platform=Platform.HOST)
    assert "does not exist" in str(caught.value)
    assert caught.value.source == str(tmp_path / "nope.json")


def test_empty_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text("")
    with pytest.raises(ConfigError, match="malformed JSON"):
        load_config(tmp_path / "c.json", thing=THING, platform=Platform.HOST)


def test_not_utf8_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not UTF-8"):
        parse_document(b'{"component": "\xff"}', "c.json")


def test_utf8_bom_is_accepted() -> None:
    assert parse_document('\ufeff{"component": {}}'.encode(), "c.json") == {"component": {}}


@pytest.mark.parametrize(
    ("files", "chosen"),
    [
        (["config.json", "other.json"], "config.json"),
        (["config.yaml", "notes.txt"], "config.yaml"),
        (["plant.json", "README.txt"], "plant.json"),
    ],
)
def test_mounted_dir_finds_the_document(tmp_path: Path, files: list[str], chosen: str) -> None:
    for name in files:
        (tmp_path / name).write_text(json.dumps(base_document()))
    assert MountedDirSource(tmp_path).document_path() == tmp_path / chosen


def test_mounted_dir_with_several_candidates_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text("{}")
    with pytest.raises(ConfigError, match="cannot tell which file"):
        MountedDirSource(tmp_path).read()


def test_mounted_dir_accepts_a_file_path(tmp_path: Path) -> None:
    (tmp_path / "plant.json").write_text(json.dumps(base_document()))
    source = MountedDirSource(tmp_path / "plant.json")
    assert source.directory == tmp_path
    assert source.read() == base_document()


@pytest.mark.parametrize(
    ("given", "environ", "expected"),
    [
        ("from-flag", {"UNSKIT_THING_NAME": "env", "AWS_IOT_THING_NAME": "aws"}, "from-flag"),
        (None, {"UNSKIT_THING_NAME": "env", "AWS_IOT_THING_NAME": "aws"}, "env"),
        (None, {"AWS_IOT_THING_NAME": "aws"}, "aws"),
        (None, {"UNSKIT_THING_NAME": "", "AWS_IOT_THING_NAME": "aws"}, "aws"),
        (None, {}, None),
    ],
)
def test_thing_name_precedence(
    given: str | None, environ: dict[str, str], expected: str | None
) -> None:
    assert resolve_thing_name(given, environ) == expected


def test_loader_reads_thing_and_config_path_from_environment(
    write_json: Callable[..., Path],
) -> None:
    path = write_json(base_document())
    environ = {"UNSKIT_CONFIG": str(path), "AWS_IOT_THING_NAME": "gg-thing"}
    config = ConfigLoader(platform=Platform.HOST, environ=environ).load()
    assert config.thing_name == "gg-thing"
    assert config.source == str(path)


def test_platform_detected_from_environment(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(base_document()))
    loader = ConfigLoader(tmp_path, thing=THING, environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert loader.platform is Platform.CLUSTER
    assert isinstance(loader.source, MountedDirSource)
    assert loader.load().health_enabled is True


def test_unknown_platform_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        ConfigLoader("c.json", platform="MAINFRAME")
    assert caught.value.issues[0].path == "--platform"
    assert "MAINFRAME" in caught.value.issues[0].message


class MemoryProvider:
    """An edge-runtime provider that holds the document in memory and pushes updates."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.subscribers: list[Callable[[dict[str, Any]], None]] = []
        self.closed = False

    @property
    def location(self) -> str:
        return "memory"

    def get_configuration(self) -> Mapping[str, Any]:
        return self.document

    def subscribe(self, on_update: Callable[[dict[str, Any]], None], on_error: Any) -> Any:
        self.subscribers.append(on_update)
        provider = self

        class Handle:
            def close(self) -> None:
                provider.closed = True

        return Handle()

    def push(self, document: dict[str, Any]) -> None:
        self.document = document
        for subscriber in self.subscribers:
            subscriber(document)


def test_edge_runtime_reads_through_the_provider_seam() -> None:
    provider = MemoryProvider(patched({"messaging": {"local": {"host": "broker.edge"}}}))
    config = load_config(thing=THING, platform=Platform.EDGE_RUNTIME, provider=provider)
    assert config.messaging.local is not None
    assert config.messaging.local.host == "broker.edge"
    assert config.source == "memory"
    # The loaded configuration does not follow later changes of the provider's object.
    provider.document["tags"]["owner"] = "changed"
    assert config.tags["owner"] == "ops"


def test_edge_runtime_without_a_local_broker_loads_the_ipc_link() -> None:
    provider = MemoryProvider(patched({"messaging": DELETE}))
    config = load_config(thing=THING, platform=Platform.EDGE_RUNTIME, provider=provider)
    assert config.messaging.local is None
    assert config.messaging.local_ipc is not None
    assert config.messaging.ipc
    assert config.messaging.local_ipc.receive_own_messages is True


def test_edge_runtime_updates_are_validated_and_applied() -> None:
    provider = MemoryProvider(patched({"messaging": {}}))
    loader = ConfigLoader(thing=THING, platform=Platform.EDGE_RUNTIME, provider=provider)
    loader.load()
    applied: list[ComponentConfig] = []
    rejected: list[ConfigError] = []
    watch = loader.watch(applied.append, rejected.append)
    assert watch is not None
    provider.push(patched({"messaging": {}, "tags": {"owner": "night-shift"}}))
    provider.push(patched({"messaging": {}, "tags": {"site": "x"}}))
    provider.push(patched({"messaging": {}, "tags": {"owner": "night-shift"}}))
    assert [c.tags["owner"] for c in applied] == ["night-shift"]
    assert [i.path for e in rejected for i in e.issues] == ["$.tags.site"]
    current = loader.current
    assert current is not None
    assert current.tags["owner"] == "night-shift"
    watch.close()
    assert provider.closed


def test_load_logs_the_redacted_configuration(
    write_json: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    path = write_json(base_document())
    with caplog.at_level(logging.INFO, logger="unskit.config"):
        load_config(path, thing=THING, platform=Platform.HOST, default_component=TOKEN)
    (record,) = [r for r in caplog.records if "configuration loaded" in r.getMessage()]
    assert '"owner": "ops"' in record.getMessage()
    assert str(path) in record.getMessage()


# Integration: the inotify binding finds libc through `ldconfig -p` (a subprocess) the first
# time a process opens a watch, which the unit tier forbids.
@pytest.mark.integration
def test_file_provider_reports_changes(tmp_path: Path) -> None:
    path = tmp_path / "component.json"
    path.write_text(json.dumps(patched({"messaging": {}})))
    provider = FileConfigProvider(path)
    loader = ConfigLoader(thing=THING, platform=Platform.EDGE_RUNTIME, provider=provider)
    loader.load()
    changed = threading.Event()
    seen: list[ComponentConfig] = []

    def on_change(config: ComponentConfig) -> None:
        seen.append(config)
        changed.set()

    watch = loader.watch(on_change)
    assert watch is not None
    try:
        temp = tmp_path / ".component.json.tmp"
        temp.write_text(json.dumps(patched({"messaging": {}, "tags": {"owner": "b"}})))
        temp.rename(path)
        assert changed.wait(timeout=10)
        assert seen[0].tags["owner"] == "b"
    finally:
        watch.close()


# -- --config-source -------------------------------------------------------------------------


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return parser.parse_args(list(argv))


def test_config_source_option_is_parsed_and_any_case_is_taken(tmp_path: Path) -> None:
    args = _parsed("--config-source", "mounted_dir", "-c", str(tmp_path))
    assert args.config_source == "mounted_dir"
    loader = ConfigLoader(
        args.config, thing=THING, platform="HOST", config_source=args.config_source
    )
    assert isinstance(loader.source, MountedDirSource)
    assert _parsed().config_source is None


@pytest.mark.parametrize(
    ("platform", "source", "expected"),
    [
        (Platform.HOST, "SHADOW", SourceKind.SHADOW),
        (Platform.EDGE_RUNTIME, "CONFIG_COMPONENT", SourceKind.CONFIG_COMPONENT),
        (Platform.EDGE_RUNTIME, "FILE", SourceKind.FILE),
        (Platform.CLUSTER, "FILE", SourceKind.FILE),
    ],
)
def test_config_source_chooses_the_source(
    platform: Platform, source: str, expected: SourceKind
) -> None:
    # Nothing is read: the edge runtime's sources connect on first use.
    loader = ConfigLoader("name", thing=THING, platform=platform, config_source=source)
    assert loader.source.kind is expected


def test_file_on_the_edge_runtime_keeps_the_watched_file(write_json: Callable[..., Path]) -> None:
    path = write_json(base_document())
    loader = ConfigLoader(path, thing=THING, platform="EDGE_RUNTIME", config_source="FILE")
    assert isinstance(loader.source, RuntimeConfigSource)
    assert isinstance(loader.source.provider, FileConfigProvider)
    assert loader.load().tags == {"owner": "ops"}


def test_config_source_comes_from_its_variable() -> None:
    loader = ConfigLoader(
        "holder",
        thing=THING,
        platform="EDGE_RUNTIME",
        environ={CONFIG_SOURCE_ENV: "config_component"},
    )
    assert loader.source.kind is SourceKind.CONFIG_COMPONENT
    assert "'holder'" in loader.source.location


@pytest.mark.parametrize("where", ["option", "variable"])
def test_an_unknown_config_source_is_refused_naming_the_option(where: str) -> None:
    given = {"config_source": "SHADOWS"} if where == "option" else {}
    environ = {CONFIG_SOURCE_ENV: "SHADOWS"} if where == "variable" else {}
    with pytest.raises(ConfigError) as refused:
        ConfigLoader("x", thing=THING, platform="HOST", environ=environ, **given)
    [issue] = refused.value.issues
    assert issue.path == "--config-source"
    assert "'SHADOWS'" in issue.message
    for name in ("FILE", "MOUNTED_DIR", "RUNTIME_CONFIG", "SHADOW", "CONFIG_COMPONENT"):
        assert name in issue.message


@pytest.mark.parametrize(
    ("source", "path", "thing", "component", "option", "words"),
    [
        ("RUNTIME_CONFIG", "x.json", THING, None, "-c/--config", "names nothing"),
        ("CONFIG_COMPONENT", None, THING, None, "-c/--config", "is required"),
        ("SHADOW", None, THING, None, "-c/--config", "names the shadow"),
        ("SHADOW", "name", None, None, "-t/--thing", "thing name is required"),
    ],
)
def test_what_a_config_source_needs_is_named(
    source: str, path: str | None, thing: str | None, component: str | None, option: str, words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        ConfigLoader(
            path,
            thing=thing,
            platform="EDGE_RUNTIME",
            environ={},
            config_source=source,
            default_component=component,
        )
    [issue] = refused.value.issues
    assert issue.path == option
    assert words in issue.message


def test_shadow_defaults_to_the_component_token() -> None:
    loader = ConfigLoader(
        None, thing=THING, platform="EDGE_RUNTIME", config_source="SHADOW", default_component=TOKEN
    )
    assert f"'unskit-{TOKEN}'" in loader.source.location
    assert f"$aws/things/{THING}/shadow/name/unskit-{TOKEN}" in loader.source.location


def test_edge_runtime_sources_without_the_runtime_are_a_config_error() -> None:
    # The IPC variables unset: a ConfigError naming them (exit 2), not a traceback.
    loader = ConfigLoader(None, thing=THING, platform="EDGE_RUNTIME", environ={})
    assert loader.source.kind is SourceKind.RUNTIME_CONFIG
    with pytest.raises(ConfigError) as refused:
        loader.load()
    assert "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT" in str(refused.value)
