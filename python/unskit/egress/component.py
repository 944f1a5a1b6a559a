"""`unskit run file-egress`: source directories delivered to their `egress` destinations,
with progress events and metrics, and sb/status, sb/pause, sb/resume and sb/retry."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from unskit.commands import (
    BodySpec,
    CommandContext,
    ErrorCode,
    Param,
    ReloadOutcome,
    RequestIdRule,
    Scope,
    Text,
    Verb,
)
from unskit.config.model import ComponentConfig
from unskit.config.secrets import SecretResolver
from unskit.egress.config import TOKEN, component_schema, configuration_issues, parse_component
from unskit.egress.pipeline import InstancePipeline, Pipeline
from unskit.egress.records import FileState
from unskit.egress.state import EgressState
from unskit.errors import CommandError, ConfigError, ConfigIssue, UnskitError
from unskit.runtime.component import Runtime

__all__ = ["FileEgress", "state_path"]

_log = logging.getLogger(__name__)

STATE_FILE = "egress.sqlite3"


def state_path(config: ComponentConfig, state_dir: Path | None) -> Path:
    """``{stateDir}/{thing}/{component}/egress.sqlite3``: global.stateDir, else the
    directory the command inbox keeps its records in."""
    if state_dir is not None:
        return state_dir / config.thing_name / config.component_token / STATE_FILE
    return config.commands.store_path(config.thing_name, config.component_token).with_name(
        STATE_FILE
    )


class FileEgress:
    """Watches each instance's source directory and delivers to its egress destinations."""

    token: ClassVar[str] = TOKEN
    schema: ClassVar[Mapping[str, Any] | None] = component_schema()

    def __init__(self) -> None:
        self._runtime: Runtime | None = None
        self.pipeline: Pipeline | None = None
        self.state: EgressState | None = None

    @classmethod
    def configuration_issues(cls, config: ComponentConfig) -> list[ConfigIssue]:
        """Rules beyond the schema (unique ids, archiveDir, backends in this build)."""
        return configuration_issues(config)

    def start(self, runtime: Runtime) -> None:
        """Opens the progress store, starts every instance and offers the verbs."""
        self._runtime = runtime
        config = runtime.config
        settings = parse_component(config)
        self.state = EgressState(
            state_path(config, settings.state_dir),
            synchronous_full=config.commands.durable_sync,
        )
        secrets: SecretResolver | None = (
            config.secrets() if config.credentials is not None else None
        )
        try:
            self.pipeline = Pipeline(
                settings,
                self.state,
                metrics=runtime.metrics,
                events=self._event,
                secrets=secrets,
                supervisor=runtime.supervisor,
            ).start()
        except BaseException:
            self.state.close()
            raise
        state, pipeline = self.state, self.pipeline
        runtime.observe_queue(
            "egress.files",
            lambda: sum(
                state.counts(i).get(FileState.ACTIVE.value, 0) for i in pipeline.instance_ids()
            ),
        )
        inbox = runtime.command_inbox(lambda: self._pipeline().instance_ids())
        for verb in (
            Verb(
                "status",
                self._status,
                scope=Scope.BOTH,
                summary="queue and each file's per-destination state",
            ),
            Verb("pause", self._pause, scope=Scope.INSTANCE, summary="hold transfers"),
            Verb("resume", self._resume, scope=Scope.INSTANCE, summary="transfer again"),
            Verb(
                "retry",
                self._retry,
                scope=Scope.INSTANCE,
                request_id=RequestIdRule.REQUIRED,
                body=BodySpec({"file": Param(Text(max_bytes=4096))}),
                summary="queue permanently failed deliveries again (one file, or all)",
            ),
        ):
            inbox.register(verb)
        runtime.set_ready(True)

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome:
        """Applies a changed configuration live, per instance (ConfigError rejects it whole
        and keeps the running one)."""
        issues = configuration_issues(config)
        if issues:
            raise ConfigError(issues)
        settings = parse_component(config)
        state = self.state
        assert state is not None
        if state_path(config, settings.state_dir) != state.path:
            raise ConfigError(
                [
                    ConfigIssue(
                        "$.component.global.stateDir",
                        "applies only at restart: the progress store stays where it is open",
                    )
                ]
            )
        secrets = config.secrets() if config.credentials is not None else None
        started, stopped, kept = self._pipeline().reconfigure(settings, secrets)
        _log.info("instances: started %s, stopped %s, kept %s", started, stopped, kept)
        return ReloadOutcome(started=started, stopped=stopped, kept=kept)

    def _event(
        self, severity: str, event_type: str, context: Mapping[str, Any], instance: str
    ) -> None:
        events = self._runtime.events if self._runtime is not None else None
        if events is None:
            return
        try:
            events.emit(severity, event_type, context, instance=instance)
        except UnskitError as error:
            _log.warning("event %s not published: %s", event_type, error)

    def _pipeline(self) -> Pipeline:
        if self.pipeline is None:
            raise CommandError(ErrorCode.COMPONENT_STOPPING, "file-egress is not running")
        return self.pipeline

    def _instance(self, instance_id: str | None) -> InstancePipeline:
        assert instance_id is not None
        instance = self._pipeline().instance(instance_id)
        if instance is None:
            raise CommandError(ErrorCode.NO_SUCH_INSTANCE, f"no instance named {instance_id!r}")
        return instance

    def _status(self, context: CommandContext) -> Mapping[str, Any]:
        if context.instance is not None:
            return self._instance(context.instance).status()
        assert self._runtime is not None
        return {
            "component": self._runtime.topics.component,
            "messaging": self._runtime.messaging_status(),
            "instances": self._pipeline().status(),
        }

    def _pause(self, context: CommandContext) -> Mapping[str, Any]:
        changed = self._instance(context.instance).pause()
        return {"instance": context.instance, "paused": True, "changed": changed}

    def _resume(self, context: CommandContext) -> Mapping[str, Any]:
        changed = self._instance(context.instance).resume()
        return {"instance": context.instance, "paused": False, "changed": changed}

    def _retry(self, context: CommandContext) -> Mapping[str, Any]:
        files = self._instance(context.instance).retry(context.body.get("file"))
        return {"instance": context.instance, "requeued": files}

    def drain(self) -> None:
        """Stops every transfer at its next chunk (progress kept)."""
        if self.pipeline is not None:
            self.pipeline.stop()
            # Verbs from here on answer COMPONENT_STOPPING; the store stays open for them.
            self.pipeline = None

    def close(self) -> None:
        """Closes the progress store; the runtime calls it after the last metric read it."""
        if self.state is not None:
            self.state.close()
            self.state = None
