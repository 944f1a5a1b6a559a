"""Where a configuration document comes from, by platform.

=============  ================  ===================================================
platform       default source    what ``-c/--config`` names
=============  ================  ===================================================
HOST           FILE              a JSON (or YAML) file, read once
CLUSTER        MOUNTED_DIR       a mounted directory (or a file in it), re-read on change
EDGE_RUNTIME   RUNTIME_CONFIG    nothing: the component's own configuration over IPC
                                 (a -c without --config-source: a file, watched)
=============  ================  ===================================================

Chosen with ``--config-source`` (any platform; SHADOW and CONFIG_COMPONENT need the edge
runtime's IPC variables):

================  ====================================================================
source            what ``-c/--config`` names
================  ====================================================================
FILE              a file (on EDGE_RUNTIME watched, as a ``-c`` there always was)
MOUNTED_DIR       a mounted directory
RUNTIME_CONFIG    nothing (refused): the component's own configuration
SHADOW            the named shadow (default ``unskit-{component}``, the built-in token)
CONFIG_COMPONENT  the component whose configuration holds the document (required)
================  ====================================================================

A source returns the parsed document; validation is the loader's job.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from unskit.config.documents import _DOCUMENT_SUFFIXES, _error, _plain
from unskit.config.documents import parse_document as parse_document
from unskit.config.documents import read_document as read_document
from unskit.config.platform import Platform
from unskit.config.values import MAX_DEPTH
from unskit.config.watch import DirectoryWatcher
from unskit.edge import providers
from unskit.errors import ConfigError, ConfigIssue

__all__ = [
    "DEFAULT_LOCATIONS",
    "DOCUMENT_NAMES",
    "SOURCE_OPTION",
    "ConfigProvider",
    "ConfigSource",
    "FileConfigProvider",
    "FileSource",
    "MountedDirSource",
    "RuntimeConfigSource",
    "SourceKind",
    "Watch",
    "open_source",
    "parse_document",
    "parse_source_kind",
    "read_document",
    "source_kind_for",
]

_log = logging.getLogger(__name__)


class SourceKind(enum.Enum):
    """The configuration sources of the specification that unskit implements."""

    FILE = "FILE"
    MOUNTED_DIR = "MOUNTED_DIR"
    RUNTIME_CONFIG = "RUNTIME_CONFIG"
    SHADOW = "SHADOW"
    CONFIG_COMPONENT = "CONFIG_COMPONENT"


#: The option that chooses the source, for messages.
SOURCE_OPTION = "--config-source"


def parse_source_kind(value: str | SourceKind) -> SourceKind:
    """`--config-source`'s value (any case); ConfigError naming the option and the choices."""
    if isinstance(value, SourceKind):
        return value
    try:
        return SourceKind(value.strip().upper())
    except ValueError:
        names = ", ".join(k.value for k in SourceKind)
        raise ConfigError(
            [ConfigIssue(SOURCE_OPTION, f"unknown source {value!r}; expected one of {names}")]
        ) from None


_KIND_BY_PLATFORM = {
    Platform.HOST: SourceKind.FILE,
    Platform.CLUSTER: SourceKind.MOUNTED_DIR,
    Platform.EDGE_RUNTIME: SourceKind.RUNTIME_CONFIG,
}

# Where -c points when it is not given.
DEFAULT_LOCATIONS = {
    Platform.HOST: "config.json",
    Platform.CLUSTER: "/etc/unskit/config",
    Platform.EDGE_RUNTIME: "config.json",
}

# The document a mounted directory is searched for, in this order.
DOCUMENT_NAMES = ("config.json", "config.yaml", "config.yml")

OnDocument = Callable[[dict[str, Any]], None]
OnError = Callable[[ConfigError], None]


def source_kind_for(platform: Platform) -> SourceKind:
    """HOST reads a FILE, CLUSTER a MOUNTED_DIR, EDGE_RUNTIME its RUNTIME_CONFIG."""
    return _KIND_BY_PLATFORM[platform]


class Watch(Protocol):
    """A running watch; `close` stops it."""

    def close(self) -> None:
        """Stops watching; idempotent."""
        ...


class ConfigSource(Protocol):
    """Reads the document; some sources can also report changes."""

    @property
    def kind(self) -> SourceKind:
        """Which source this is."""
        ...

    @property
    def location(self) -> str:
        """Where the document is read from, for messages."""
        ...

    def read(self) -> dict[str, Any]:
        """The parsed document; raises `ConfigError` when it cannot be read or parsed."""
        ...

    def watch(self, on_document: OnDocument, on_error: OnError) -> Watch | None:
        """Calls `on_document` with each changed document; None when the source is not watched."""
        ...


