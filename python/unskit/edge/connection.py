"""One component's connection to the nucleus, and the SDK's errors made unskit's.

The nucleus hands every component the path of its IPC socket and a service token
(`SVCUID`); the connection authenticates with that token. awsiotsdk's V2 client runs over
the V1 connection so that a lifecycle handler sees the connection drop (the V2 client alone
would not say), and without its executor: stream events arrive on the SDK's event-loop
thread and the callers hand them on to their own bounded queues.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from unskit.errors import AccessDeniedError, EdgeRuntimeError, missing_extra

__all__ = ["SOCKET_ENV", "TOKEN_ENV", "IpcConnection", "IpcEndpoint", "edge_error"]

_log = logging.getLogger(__name__)

#: The variables the runtime hands every component it runs.
SOCKET_ENV = "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"
TOKEN_ENV = "SVCUID"
#: How long one connect attempt may take before it counts as failed.
CONNECT_TIMEOUT_S = 5.0

LostCallback = Callable[[str], None]


@dataclass(frozen=True)
class IpcEndpoint:
    """Where the nucleus listens and the token that names this component to it."""

    socket_path: str
    token: str = field(repr=False)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> IpcEndpoint:
        """The endpoint the runtime handed this process; EdgeRuntimeError naming what is unset."""
        env = os.environ if environ is None else environ
        missing = [name for name in (SOCKET_ENV, TOKEN_ENV) if not env.get(name)]
        if missing:
            raise EdgeRuntimeError(
                f"the edge runtime's IPC variables are not set: {', '.join(missing)} "
                "(a component gets them when the runtime starts it)"
            )
        return cls(env[SOCKET_ENV], env[TOKEN_ENV])


def edge_error(exc: BaseException, operation: str, resource: str = "") -> EdgeRuntimeError:
    """The unskit error for an SDK failure of `operation` (on `resource`, e.g. a topic)."""
    where = f"{operation} {resource}".strip()
    if isinstance(exc, EdgeRuntimeError):
        return exc
    try:
        from awsiot import eventstreamrpc
        from awsiot.greengrasscoreipc import model
    except ImportError:
        return EdgeRuntimeError(f"{where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, (eventstreamrpc.AccessDeniedError, model.UnauthorizedError)):
        detail = getattr(exc, "message", None) or ""
        return AccessDeniedError(
            f"{where}: access denied by the edge runtime (the component's recipe needs an "
            f"accessControl policy allowing {operation}{' on ' + resource if resource else ''})"
            + (f": {detail}" if detail else ""),
            operation=operation,
            resource=resource,
        )
    if isinstance(exc, model.GreengrassCoreIPCError):
        kind = type(exc).__name__.removesuffix("Error")
        detail = getattr(exc, "message", None) or str(exc)
        return EdgeRuntimeError(f"{where}: the edge runtime refused it ({kind}): {detail}")
    if isinstance(exc, TimeoutError):  # concurrent.futures.TimeoutError too
        return EdgeRuntimeError(f"{where}: the edge runtime did not answer in time")
    if isinstance(exc, (eventstreamrpc.ConnectionClosedError, eventstreamrpc.StreamClosedError)):
        return EdgeRuntimeError(f"{where}: the IPC connection to the edge runtime is closed")
    return EdgeRuntimeError(f"{where}: {type(exc).__name__}: {exc}")


class IpcConnection:
    """One IPC connection: connect (raises EdgeRuntimeError), the client, loss reported once."""

    def __init__(self, endpoint: IpcEndpoint, on_lost: LostCallback | None = None) -> None:
        self.endpoint = endpoint
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._client: Any = None
        self._connected = False

    def connect(self, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Opens the connection; EdgeRuntimeError saying why when the nucleus is not there
        or refuses the token."""
        try:
            from awsiot import greengrasscoreipc
            from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2
        except ImportError as exc:
            raise EdgeRuntimeError(
                missing_extra("the edge runtime's IPC bus", "awsiotsdk", "edge")
            ) from exc

        socket_path = self.endpoint.socket_path
        if not os.path.exists(socket_path):
            raise EdgeRuntimeError(
                f"the edge runtime is not there: no IPC socket at {socket_path} ({SOCKET_ENV})"
            )
        handler = _Lifecycle(self)
        try:
            v1 = greengrasscoreipc.connect(
                ipc_socket=socket_path,
                authtoken=self.endpoint.token,
                lifecycle_handler=handler,
                timeout=timeout,
            )
        except Exception as exc:
            raise EdgeRuntimeError(
                f"could not connect to the edge runtime at {socket_path}: "
                f"{type(exc).__name__}: {exc} (a token ({TOKEN_ENV}) from an earlier run of "
                "the runtime is refused)"
            ) from exc
        with self._lock:
            self._client = GreengrassCoreIPCClientV2(client=v1, executor=None)
            self._connected = True

    @property
    def client(self) -> Any:
        """The SDK's V2 client; EdgeRuntimeError when not connected."""
        with self._lock:
            if self._client is None or not self._connected:
                raise EdgeRuntimeError("the IPC connection to the edge runtime is not up")
            return self._client

    def is_connected(self) -> bool:
        with self._lock:
            return self._connected

    def _lost(self, reason: str) -> None:
        with self._lock:
            if not self._connected:
                return
            self._connected = False
        _log.warning("edge runtime: the IPC connection was lost: %s", reason)
        if self._on_lost is not None:
            self._on_lost(reason)

    def close(self) -> None:
        """Closes the connection (no loss is reported for it)."""
        with self._lock:
            client, self._client, self._connected = self._client, None, False
        if client is not None:
            try:
                client.close(executor_wait=False)
            except Exception as exc:
                _log.debug("edge runtime: closing the IPC connection: %s", exc)


class _Lifecycle:
    """The SDK's connection lifecycle handler: a drop not asked for is a loss."""

    def __init__(self, connection: IpcConnection) -> None:
        self._connection = connection

    def on_connect(self) -> None:
        return None

    def on_disconnect(self, reason: Exception | None) -> None:
        if reason is not None:
            self._connection._lost(f"{type(reason).__name__}: {reason}")

    def on_error(self, error: Exception) -> bool:
        _log.warning("edge runtime: IPC connection error: %s", error)
        return True

    def on_ping(self, headers: Any, payload: bytes) -> None:
        return None
