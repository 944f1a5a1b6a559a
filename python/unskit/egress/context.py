"""What the parts of one egress instance share: its configuration and progress store, how
it announces what it did, and the signals its threads wait on."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unskit.egress.backends import safe_relative
from unskit.egress.config import InstanceSpec
from unskit.egress.state import EgressState
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.supervision import Supervisor

__all__ = ["EventSink", "InstanceContext", "ProgressSink", "no_events"]

#: (severity, event type, context, instance): how the pipeline announces what it did.
EventSink = Callable[[str, str, Mapping[str, Any], str], None]
#: (instance, destination, relative path, bytes done, size): live progress for a CLI.
ProgressSink = Callable[[str, str, str, int, int], None]


def no_events(_severity: str, _type: str, _context: Mapping[str, Any], _instance: str) -> None:
    """The event sink that drops every event."""
    return None


@dataclass
class InstanceContext:
    """One instance's shared state; its scanner, workers and source lifecycle hold it."""

    spec: InstanceSpec
    state: EgressState
    metrics: MetricsRegistry
    events: EventSink
    # One-shot mode (`unskit egress send`): these files, by relative path, instead of a
    # watched directory; they are delivered but never deleted or archived.
    files: dict[str, Path] | None = None
    # The component's (its failures alarm and count there); None: one of the context's own.
    supervisor: Supervisor | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    # Set while paused or stopping: transfers in flight stop at their next chunk.
    halt: threading.Event = field(default_factory=threading.Event)
    paused: bool = False
    # Shared by the scanner and the workers: every change of queue, schedule or pause
    # state is announced on it.
    wake: threading.Condition = field(default_factory=threading.Condition)
    # Held while a file is queued or completed: a file is never both at once.
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def id(self) -> str:
        """The instance id."""
        return self.spec.id

    def announce(self, severity: str, event_type: str, context: Mapping[str, Any]) -> None:
        """Hands one event of this instance to the event sink."""
        self.events(severity, event_type, context, self.spec.id)

    def notify(self) -> None:
        """Wakes every thread of this instance to look at the queue again."""
        with self.wake:
            self.wake.notify_all()

    def source_path(self, rel: str) -> Path:
        """The absolute source path of a relative one."""
        if self.files is not None and rel in self.files:
            return self.files[rel]
        return self.spec.source.path.joinpath(*safe_relative(rel).parts)
