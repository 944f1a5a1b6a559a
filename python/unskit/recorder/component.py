"""`unskit run signal-recorder`: signal updates recorded as Parquet files into an output
root the file egress delivers, with sb/status, sb/flush, sb/pause, sb/resume and
reload-config."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from unskit.commands import ReloadOutcome
from unskit.config.model import ComponentConfig
from unskit.errors import ConfigError, ConfigIssue, UnskitError
from unskit.recorder.config import TOKEN, component_schema, configuration_issues, parse_component
from unskit.runtime.component import Runtime
from unskit.runtime.events import Severity

if TYPE_CHECKING:
    from unskit.recorder.service import Recorder

__all__ = ["SignalRecorder"]

_log = logging.getLogger(__name__)

METRICS_FAMILY = "recorder"


class SignalRecorder:
    """Subscribes to signal updates and writes them through a `Recorder`."""

    token: ClassVar[str] = TOKEN
    schema: ClassVar[Mapping[str, Any] | None] = component_schema()

    def __init__(self) -> None:
        self._runtime: Runtime | None = None
        # Imported on start: pyarrow loads only in a configuration that passed the check
        # naming the missing extra.
        self.recorder: Recorder | None = None

    @classmethod
    def configuration_issues(cls, config: ComponentConfig) -> list[ConfigIssue]:
        """Rules beyond the schema (filters, pyarrow installed)."""
        return configuration_issues(config)

    def start(self, runtime: Runtime) -> None:
        """Subscribes, starts the roll clock and offers the verbs; refuses (ConfigError) what
        `unskit validate` refuses, pyarrow missing among it, before importing pyarrow."""
        issues = configuration_issues(runtime.config)
        if issues:
            raise ConfigError(issues)
        from unskit.recorder.service import Recorder
        from unskit.recorder.verbs import recorder_verbs

        self._runtime = runtime
        settings = parse_component(runtime.config)
        self.recorder = Recorder(
            settings,
            runtime.get_messaging(),
            alarm=self._alarm,
            count=self._count,
            # {root}[/{root level}]/{device}/{component}: the device is two above the head.
            device_level=runtime.topics.head_levels - 2,
        ).start()
        recorder = self.recorder
        runtime.observe_queue("recorder.subscription", recorder.queued)
        runtime.metrics.observe(METRICS_FAMILY, "openFiles", lambda: recorder.writer.open_files, {})
        inbox = runtime.command_inbox()
        for verb in recorder_verbs(lambda: self.recorder):
            inbox.register(verb)
        runtime.set_ready(True)

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome:
        """Applies a changed configuration live; ConfigError rejects it whole."""
        issues = configuration_issues(config)
        if issues:
            raise ConfigError(issues)
        settings = parse_component(config)
        if self.recorder is None:
            raise ConfigError([ConfigIssue("$.component", "the recorder is not running")])
        added, removed, kept = self.recorder.reconfigure(settings)
        _log.info("subscriptions: added %s, removed %s, kept %s", added, removed, kept)
        return ReloadOutcome(started=added, stopped=removed, kept=kept)

    def _alarm(self, alarm_type: str, raised: bool, context: Mapping[str, Any]) -> None:
        events = self._runtime.events if self._runtime is not None else None
        if events is None:
            return
        try:
            if raised:
                severity = Severity.WARNING if alarm_type.endswith("rejected") else Severity.ERROR
                events.raise_alarm(alarm_type, context, severity=severity)
            else:
                events.clear_alarm(alarm_type, context)
        except UnskitError as error:
            _log.warning("alarm %s not published: %s", alarm_type, error)

    def _count(self, name: str, amount: int, labels: Mapping[str, str] | None) -> None:
        if self._runtime is not None:
            self._runtime.metrics.counter(METRICS_FAMILY, name, dict(labels or {})).inc(amount)

    def drain(self) -> None:
        """Stops recording; with flushOnStop (default) every open file is closed."""
        if self.recorder is not None:
            self.recorder.stop()
            self.recorder = None