class ConfigProvider(Protocol):
    """The edge runtime's configuration seam (RUNTIME_CONFIG)."""

    @property
    def location(self) -> str:
        """Where the configuration comes from, for messages."""
        ...

    def get_configuration(self) -> Mapping[str, Any]:
        """The component's configuration document."""
        ...

    def subscribe(self, on_update: OnDocument, on_error: OnError) -> Watch:
        """Calls `on_update` with each changed document until the returned watch is closed."""
        ...


# -- parsing ---------------------------------------------------------------------------------


class FileSource:
    """HOST: one file, read once (a running component reloads through its reload verb)."""

    kind = SourceKind.FILE

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def location(self) -> str:
        """The file path."""
        return os.fspath(self.path)

    def read(self) -> dict[str, Any]:
        """The parsed document."""
        if self.path.is_dir():
            raise _error(
                "$",
                "is a directory: on HOST -c names the configuration file; a mounted "
                "directory (a config map) is read with --platform CLUSTER",
                self.location,
            )
        return read_document(self.path)

    def watch(self, on_document: OnDocument, on_error: OnError) -> Watch | None:
        """A plain file is not watched."""
        return None


class _ChangeWatch:
    """Re-reads on every directory change; reports only documents that differ."""

    def __init__(
        self,
        directory: Path,
        read: Callable[[], dict[str, Any]],
        on_document: OnDocument,
        on_error: OnError,
        last: dict[str, Any] | None,
    ) -> None:
        self._read = read
        self._on_document = on_document
        self._on_error = on_error
        self._last = last
        self.watcher = DirectoryWatcher(directory, self._changed)

    def _changed(self) -> None:
        try:
            document = self._read()
        except ConfigError as exc:
            self._on_error(exc)
            return
        # Structural comparison: a rewrite with the same content is not a change.
        if document == self._last:
            return
        self._last = document
        self._on_document(document)

    def close(self) -> None:
        """Stops watching."""
        self.watcher.close()


class MountedDirSource:
    """CLUSTER: a mounted directory (e.g. a config map) holding the document, re-read on change.

    `path` is the directory or a file in it. For a directory the document is the first of
    `DOCUMENT_NAMES` present, else its only ``.json``/``.yaml``/``.yml`` file."""

    kind = SourceKind.MOUNTED_DIR

    def __init__(self, path: str | os.PathLike[str]) -> None:
        given = Path(path)
        if given.is_dir():
            self.directory = given
            self._name: str | None = None
        else:
            self.directory = given.parent
            self._name = given.name

    @property
    def location(self) -> str:
        """The document path (or the directory while no document is chosen)."""
        return os.fspath(self.directory / self._name) if self._name else os.fspath(self.directory)

    def document_path(self) -> Path:
        """The document file inside the directory."""
        if self._name is not None:
            return self.directory / self._name
        if not self.directory.is_dir():
            raise _error("$", "the configuration directory does not exist", self.location)
        for name in DOCUMENT_NAMES:
            if (self.directory / name).is_file():
                return self.directory / name
        candidates = sorted(
            entry.name
            for entry in self.directory.iterdir()
            if not entry.name.startswith(".")
            and entry.name.lower().endswith(_DOCUMENT_SUFFIXES)
            and entry.is_file()
        )
        if len(candidates) == 1:
            return self.directory / candidates[0]
        found = ", ".join(candidates) if candidates else "none"
        raise _error(
            "$",
            f"cannot tell which file is the configuration (expected one of "
            f"{', '.join(DOCUMENT_NAMES)} or a single .json/.yaml file; found: {found})",
            self.location,
        )

    def read(self) -> dict[str, Any]:
        """The parsed document, read through whatever symlinks the mount uses."""
        return read_document(self.document_path())

    def watch(self, on_document: OnDocument, on_error: OnError) -> Watch:
        """Watches the directory (inotify, no polling) and reports each changed document."""
        try:
            last: dict[str, Any] | None = self.read()
        except ConfigError:
            last = None
        watch = _ChangeWatch(self.directory, self.read, on_document, on_error, last)
        watch.watcher.start()
        return watch


class FileConfigProvider:
    """A `ConfigProvider` backed by one file, watched like a mounted directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def location(self) -> str:
        """The file path."""
        return os.fspath(self.path)

    def get_configuration(self) -> Mapping[str, Any]:
        """The parsed document."""
        return read_document(self.path)

    def subscribe(self, on_update: OnDocument, on_error: OnError) -> Watch:
        """Watches the file's directory and reports each changed document."""
        try:
            last: dict[str, Any] | None = read_document(self.path)
        except ConfigError:
            last = None
        watch = _ChangeWatch(
            self.path.parent, lambda: read_document(self.path), on_update, on_error, last
        )
        watch.watcher.start()
        return watch


