"""The edge runtime's component configuration over IPC: read, follow, validate.

Small typed calls over awsiotsdk's V2 client that return plain Python data and raise unskit
errors. Every call uses the SDK's asynchronous form with a deadline: the synchronous forms
wait on their future without one, and a nucleus that stops answering would hang the caller.
Stream events arrive on the SDK's event-loop thread; the callbacks given here must only hand
them on (to a bounded queue), never do the work there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unskit.edge.connection import IpcConnection, edge_error
from unskit.errors import ComponentNotFoundError

__all__ = [
    "OPERATION_TIMEOUT_S",
    "ComponentNotFoundError",
    "Stream",
    "ValidationRequest",
    "get_configuration",
    "send_validity_report",
    "subscribe_to_configuration_update",
    "subscribe_to_validate_configuration_updates",
]

_log = logging.getLogger(__name__)

#: How long one request may wait for the nucleus's answer.
OPERATION_TIMEOUT_S = 10.0
#: The nucleus records that it awaits a validity report only after it has sent the event,
#: so a report that overtakes that is refused ("never made"); it is retried this long.
_REPORT_RETRY_S = 2.0


@dataclass(frozen=True)
class ValidationRequest:
    """A deployment's proposed configuration for this component, to accept or reject."""

    deployment_id: str | None
    configuration: dict[str, Any]


class Stream:
    """An open IPC subscription; `close` ends it (idempotent, never raises)."""

    def __init__(self, operation: Any, name: str) -> None:
        self._operation = operation
        self._name = name
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._operation.close().result(OPERATION_TIMEOUT_S)
        except Exception as exc:  # a stream already gone with its connection
            _log.debug("edge runtime: closing %s: %s", self._name, exc)


def stream_ends(on_closed: Callable[[str], None]) -> dict[str, Any]:
    """The SDK's stream-error and stream-closed callbacks, both reported to `on_closed` with
    the reason (an error closes the stream: it is of no use after one)."""

    def error(exc: Exception) -> bool:
        on_closed(f"{type(exc).__name__}: {exc}")
        return True

    return {
        "on_stream_error": error,
        "on_stream_closed": lambda: on_closed("the stream was closed"),
    }


def _result(future: Any, operation: str, resource: str = "") -> Any:
    try:
        return future.result(OPERATION_TIMEOUT_S)
    except Exception as exc:
        raise edge_error(exc, operation, resource) from exc


def _not_found(exc: BaseException) -> bool:
    from awsiot.greengrasscoreipc import model

    return isinstance(exc, model.ResourceNotFoundError)


def get_configuration(connection: IpcConnection, component: str | None = None) -> dict[str, Any]:
    """The whole configuration of `component` (this component's own when None)."""
    future = connection.client.get_configuration_async(component_name=component, key_path=[])
    try:
        reply = future.result(OPERATION_TIMEOUT_S)
    except Exception as exc:
        if component is not None and _not_found(exc):
            raise ComponentNotFoundError("GetConfiguration", component) from None
        raise edge_error(exc, "GetConfiguration", component or "") from exc
    value = reply.value
    return dict(value) if isinstance(value, dict) else {}


def subscribe_to_configuration_update(
    connection: IpcConnection,
    component: str | None,
    on_change: Callable[[list[str]], None],
    on_closed: Callable[[str], None],
) -> Stream:
    """Calls `on_change(key_path)` (on the SDK's thread) for every changed key of
    `component`'s configuration; the nucleus sends one event per changed leaf."""

    def event(message: Any) -> None:
        update = getattr(message, "configuration_update_event", None)
        if update is not None:
            on_change(list(update.key_path or []))

    future, operation = connection.client.subscribe_to_configuration_update_async(
        component_name=component,
        key_path=[],
        on_stream_event=event,
        **stream_ends(on_closed),
    )
    try:
        future.result(OPERATION_TIMEOUT_S)
    except Exception as exc:
        if component is not None and _not_found(exc):
            raise ComponentNotFoundError("SubscribeToConfigurationUpdate", component) from None
        raise edge_error(exc, "SubscribeToConfigurationUpdate", component or "") from exc
    return Stream(operation, "SubscribeToConfigurationUpdate")


def subscribe_to_validate_configuration_updates(
    connection: IpcConnection,
    on_validate: Callable[[ValidationRequest], None],
    on_closed: Callable[[str], None],
) -> Stream:
    """Calls `on_validate` (on the SDK's thread) with each deployment's proposed configuration
    of this component; the deployment waits for `send_validity_report`."""

    def event(message: Any) -> None:
        proposed = getattr(message, "validate_configuration_update_event", None)
        if proposed is not None:
            configuration = proposed.configuration
            on_validate(
                ValidationRequest(
                    proposed.deployment_id,
                    dict(configuration) if isinstance(configuration, dict) else {},
                )
            )

    future, operation = connection.client.subscribe_to_validate_configuration_updates_async(
        on_stream_event=event,
        **stream_ends(on_closed),
    )
    _result(future, "SubscribeToValidateConfigurationUpdates")
    return Stream(operation, "SubscribeToValidateConfigurationUpdates")


def send_validity_report(
    connection: IpcConnection, deployment_id: str | None, accepted: bool, message: str = ""
) -> None:
    """ACCEPTED, or REJECTED with `message`, for the deployment that asked."""
    from awsiot.greengrasscoreipc import model

    report = model.ConfigurationValidityReport(
        status=(
            model.ConfigurationValidityStatus.ACCEPTED
            if accepted
            else model.ConfigurationValidityStatus.REJECTED
        ),
        deployment_id=deployment_id,
        message=message or None,
    )
    deadline = time.monotonic() + _REPORT_RETRY_S
    while True:
        future = connection.client.send_configuration_validity_report_async(
            configuration_validity_report=report
        )
        try:
            future.result(OPERATION_TIMEOUT_S)
            return
        except model.InvalidArgumentsError as exc:
            if time.monotonic() >= deadline:
                raise edge_error(
                    exc, "SendConfigurationValidityReport", deployment_id or ""
                ) from exc
            time.sleep(0.05)  # the nucleus's bookkeeping trails its event (see above)
        except Exception as exc:
            raise edge_error(exc, "SendConfigurationValidityReport", deployment_id or "") from exc
