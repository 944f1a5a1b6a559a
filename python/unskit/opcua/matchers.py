"""Which browsed nodes a subscription takes: namespace URI resolution, include/exclude
matching and the stable signal id. Plain data only (the adapter browses; this decides)."""

from __future__ import annotations

import base64
import binascii
import logging
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from unskit.opcua.config import SignalMatcher, SubscriptionSpec

__all__ = [
    "ID_KINDS",
    "BrowsedNode",
    "Selected",
    "format_stable_id",
    "parse_stable_id",
    "resolve_namespaces",
    "select",
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