class RuntimeConfigSource:
    """EDGE_RUNTIME: the document comes from the runtime through a `ConfigProvider`.

    Besides the protocol, a provider may have `settle(document, errors)` (told what became of
    each document: SHADOW writes it back as the reported state), `subscribe_validation`
    (RUNTIME_CONFIG: refuse a deployment before it is applied) and `close`."""

    def __init__(
        self, provider: ConfigProvider, kind: SourceKind = SourceKind.RUNTIME_CONFIG
    ) -> None:
        self.provider = provider
        self.kind = kind

    @property
    def location(self) -> str:
        """Where the provider reads from."""
        return self.provider.location

    def read(self) -> dict[str, Any]:
        """A copy of the provider's document."""
        document = self.provider.get_configuration()
        if not isinstance(document, Mapping):
            raise _error("$", "must be an object (a document of sections)", self.location)
        try:
            return _plain(document)
        except RecursionError:
            raise _error("$", f"nests deeper than {MAX_DEPTH} levels", self.location) from None

    def watch(self, on_document: OnDocument, on_error: OnError) -> Watch:
        """Reports each document the provider pushes."""
        return self.provider.subscribe(on_document, on_error)

    def settle(self, document: Mapping[str, Any], error: ConfigError | None) -> None:
        """Tells the provider what became of `document` (None: applied)."""
        settle = getattr(self.provider, "settle", None)
        if settle is not None:
            settle(document, None if error is None else [str(i) for i in error.issues])

    def validation(self, check: Callable[[dict[str, Any]], list[str] | None]) -> Watch | None:
        """Has the provider refuse a deployment `check` refuses; None when it cannot."""
        subscribe = getattr(self.provider, "subscribe_validation", None)
        return None if subscribe is None else subscribe(check)

    def close(self) -> None:
        """Closes the provider's connection, if it has one."""
        close = getattr(self.provider, "close", None)
        if close is not None:
            close()


def open_source(
    platform: Platform,
    path: str | os.PathLike[str] | None = None,
    *,
    provider: ConfigProvider | None = None,
    kind: SourceKind | str | None = None,
    thing: str | None = None,
    component: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ConfigSource:
    """The source for `path`: `kind` (`--config-source`) when given, else the platform's.

    `thing` and `component` (the built-in token) name SHADOW's shadow; `environ` holds the
    edge runtime's IPC variables (the process's when None). On EDGE_RUNTIME, without `kind`,
    a `path` keeps its old meaning (a file, watched) and no path reads the component's own
    configuration from the runtime."""
    chosen = source_kind_for(platform) if kind is None else parse_source_kind(kind)
    if provider is not None and chosen in _PROVIDED:
        return RuntimeConfigSource(provider, chosen)
    if chosen is SourceKind.MOUNTED_DIR:
        return MountedDirSource(DEFAULT_LOCATIONS[Platform.CLUSTER] if path is None else path)
    if chosen is SourceKind.FILE:
        location = DEFAULT_LOCATIONS[Platform.HOST] if path is None else path
        if platform is Platform.EDGE_RUNTIME:
            return RuntimeConfigSource(FileConfigProvider(location), SourceKind.FILE)
        return FileSource(location)
    if chosen is SourceKind.RUNTIME_CONFIG:
        if path is not None and kind is None:
            return RuntimeConfigSource(FileConfigProvider(path))
        if path is not None:
            raise ConfigError(
                [
                    ConfigIssue(
                        "-c/--config",
                        f"names nothing for {SOURCE_OPTION} RUNTIME_CONFIG (the component's "
                        f"own configuration); a file is read with {SOURCE_OPTION} FILE",
                    )
                ]
            )
        return RuntimeConfigSource(providers.RuntimeConfigProvider(environ))
    if chosen is SourceKind.CONFIG_COMPONENT:
        if path is None:
            raise ConfigError(
                [
                    ConfigIssue(
                        "-c/--config",
                        f"is required with {SOURCE_OPTION} CONFIG_COMPONENT: it names the "
                        "component whose configuration holds the document",
                    )
                ]
            )
        return RuntimeConfigSource(
            providers.ComponentConfigProvider(os.fspath(path), environ), chosen
        )
    # SHADOW
    if thing is None:
        raise ConfigError(
            [
                ConfigIssue(
                    "-t/--thing",
                    f"{SOURCE_OPTION} SHADOW reads a shadow of the thing: a thing name is "
                    "required (give -t/--thing or set AWS_IOT_THING_NAME)",
                )
            ]
        )
    if path is None and component is None:
        raise ConfigError(
            [
                ConfigIssue(
                    "-c/--config",
                    f"is required with {SOURCE_OPTION} SHADOW here: it names the shadow (the "
                    "default, unskit-{component}, needs a built-in component token)",
                )
            ]
        )
    name = f"unskit-{component}" if path is None else os.fspath(path)
    return RuntimeConfigSource(providers.ShadowProvider(thing, name, environ), chosen)


#: The sources a given `ConfigProvider` stands for.
_PROVIDED = (SourceKind.RUNTIME_CONFIG, SourceKind.SHADOW, SourceKind.CONFIG_COMPONENT)
