"""A verb's declaration: scope, kind, requestId rule, body and handler; and what its handler
is given (`CommandContext`) and may return (`Page`, a future for deferred verbs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

from unskit.commands.fields import BodySpec
from unskit.envelope import Message

__all__ = [
    "CommandContext",
    "Kind",
    "Page",
    "ReloadOutcome",
    "RequestIdRule",
    "Scope",
    "Verb",
    "VerbResult",
]


class Scope(str, Enum):
    """Where a verb may be addressed: one instance, the component, or either."""

    INSTANCE = "instance"
    COMPONENT = "component"
    BOTH = "both"


class Kind(str, Enum):
    """Immediate verbs reply at once; deferred ones hold the reply until their outcome."""

    IMMEDIATE = "immediate"
    DEFERRED = "deferred"


class RequestIdRule(str, Enum):
    """Mutating verbs require a caller-owned requestId; read-only verbs take none;
    conditional verbs decide per body (``Verb.request_id_needed``)."""

    REQUIRED = "required"
    NONE = "none"
    CONDITIONAL = "conditional"


@dataclass(frozen=True)
class Page:
    """A paged verb's whole answer; the inbox serves it page by page from this snapshot.
    `extra` fields are merged into every page's body."""

    items: Sequence[Any]
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReloadOutcome:
    """What a configuration change did to the component's instances."""

    started: Sequence[str] = ()
    stopped: Sequence[str] = ()
    kept: Sequence[str] = ()
    skipped: Sequence[str] = ()
    #: Sections changed beyond the instances (the camera adapter's captureProfiles, limits,
    #: ...); in the body only when there are any.
    changed: Sequence[str] = ()

    def to_body(self) -> dict[str, list[str]]:
        """The reload-config reply body and the config-applied event context."""
        body = {
            "started": list(self.started),
            "stopped": list(self.stopped),
            "kept": list(self.kept),
            "skipped": list(self.skipped),
        }
        if self.changed:
            body["changed"] = list(self.changed)
        return body


@dataclass(frozen=True)
class CommandContext:
    """One validated request as its handler sees it."""

    verb: str
    #: The addressed instance (topic token, body, or the only configured one), if any.
    instance: str | None
    #: The strictly parsed body with defaults filled in (requestId, instance, limit and
    #: cursor included when the verb declares them).
    body: Mapping[str, Any]
    request_id: str | None
    request: Message
    topic: str


#: What a handler returns: a reply body, a `Page` (paged verbs), or, for deferred verbs, a
#: future of the reply body (a `CommandError` set on it becomes the failure reply).
VerbResult = Union[Mapping[str, Any], Page, "Future[Mapping[str, Any]]"]


@dataclass(frozen=True)
class Verb:
    """A command verb: ``name`` is the topic token after ``cmd/sb/`` (``capture``)."""

    name: str
    handler: Callable[[CommandContext], VerbResult]
    scope: Scope = Scope.COMPONENT
    kind: Kind = Kind.IMMEDIATE
    request_id: RequestIdRule = RequestIdRule.NONE
    body: BodySpec = field(default_factory=BodySpec)
    #: Served page by page with limit and cursor; the handler returns a `Page`.
    paged: bool = False
    #: Only with RequestIdRule.CONDITIONAL: whether this body needs a requestId.
    request_id_needed: Callable[[Mapping[str, Any]], bool] | None = None
    enabled: bool = True
    disabled_reason: str | None = None
    summary: str = ""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "+" in self.name or "#" in self.name:
            raise ValueError(f"verb name {self.name!r} must be one topic token")
        if self.request_id is RequestIdRule.CONDITIONAL and self.request_id_needed is None:
            raise ValueError(f"verb {self.name!r}: a conditional requestId needs request_id_needed")
        if self.kind is Kind.DEFERRED and self.request_id is RequestIdRule.NONE:
            raise ValueError(
                f"verb {self.name!r}: a deferred verb mutates, so it needs a requestId"
            )
        if not self.enabled and not self.disabled_reason:
            raise ValueError(f"verb {self.name!r}: a disabled verb needs a reason")

    @property
    def full_name(self) -> str:
        """``sb/<name>``: how the specification and describe name the verb."""
        return f"sb/{self.name}"

    def needs_request_id(self, body: Mapping[str, Any]) -> bool:
        """Whether this body must carry a requestId (and is then idempotent)."""
        if self.request_id is RequestIdRule.REQUIRED:
            return True
        if self.request_id is RequestIdRule.CONDITIONAL:
            assert self.request_id_needed is not None
            return self.request_id_needed(body)
        return False

    def describe(self) -> dict[str, Any]:
        """The verb's entry in the describe reply."""
        entry: dict[str, Any] = {
            "verb": self.full_name,
            "scope": self.scope.value,
            "kind": self.kind.value,
            "requestId": self.request_id.value,
            "enabled": self.enabled,
            "paged": self.paged,
        }
        if not self.enabled:
            entry["reason"] = self.disabled_reason
        if self.summary:
            entry["summary"] = self.summary
        entry["fields"] = self.body.describe()
        return entry
