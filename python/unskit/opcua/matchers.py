"""Which nodes a subscription takes and what became of them: namespace URI resolution, the
bounded walk of the address space, include/exclude matching, the stable signal id, and each
monitored item's retry plan. Plain data only: the adapter talks to the server."""

from __future__ import annotations

import base64
import binascii
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from unskit.opcua.config import SignalMatcher, SubscriptionSpec
from unskit.southbound.driver import SignalSpec

__all__ = [
    "BROWSE_BUDGET",
    "BROWSE_PROGRESS",
    "ID_KINDS",
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "BrowsedNode",
    "Child",
    "MonitoredNode",
    "Selected",
    "format_stable_id",
    "parse_stable_id",
    "resolve_namespaces",
    "select",
    "walk",
]

_log = logging.getLogger(__name__)

#: The identifier kinds of a stable id: numeric, string, GUID, opaque (ByteString, base64).
ID_KINDS = ("i", "s", "g", "b")
_STABLE_ID = re.compile(r"ns=(\d{1,5});([isgb])=(.*)", re.DOTALL)


@dataclass(frozen=True)
class BrowsedNode:
    """A Variable node found by browsing."""

    namespace: int
    #: One of ID_KINDS.
    kind: str
    #: The identifier as text: the number, the string, the GUID, or base64 of the bytes.
    identifier: str
    browse_name: str
    display_name: str

    @property
    def stable_id(self) -> str:
        return format_stable_id(self.namespace, self.kind, self.identifier)


@dataclass(frozen=True)
class Selected:
    """A node a subscription monitors, with the include matcher whose settings apply."""

    node: BrowsedNode
    matcher: SignalMatcher


def format_stable_id(namespace: int, kind: str, identifier: str) -> str:
    """``ns=<index>;<i|s|g|b>=<identifier>``."""
    return f"ns={namespace};{kind}={identifier}"


