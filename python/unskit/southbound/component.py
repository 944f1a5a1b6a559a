"""The component shape every southbound adapter shares: parse the instances, run them
through a `SouthboundService`, offer the sb verbs and apply reloads."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from unskit.commands import CommandInbox, ReloadOutcome
from unskit.config.model import ComponentConfig, thaw
from unskit.errors import ConfigIssue
from unskit.runtime.component import Runtime
from unskit.southbound.driver import InstanceSpec
from unskit.southbound.service import DriverFactory, Skipped, SouthboundService

__all__ = [
    "Candidate",
    "SouthboundComponent",
    "metrics_interval",
    "parse_instances",
    "shared_sections",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A parsed configuration: valid instances in declaration order and the skipped ones."""

    specs: Sequence[InstanceSpec]
    skipped: Sequence[Skipped]


def parse_instances(
    entries: Iterable[Any],
    issues_of: Callable[[Any, int], list[ConfigIssue]],
    build: Callable[[Mapping[str, Any], str], InstanceSpec],
) -> Candidate:
    """The instances of `component.instances`: an entry with issues (`issues_of(entry,
    index)`) is skipped with them, a repeated id is skipped (the first entry wins), every
    other entry is `build(entry, path)`; declaration order is kept."""
    specs: list[InstanceSpec] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        path = f"$.component.instances[{index}]"
        ident = entry.get("id") if isinstance(entry, Mapping) else None
        name = ident if isinstance(ident, str) and ident else f"#{index}"
        issues = issues_of(entry, index)
        if issues:
            reason = "; ".join(str(issue) for issue in issues)
            skipped.append(Skipped(name, reason, tuple(issues)))
            continue
        if name in seen:
            issue = ConfigIssue(f"{path}.id", "duplicate id: the first entry wins")
            skipped.append(Skipped(name, str(issue), (issue,)))
            continue
        seen.add(name)
        specs.append(build(entry, path))
    return Candidate(specs, skipped)


def shared_sections(config: ComponentConfig) -> dict[str, Any]:
    """Everything outside component.instances[]: a change there restarts every instance."""
    document = thaw(config.document)
    component = dict(document.get("component") or {})
    component.pop("instances", None)
    return {**document, "component": component}


def metrics_interval(candidate: Candidate, config: ComponentConfig) -> float:
    """The metric cadence: the adapter's metricsIntervalSecs when given, else
    metricEmission.intervalSeconds (whose default, 60 s, the adapter key shares)."""
    # metricsIntervalSecs is component-global: every instance carries the same timing.
    own = candidate.specs[0].timing.metrics_interval_secs if candidate.specs else None
    return float(own) if own is not None else config.metric_emission.interval_seconds


class SouthboundComponent:
    """Base of the CIP and OPC UA adapter components."""

    token: ClassVar[str]
    schema: ClassVar[Mapping[str, Any] | None]

    def __init__(self) -> None:
        self.service: SouthboundService | None = None
        self._runtime: Runtime | None = None

    def drivers(self) -> Mapping[str, DriverFactory]:
        """The backends this build has, by adapter name."""
        raise NotImplementedError

    def parse(self, config: ComponentConfig) -> Candidate:
        """The instances of a configuration; malformed ones are skipped, not raised."""
        raise NotImplementedError

    @classmethod
    def configuration_issues(cls, config: ComponentConfig) -> list[ConfigIssue]:
        """The instance entries the component would skip or run failed, as issues."""
        candidate = cls().parse(config)
        skipped = [
            issue
            for entry in candidate.skipped
            for issue in (entry.issues or (ConfigIssue(f"instance {entry.id}", entry.reason),))
        ]
        failed = [spec.unavailable for spec in candidate.specs if spec.unavailable is not None]
        return [*skipped, *failed]

    def start(self, runtime: Runtime) -> None:
        """Starts every valid instance (refusing to start with none) and offers the verbs."""
        # Before drivers(): a backend's factory may count in the runtime's metrics.
        self._runtime = runtime
        service = SouthboundService(runtime, self.drivers())
        candidate = self.parse(runtime.config)
        service.apply(candidate.specs, candidate.skipped, shared_sections(runtime.config))
        self._follow_metrics_interval(candidate, runtime.config)
        self.service = service
        inbox = runtime.command_inbox(service.instance_ids)
        service.register_verbs(inbox)
        self.register_verbs(inbox)

    def register_verbs(self, inbox: CommandInbox) -> None:
        """The adapter's own verbs beside the shared sb verbs (none by default)."""

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome:
        """Applies a changed configuration as one transaction (ConfigError rejects it)."""
        assert self.service is not None
        candidate = self.parse(config)
        outcome = self.service.apply(candidate.specs, candidate.skipped, shared_sections(config))
        self._follow_metrics_interval(candidate, config)
        return outcome

    def _follow_metrics_interval(self, candidate: Candidate, config: ComponentConfig) -> None:
        if self._runtime is not None:
            self._runtime.set_metrics_interval(metrics_interval(candidate, config))

    def drain(self) -> None:
        """Stops every instance: the last batches are published, connections closed."""
        if self.service is not None:
            self.service.stop_all()
