"""`unskit run camera-adapter`: still-image captures on command or schedule."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from unskit.camera.config import TOKEN, component_schema, configuration_issues, parse_settings
from unskit.camera.service import CameraService
from unskit.camera.verbs import CameraVerbs
from unskit.commands.verbs import ReloadOutcome
from unskit.config.model import ComponentConfig
from unskit.errors import ConfigIssue
from unskit.runtime.component import Runtime

__all__ = ["CameraAdapter"]

_log = logging.getLogger(__name__)


class CameraAdapter:
    """The camera adapter: a CameraService behind the cmd/sb verbs."""

    token: ClassVar[str] = TOKEN
    schema: ClassVar[Mapping[str, Any] | None] = component_schema()

    def __init__(self) -> None:
        self.service: CameraService | None = None

    @classmethod
    def configuration_issues(cls, config: ComponentConfig) -> list[ConfigIssue]:
        """Rules of the section its schema cannot say."""
        return configuration_issues(config)

    def start(self, runtime: Runtime) -> None:
        """Recovers the catalog, starts the dispatchers and registers the verbs."""
        settings = parse_settings(runtime.config)
        service = CameraService(
            settings,
            messaging=runtime.get_messaging(),
            topics=runtime.topics,
            stamp=runtime.config,
            metrics=runtime.metrics,
            events=runtime.events,
            secrets=runtime.config.secrets() if runtime.config.credentials is not None else None,
            # The transport in use caps the thumbnail size (spec 2), not the configuration.
            ipc=runtime.get_messaging().small_messages_only(),
            publish_watch=runtime.publish_watch,
            supervisor=runtime.supervisor,
        )
        self.service = service
        service.start()
        catalog = service.catalog
        runtime.observe_queue("camera.captures", lambda: sum(catalog.counts().values()))
        inbox = runtime.command_inbox(service.sessions.names)
        for verb in CameraVerbs(service, runtime.messaging_status).verbs():
            inbox.register(verb)
        runtime.set_ready(True)
        _log.info(
            "%d cameras; images under %s", len(service.sessions), settings.storage.output_root
        )

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome:
        """Applies a changed configuration live, per camera (ConfigError rejects it whole
        and keeps the running one)."""
        assert self.service is not None
        settings = parse_settings(config)
        secrets = config.secrets() if config.credentials is not None else None
        return self.service.reconfigure(settings, secrets)

    def drain(self) -> None:
        """Fails the backlog with COMPONENT_STOPPING and lets in-flight captures finish."""
        if self.service is not None:
            self.service.drain()

    def close(self) -> None:
        """Closes the catalog; the runtime calls it after the last metric read it."""
        if self.service is not None:
            self.service.close()
