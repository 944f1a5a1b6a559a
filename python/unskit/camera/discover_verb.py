"""The sb/discover verb over a `Discovery`: a first request runs one pass on its own thread
(the reply is sent when it completes), a request with a cursor pages the retained pass."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from unskit.camera.config import BACKEND_MODES
from unskit.camera.discovery import DISCOVERY_BACKENDS, Discovery, DiscoveryPass
from unskit.camera.pages import Pages, snapshot_owner
from unskit.commands import CURSOR, LIMIT, BodySpec, CommandContext, Param, Verb, bad_args
from unskit.commands.fields import Integer, ListOf, Text

__all__ = ["DEFAULT_DISCOVER_TIMEOUT_MS", "discover_verb"]

DEFAULT_DISCOVER_TIMEOUT_MS = 5000
_OWNER = snapshot_owner("discover")


def discover_verb(discovery: Discovery, pages: Pages, enabled: bool, disabled_reason: str) -> Verb:
    """sb/discover (disabled with `disabled_reason` unless `enabled`)."""

    def handle(context: CommandContext) -> Mapping[str, Any] | Future[Mapping[str, Any]]:
        body = context.body
        if "cursor" in body:
            for name in ("backends", "timeoutMs"):
                if name in body:
                    raise bad_args(f"{name} does not apply to a continuation (cursor)")
            items, cursor, extra = pages.page(context, _OWNER, [], {})
            return {"candidates": items, "nextCursor": cursor, **extra}
        backends = list(body.get("backends") or DISCOVERY_BACKENDS)
        if len(set(backends)) != len(backends):
            raise bad_args("backends must be distinct")
        for name in backends:
            if name == "sim":
                raise bad_args("backends: sim cameras cannot be discovered")
            if name not in BACKEND_MODES:
                raise bad_args(f"backends: unknown backend {name!r}")
        passed = discovery.submit(int(body.get("timeoutMs", DEFAULT_DISCOVER_TIMEOUT_MS)), backends)
        reply: Future[Mapping[str, Any]] = Future()

        def settle(done: Future[DiscoveryPass]) -> None:
            error = done.exception()
            if error is not None:
                reply.set_exception(error)
                return
            found = done.result()
            extra = {"completedAt": found.completed_at}
            items, cursor, _ = pages.page(context, _OWNER, list(found.candidates), extra)
            reply.set_result({"candidates": items, "nextCursor": cursor, **extra})

        passed.add_done_callback(settle)
        return reply

    return Verb(
        "discover",
        handle,
        enabled=enabled,
        disabled_reason=None if enabled else disabled_reason,
        body=BodySpec(
            {
                "backends": Param(ListOf(Text(min_bytes=1, max_bytes=64), max_items=16)),
                "timeoutMs": Param(Integer(minimum=100, maximum=300_000)),
                "limit": Param(LIMIT),
                "cursor": Param(CURSOR),
            }
        ),
        summary="a bounded, credential-free discovery pass (WS-Discovery for ONVIF)",
    )
