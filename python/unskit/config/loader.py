"""Loading a component configuration: source by platform, validation before anything
starts, the resolved `ComponentConfig`, and live reload from a watched source.

    loader = ConfigLoader("config.json", thing="gw-01", default_component="camera-adapter")
    config = loader.load()          # raises ConfigError listing every broken rule
    watch = loader.watch(apply)     # CLUSTER / EDGE_RUNTIME: apply(config) on each valid change
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from unskit.config.messaging import BrokerConfig
from unskit.config.model import ComponentConfig, build_config
from unskit.config.platform import Platform, detect_platform
from unskit.config.schema import is_topic_level, validate_document
from unskit.config.sources import (
    SOURCE_OPTION,
    ConfigProvider,
    ConfigSource,
    SourceKind,
    Watch,
    open_source,
    parse_source_kind,
)
from unskit.config.values import DEFAULT_EMBEDDED_PORT, EMBEDDED_HOST
from unskit.errors import ConfigError, ConfigIssue

__all__ = [
    "CONFIG_ENV",
    "CONFIG_SOURCE_ENV",
    "THING_ENV_VARS",
    "ConfigLoader",
    "add_config_arguments",
    "apply_broker_override",
    "client_broker",
    "load_config",
    "resolve_config",
    "resolve_thing_name",
]

_log = logging.getLogger(__name__)

# -c/--config when the option is not given.
CONFIG_ENV = "UNSKIT_CONFIG"
# --config-source when the option is not given.
CONFIG_SOURCE_ENV = "UNSKIT_CONFIG_SOURCE"
# The thing name when -t/--thing is not given, first set wins; the second is the variable
# the managed edge runtime gives every component.
THING_ENV_VARS = ("UNSKIT_THING_NAME", "AWS_IOT_THING_NAME")
THING_OPTION = "-t/--thing"
PLATFORM_OPTION = "--platform"


def resolve_thing_name(
    thing: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """-t/--thing wins, then UNSKIT_THING_NAME, then AWS_IOT_THING_NAME; None when unset."""
    if thing:
        return thing
    env = os.environ if environ is None else environ
    for name in THING_ENV_VARS:
        if env.get(name):
            return env[name]
    return None


def resolve_config(
    document: Mapping[str, Any],
    *,
    thing: str | None,
    platform: Platform,
    component_schema: Mapping[str, Any] | None = None,
    default_component: str | None = None,
    source: str | None = None,
) -> ComponentConfig:
    """Validates a parsed document and builds the model; raises `ConfigError` with every issue."""
    issues = validate_document(document, platform=platform, component_schema=component_schema)
    component = document.get("component")
    token = component.get("token") if isinstance(component, Mapping) else None
    token = token if token is not None else default_component
    if token is None and isinstance(component, Mapping):
        issues.append(
            ConfigIssue(
                "$.component.token",
                "is required: this component has no built-in token to fall back to",
            )
        )
    if thing is None:
        issues.append(
            ConfigIssue(
                THING_OPTION,
                "a thing name is required: give -t/--thing or set " + " or ".join(THING_ENV_VARS),
            )
        )
    elif not is_topic_level(thing):
        issues.append(
            ConfigIssue(THING_OPTION, "must be one non-empty topic level: no '/', '+' or '#'")
        )
    if issues:
        raise ConfigError(sorted(set(issues)), source=source)
    assert isinstance(token, str)
    assert thing is not None
    return build_config(
        document, thing=thing, platform=platform, component_token=token, source=source
    )


class ConfigLoader:
    """Reads, validates and resolves one component's configuration; watches it for changes."""

    def __init__(
        self,
        config_path: str | os.PathLike[str] | None = None,
        *,
        thing: str | None = None,
        platform: Platform | str | None = None,
        environ: Mapping[str, str] | None = None,
        provider: ConfigProvider | None = None,
        component_schema: Mapping[str, Any] | None = None,
        default_component: str | None = None,
        broker: str | None = None,
        config_source: SourceKind | str | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        try:
            self.platform = detect_platform(env, platform)
        except ValueError as exc:
            raise ConfigError([ConfigIssue(PLATFORM_OPTION, str(exc))]) from None
        if config_path is None and env.get(CONFIG_ENV):
            config_path = env[CONFIG_ENV]
        if config_source is None and env.get(CONFIG_SOURCE_ENV):
            config_source = env[CONFIG_SOURCE_ENV]
        kind = None if config_source is None else parse_source_kind(config_source)
        self.thing = resolve_thing_name(thing, env)
        self.source: ConfigSource = open_source(
            self.platform,
            config_path,
            provider=provider,
            kind=kind,
            thing=self.thing,
            component=default_component,
            environ=None if environ is None else env,
        )
        self.component_schema = component_schema
        self.default_component = default_component
        #: `--broker HOST:PORT`: replaces messaging.local in every document read, reloads too.
        self.broker = broker
        self._lock = threading.Lock()
        self._current: ComponentConfig | None = None
        self._watches: list[Watch] = []

    @property
    def current(self) -> ComponentConfig | None:
        """The configuration last loaded or applied."""
        return self._current

    def read(self) -> dict[str, Any]:
        """The raw document from the source (parsed, not validated), `broker` applied."""
        return self._override(self.source.read())

    def _override(self, document: dict[str, Any]) -> dict[str, Any]:
        return document if self.broker is None else apply_broker_override(document, self.broker)

    def resolve(self, document: Mapping[str, Any]) -> ComponentConfig:
        """Validates and resolves a document with this loader's thing, platform and schema."""
        return resolve_config(
            document,
            thing=self.thing,
            platform=self.platform,
            component_schema=self.component_schema,
            default_component=self.default_component,
            source=self.source.location,
        )

    def _settle(self, document: Mapping[str, Any], error: ConfigError | None) -> None:
        # SHADOW writes what became of its desired state back as the reported state.
        settle = getattr(self.source, "settle", None)
        if settle is not None:
            settle(document, error)

    def load(self) -> ComponentConfig:
        """Reads and resolves the configuration; raises `ConfigError` before anything starts."""
        document = self.source.read()
        try:
            config = self.resolve(self._override(document))
        except ConfigError as exc:
            self._settle(document, exc)
            raise
        self._settle(document, None)
        with self._lock:
            self._current = config
        _log.info(
            "configuration loaded from %s (platform %s, thing %s, component %s): %s",
            self.source.location,
            self.platform.value,
            config.thing_name,
            config.component_token,
            json.dumps(config.redacted(), sort_keys=True),
        )
        return config

    def watch(
        self,
        on_change: Callable[[ComponentConfig], None],
        on_error: Callable[[ConfigError], None] | None = None,
    ) -> Watch | None:
        """Calls `on_change` with each valid changed configuration; None if not watchable."""
        # Runs on the watcher thread. An invalid candidate is logged and passed to on_error;
        # the running configuration stays.

        def rejected(error: ConfigError) -> None:
            _log.warning("configuration change rejected, keeping the running one: %s", error)
            if on_error is not None:
                on_error(error)

        def changed(document: dict[str, Any]) -> None:
            try:
                config = self.resolve(self._override(document))
            except ConfigError as exc:
                self._settle(document, exc)
                rejected(exc)
                return
            self._settle(document, None)
            with self._lock:
                if config == self._current:
                    return
                self._current = config
            _log.info("configuration changed in %s", self.source.location)
            on_change(config)

        def check(document: dict[str, Any]) -> list[str] | None:
            # A deployment's proposed document (RUNTIME_CONFIG): refused before the runtime
            # applies it, with the JSON path of every error, so the running one stays.
            try:
                self.resolve(self._override(document))
            except ConfigError as exc:
                return [str(exc)]
            return None

        validation = getattr(self.source, "validation", None)
        guard = validation(check) if validation is not None else None
        try:
            watch = self.source.watch(changed, rejected)
        except BaseException:
            if guard is not None:
                guard.close()
            raise
        made = watch if guard is None else _Watches([w for w in (guard, watch) if w is not None])
        if made is not None:
            with self._lock:
                self._watches.append(made)
        return made

    def close(self) -> None:
        """Stops the watches this loader made and releases what the source holds (the edge
        runtime's IPC connection); idempotent."""
        with self._lock:
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.close()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


class _Watches:
    """Several watches closed as one."""

    def __init__(self, watches: list[Watch]) -> None:
        self._watches = watches

    def close(self) -> None:
        for watch in self._watches:
            watch.close()


def load_config(
    config_path: str | os.PathLike[str] | None = None,
    *,
    thing: str | None = None,
    platform: Platform | str | None = None,
    environ: Mapping[str, str] | None = None,
    provider: ConfigProvider | None = None,
    component_schema: Mapping[str, Any] | None = None,
    default_component: str | None = None,
    config_source: SourceKind | str | None = None,
) -> ComponentConfig:
    """Loads, validates and resolves a configuration in one call."""
    loader = ConfigLoader(
        config_path,
        thing=thing,
        platform=platform,
        environ=environ,
        provider=provider,
        component_schema=component_schema,
        default_component=default_component,
        config_source=config_source,
    )
    try:
        return loader.load()
    finally:
        loader.close()


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds -c/--config, --config-source, -t/--thing and --platform to a component's
    argument parser."""
    parser.add_argument(
        "-c",
        "--config",
        metavar="PATH",
        help=f"configuration file or mounted directory; with --config-source SHADOW the "
        "shadow's name, with CONFIG_COMPONENT the component's (default: "
        f"${CONFIG_ENV}, else by platform: config.json, /etc/unskit/config on CLUSTER, "
        "the runtime's configuration of this component on EDGE_RUNTIME)",
    )
    parser.add_argument(
        SOURCE_OPTION,
        dest="config_source",
        metavar="SOURCE",
        help="FILE, MOUNTED_DIR, RUNTIME_CONFIG, SHADOW or CONFIG_COMPONENT (default: "
        f"${CONFIG_SOURCE_ENV}, else by platform: FILE on HOST, MOUNTED_DIR on CLUSTER, "
        "RUNTIME_CONFIG on EDGE_RUNTIME)",
    )
    parser.add_argument(
        "-t",
        "--thing",
        metavar="NAME",
        help=f"thing name, the device level (default: ${' or $'.join(THING_ENV_VARS)})",
    )
    parser.add_argument(
        "--platform",
        metavar="P",
        help="HOST, CLUSTER or EDGE_RUNTIME (default: $UNSKIT_PLATFORM, else detected)",
    )


def apply_broker_override(document: dict[str, Any], broker: str) -> dict[str, Any]:
    """`--broker HOST:PORT` or `--broker embedded[:PORT]` replaces messaging.local's address
    (or its endpoints list)."""
    host, _, port_text = broker.rpartition(":") if ":" in broker else (broker, "", "")
    if not host:
        raise ConfigError([ConfigIssue("--broker", "expects HOST:PORT or embedded[:PORT]")])
    messaging = dict(document.get("messaging") or {})
    local = dict(messaging.get("local") or {})
    local.pop("endpoints", None)  # the one broker given replaces a failover list too
    local["host"] = host
    if port_text:
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ConfigError([ConfigIssue("--broker", f"port {port_text!r} is not 0..65535")])
        local["port"] = int(port_text)
    elif host == EMBEDDED_HOST:
        local.setdefault("port", DEFAULT_EMBEDDED_PORT)
    messaging["local"] = local
    return {**document, "messaging": messaging}


def client_broker(config: ComponentConfig) -> BrokerConfig:
    """The local broker a client tool (`unskit call`) connects to; `ConfigError` when the
    configuration names the embedded broker, which exists only inside the process that runs
    it."""
    local = config.messaging.local
    if local is not None and not local.embedded:
        return local
    message = (
        'is "embedded": that broker lives inside the `unskit run` or `unskit demo` process '
        "that starts it, not at a host name; give its address (printed at its start) with "
        "--broker HOST:PORT"
        if local is not None
        else "is required: give the broker with --broker HOST:PORT"
    )
    path = "$.messaging.local.host" if local is not None else "$.messaging.local"
    raise ConfigError([ConfigIssue(path, message)], source=config.source)