def parse_stable_id(text: str) -> tuple[int, str, str]:
    """(namespace, kind, identifier) of a stable id; ValueError naming what is wrong."""
    found = _STABLE_ID.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(
            f"{text!r} is not an OPC UA node id of the form ns=<index>;<i|s|g|b>=<identifier>"
        )
    namespace, kind, identifier = int(found[1]), found[2], found[3]
    if namespace > 65535:
        raise ValueError(f"{text!r}: namespace index {namespace} is above 65535")
    if kind == "i" and not (identifier.isdigit() and int(identifier) <= 0xFFFFFFFF):
        raise ValueError(f"{text!r}: a numeric identifier is 0 to 4294967295")
    if kind == "s" and not identifier:
        raise ValueError(f"{text!r}: a string identifier cannot be empty")
    if kind == "g":
        try:
            uuid.UUID(identifier)
        except ValueError:
            raise ValueError(f"{text!r}: {identifier!r} is not a GUID") from None
    if kind == "b":
        try:
            base64.b64decode(identifier, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{text!r}: {identifier!r} is not base64") from None
    return namespace, kind, identifier


def resolve_namespaces(
    subscriptions: Iterable[SubscriptionSpec], namespace_array: Sequence[str]
) -> dict[str, int | None]:
    """Each matcher's namespace index on this server, by matcher path; None (with a warning
    naming the matcher) when its namespaceUri is absent."""
    resolved: dict[str, int | None] = {}
    for subscription in subscriptions:
        for matcher in (*subscription.include, *subscription.exclude):
            if matcher.namespace_uri is None:
                resolved[matcher.path] = matcher.namespace
            elif matcher.namespace_uri in namespace_array:
                resolved[matcher.path] = list(namespace_array).index(matcher.namespace_uri)
            else:
                _log.warning(
                    "%s: namespaceUri %r is not on the server (it has %s); matcher skipped",
                    matcher.path,
                    matcher.namespace_uri,
                    ", ".join(namespace_array),
                )
                resolved[matcher.path] = None
    return resolved


def select(
    subscription: SubscriptionSpec,
    nodes: Iterable[BrowsedNode],
    resolved: dict[str, int | None],
) -> list[Selected]:
    """The nodes one subscription monitors: in an include matcher's namespace with the
    identifier, browse name or display name fully matching its regex, and no exclude
    matcher (same namespace) fully matching the identifier. The first include matcher that
    takes a node gives its settings."""
    chosen = []
    for node in nodes:
        taker = next(
            (
                matcher
                for matcher in subscription.include
                if resolved.get(matcher.path) == node.namespace
                and any(
                    matcher.match.fullmatch(text) is not None
                    for text in (node.identifier, node.browse_name, node.display_name)
                )
            ),
            None,
        )
        if taker is None:
            continue
        if any(
            resolved.get(matcher.path) == node.namespace
            and matcher.match.fullmatch(node.identifier) is not None
            for matcher in subscription.exclude
        ):
            continue
        chosen.append(Selected(node, taker))
    return chosen


# -- the walk ----------------------------------------------------------------------------------

#: The walk stops after this many nodes (with a warning); progress is logged every
#: BROWSE_PROGRESS nodes.
BROWSE_BUDGET = 100_000
BROWSE_PROGRESS = 5_000
BROWSE_BATCH = 100


@dataclass(frozen=True)
class Child:
    """One reference a browse returned, as plain data."""

    #: The adapter's node id (hashable; opaque here).
    address: Any
    node: BrowsedNode
    variable: bool
    #: Reached by HasProperty (an EURange, an EngineeringUnits): never a signal.
    property: bool = False


Browse = Callable[[list[Hashable]], Awaitable[list[Child]]]


async def walk(
    children: Browse,
    start: Hashable,
    namespaces: set[int],
    *,
    label: str,
    budget: int = BROWSE_BUDGET,
    progress: int = BROWSE_PROGRESS,
) -> tuple[dict[str, Child], int]:
    """The Variables in `namespaces` reachable from `start` (properties left out), by stable
    id, and the number of nodes visited. Namespace-0 nodes are descended into only when
    namespace 0 is wanted; at most `budget` nodes are visited (a warning when cut)."""
    found: dict[str, Child] = {}
    seen = {start}
    queue = [start]
    visited = 0
    while queue:
        batch, queue = queue[:BROWSE_BATCH], queue[BROWSE_BATCH:]
        for child in await children(batch):
            if child.address in seen or child.property:
                continue
            seen.add(child.address)
            visited += 1
            if visited % progress == 0:
                _log.info("%s: browsed %d nodes, %d variables", label, visited, len(found))
            if visited > budget:
                _log.warning(
                    "%s: the browse stopped at its budget of %d nodes; nodes beyond it are "
                    "not matched",
                    label,
                    budget,
                )
                return found, visited - 1
            if child.variable and child.node.namespace in namespaces:
                found[child.node.stable_id] = child
            if child.node.namespace != 0 or 0 in namespaces:
                queue.append(child.address)
    return found, visited


# -- monitored items ---------------------------------------------------------------------------

RETRY_FIRST_S = 5.0
RETRY_MAX_S = 60.0


@dataclass
class MonitoredNode:
    """A matched node: its signal, its monitored item (once created) and its retry plan."""

    signal: SignalSpec
    #: The adapter's node id (opaque here).
    address: Any
    subscription: str
    matcher: SignalMatcher
    #: The item's client handle, unique in the session.
    handle: int
    #: The server's monitored item id; None while the item is not (yet) monitored.
    monitored: int | None = None
    #: "Pending" before the first attempt, "Good" once created, else the failure's name.
    status: str = "Pending"
    retry_at: float = 0.0
    retry_delay: float = RETRY_FIRST_S

    def due(self, now: float) -> bool:
        """Not monitored and its retry time has come."""
        return self.monitored is None and self.retry_at <= now

    def created(self, monitored: int) -> None:
        """The item exists on the server; the next failure starts a fresh retry plan."""
        self.monitored = monitored
        self.status = "Good"
        self.retry_delay = RETRY_FIRST_S

    def failed(self, status: str, now: float) -> tuple[bool, int | None]:
        """Records a failure and schedules the retry (5 s doubling to 60 s). Returns whether
        it is a new failure (it worked or was new before) and the server item to delete."""
        new = self.monitored is not None or self.status in ("Pending", "Good")
        stale, self.monitored = self.monitored, None
        self.status = status
        self.retry_at = now + self.retry_delay
        self.retry_delay = min(self.retry_delay * 2, RETRY_MAX_S)
        return new, stale
