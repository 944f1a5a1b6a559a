"""The edge runtime's local shadow service and pub/sub subscription, over IPC.

Typed calls over awsiotsdk's V2 client (the shadow manager's GetThingShadow and
UpdateThingShadow, the local bus's SubscribeToTopic) that return plain Python data and raise
unskit errors, each with a deadline (see `unskit.edge.configuration`). A permission the
component lacks is an `AccessDeniedError` naming the operation and the shadow's resource,
`$aws/things/{thing}/shadow/name/{name}`, the form its accessControl policy lists.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from unskit.edge.configuration import OPERATION_TIMEOUT_S, Stream, stream_ends
from unskit.edge.connection import IpcConnection, edge_error

__all__ = [
    "delta_topic",
    "get_thing_shadow",
    "shadow_resource",
    "subscribe_to_topic",
    "update_thing_shadow",
]


def shadow_resource(thing: str, name: str) -> str:
    """The resource a ShadowManager accessControl policy names for one named shadow."""
    return f"$aws/things/{thing}/shadow/name/{name}"


def delta_topic(thing: str, name: str) -> str:
    """The local topic the shadow manager publishes each desired-versus-reported delta on."""
    return f"{shadow_resource(thing, name)}/update/delta"


def get_thing_shadow(connection: IpcConnection, thing: str, name: str) -> dict[str, Any] | None:
    """The named shadow's document (`state`, `metadata`, `version`); None when there is none.

    The payload is returned parsed but unchecked: what `state.desired` holds is the
    caller's to judge."""
    from awsiot.greengrasscoreipc import model

    future = connection.client.get_thing_shadow_async(thing_name=thing, shadow_name=name)
    try:
        reply = future.result(OPERATION_TIMEOUT_S)
    except model.ResourceNotFoundError:
        return None
    except Exception as exc:
        raise edge_error(exc, "GetThingShadow", shadow_resource(thing, name)) from exc
    document = json.loads(reply.payload)
    return document if isinstance(document, dict) else {}


def update_thing_shadow(
    connection: IpcConnection, thing: str, name: str, state: dict[str, Any]
) -> None:
    """Sends ``{"state": state}`` (the shadow merges it into the document)."""
    payload = json.dumps({"state": state}, separators=(",", ":")).encode()
    future = connection.client.update_thing_shadow_async(
        thing_name=thing, shadow_name=name, payload=payload
    )
    try:
        future.result(OPERATION_TIMEOUT_S)
    except Exception as exc:
        raise edge_error(exc, "UpdateThingShadow", shadow_resource(thing, name)) from exc


def subscribe_to_topic(
    connection: IpcConnection,
    topic: str,
    on_message: Callable[[bytes], None],
    on_closed: Callable[[str], None],
) -> Stream:
    """Calls `on_message(payload)` (on the SDK's thread) for each message on the local bus's
    `topic`; a JSON message is handed on re-encoded as JSON bytes."""

    def event(message: Any) -> None:
        binary = getattr(message, "binary_message", None)
        if binary is not None:
            on_message(bytes(binary.message or b""))
            return
        structured = getattr(message, "json_message", None)
        if structured is not None:
            on_message(json.dumps(structured.message).encode())

    future, operation = connection.client.subscribe_to_topic_async(
        topic=topic,
        on_stream_event=event,
        **stream_ends(on_closed),
    )
    try:
        future.result(OPERATION_TIMEOUT_S)
    except Exception as exc:
        raise edge_error(exc, "SubscribeToTopic", topic) from exc
    return Stream(operation, f"SubscribeToTopic {topic}")
