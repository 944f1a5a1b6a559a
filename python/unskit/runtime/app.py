"""What a component implements, for the `Runtime` to run it: `ComponentApp` (started with
the runtime, drained at shutdown, its stores closed last) and `ReconfigurableApp` (one that
applies a changed configuration live)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from unskit.commands.verbs import ReloadOutcome
from unskit.config.model import ComponentConfig

if TYPE_CHECKING:
    from unskit.runtime.component import Runtime


class ComponentApp(Protocol):
    """What a component implements; the runtime owns everything around it. A component
    whose section has rules its schema cannot say also offers a classmethod
    ``configuration_issues(config) -> list[ConfigIssue]``, which `unskit validate` calls.
    A component holding stores that its metrics, verbs or message handlers read (a catalog,
    delivery progress) also offers ``close()``: the runtime calls it once at shutdown, after
    the final metric emission and after messaging closed, so nothing reads a closed store."""

    #: The {component} topic token used when the configuration sets none.
    token: ClassVar[str]
    #: JSON Schema of the `component` section, or None to accept any object.
    schema: ClassVar[Mapping[str, Any] | None]

    def start(self, runtime: Runtime) -> None:
        """Subscribes, starts its own threads; returns promptly."""
        ...

    def drain(self) -> None:
        """Finishes in-flight work; called once at shutdown, before messaging closes."""
        ...


class ReconfigurableApp(ComponentApp, Protocol):
    """A component that applies a changed configuration live (and so offers reload-config)."""

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome | None:
        """Applies `config`; raises ConfigError to reject it and keep the running one."""
        ...
