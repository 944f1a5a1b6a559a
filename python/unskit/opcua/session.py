"""The OPC UA driver's session layer: the asyncua event-loop thread, the secure session
(connect, loss, close, probe) and the read and browse primitives the layers above share."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from asyncua import Client, ua
from asyncua.client.ua_client import UaClientState
from asyncua.crypto import security_policies

from unskit.config.secrets import SecretResolver
from unskit.opcua.config import OpcUaSettings, SubscriptionSpec
from unskit.opcua.matchers import MonitoredNode
from unskit.opcua.security import SessionSecurity, UserCredentials
from unskit.opcua.variants import (
    status_name,
    to_json,
    type_name,
)
from unskit.pki.identity import ClientIdentity
from unskit.runtime.metrics import Counter, MetricsRegistry
from unskit.southbound.driver import (
    DeviceError,
    InstanceSpec,
    Quality,
    Reading,
    ReadingSink,
)

# One logger for the whole driver, named as it was when the driver was one module.
_log = logging.getLogger("unskit.opcua.adapter")
_T = TypeVar("_T")


class _LostTeardown(logging.Filter):
    """Drops asyncua's warnings about closing a session whose socket is already gone: the
    driver reported the loss itself, and closes what is left on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "was called but connection is closed" not in record.getMessage()


for _name in ("asyncua.client.ua_session.UaSession", "asyncua.client.ua_client.UaClient"):
    logging.getLogger(_name).addFilter(_LostTeardown())

_ITEM_BATCH = 1000
_SESSION_TIMEOUT_MS = 600_000
#: Service results that mean the session (or its channel) is gone: reconnect.
_SESSION_GONE = frozenset(
    {
        "BadSessionIdInvalid",
        "BadSessionClosed",
        "BadSessionNotActivated",
        "BadSecureChannelClosed",
        "BadSecureChannelIdInvalid",
        "BadConnectionClosed",
        "BadServerHalted",
        "BadShutdown",
        "BadSubscriptionIdInvalid",
    }
)
_POLICIES: dict[str, type[security_policies.SecurityPolicy]] = {
    "Basic256Sha256": security_policies.SecurityPolicyBasic256Sha256,
    "Aes128_Sha256_RsaOaep": security_policies.SecurityPolicyAes128Sha256RsaOaep,
    "Aes256_Sha256_RsaPss": security_policies.SecurityPolicyAes256Sha256RsaPss,
}


@dataclass
class _Subscription:
    spec: SubscriptionSpec
    server_id: int
    publish_ms: float


def _ms(moment: Any) -> int:
    return int(moment.timestamp() * 1000) if moment is not None else 0


def _server_ms(value: ua.DataValue) -> int:
    """The ServerTimestamp, unless asyncua 2.1.0 garbled it: it decodes ServerTimestamp
    before SourcePicoseconds, while the wire has SourceTimestamp, SourcePicoseconds,
    ServerTimestamp (Part 6, 5.2.2.17), so with both present (node-opcua sends picoseconds)
    the server timestamp is read from the wrong bytes. Then 0: the adapter stamps it."""
    if value.SourcePicoseconds is not None and value.ServerTimestamp is not None:
        return 0
    return _ms(value.ServerTimestamp)


def _quality(code: ua.StatusCode | None) -> Quality:
    severity = (code.value if code is not None else 0) >> 30
    return Quality.GOOD if severity == 0 else Quality.UNCERTAIN if severity == 1 else Quality.BAD


async def _apply_security(
    client: Client,
    security: SessionSecurity,
    identity: ClientIdentity | None,
    user: UserCredentials | None,
) -> None:
    """Applies the user token and, under a secure policy, the channel security to a client
    before it connects: the endpoint's server certificate must pass the trust list (or the
    pin) first, and the identity's certificate and key objects go to asyncua as they are
    (its `set_security` loads keys from files only, and a token's key has none)."""
    if user is not None:
        client.set_user(user.username)
        client.set_password(user.password)
    if identity is None:
        return
    connection = security.connection
    policy_type = _POLICIES[connection.security_policy]
    mode = getattr(ua.MessageSecurityMode, connection.message_mode)
    endpoints = await client.connect_and_get_server_endpoints()
    try:
        endpoint = Client.find_endpoint(endpoints, mode, policy_type.URI)
    except ua.UaError:
        raise DeviceError(
            f"the server offers no {connection.security_policy} {connection.message_mode} endpoint",
            code="BadSecurityPolicyRejected",
        ) from None
    server_certificate = security.check_server(endpoint.ServerCertificate or b"")
    if identity.application_uri is not None:  # always, for an identity loaded for OPC UA
        client.application_uri = identity.application_uri
    policy = policy_type(
        server_certificate,
        identity.certificate,
        identity.private_key,
        mode,
        host_cert_chain=list(identity.chain),
    )
    # What Client.set_security does after loading files (asyncua types the attribute by
    # its initial SecurityPolicyNone).
    client.security_policy = policy  # type: ignore[assignment]
    client.uaclient.set_security(policy)


class _Session:
    """The session layer of `OpcUaDriver`: its state, loop and connection."""

    def __init__(
        self,
        spec: InstanceSpec,
        metrics: MetricsRegistry | None = None,
        secrets: SecretResolver | None = None,
    ) -> None:
        if not isinstance(spec.settings, OpcUaSettings):
            raise ValueError(f"instance {spec.id!r} has no OPC UA settings")
        self.spec = spec
        self.settings: OpcUaSettings = spec.settings
        self._security = SessionSecurity(
            spec.settings.connection,
            secrets,
            path=f"$.component.instances[id={spec.id}].connection",
        )
        self._metrics = metrics
        self._counters: dict[tuple[str, str], Counter] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._sink: ReadingSink | None = None
        self._namespaces: list[str] = []
        self._resolved: dict[str, int | None] = {}
        self._items: dict[str, MonitoredNode] = {}
        self._handles: dict[int, MonitoredNode] = {}
        self._subscriptions: dict[str, _Subscription] = {}
        self._next_handle = 1
        self._lost: DeviceError | None = None
        self._model_changed = False
        self._verify: set[int] = set()
        #: Monitored items of failed nodes, deleted on the server by maintain().
        self._stale_items: list[tuple[str, int]] = []

    # -- the loop thread --------------------------------------------------------------------

    def _start_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=self._run_loop, args=(loop,), name=f"opcua-{self.spec.id}", daemon=True
            )
            self._loop, self._thread = loop, thread
            thread.start()
        return self._loop

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()
        # Stopped by close(): let asyncua's tasks end before the loop closes (no warnings).
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def _call(self, coroutine: Coroutine[Any, Any, _T], timeout: float) -> _T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._start_loop())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise DeviceError(
                f"{self.settings.connection.endpoint}: no answer within {timeout:g} s",
                connection_lost=True,
            ) from None
        except (ua.UaError, OSError) as error:  # asyncua's errors end here, as DeviceErrors
            raise self._device_error(error, "the request failed") from error

    @property
    def _request_s(self) -> float:
        return self.spec.timing.request_timeout_ms / 1000

    def _count(self, family: str, name: str, amount: int = 1) -> None:
        if self._metrics is None or amount <= 0:
            return
        counter = self._counters.get((family, name))
        if counter is None:
            counter = self._metrics.counter(family, name, {"instance": self.spec.id})
            self._counters[(family, name)] = counter
        counter.inc(amount)

    # -- session ----------------------------------------------------------------------------

    def connect(self, deadline_s: float) -> None:
        try:
            # Here, not on the loop: a token login or a vault read blocks.
            identity = self._security.identity()
            user = self._security.user()
        except DeviceError as error:
            self._count("OpcUaConnection", "connectFailures")
            raise self._device_error(error, "loading the security material") from None
        self._call(self._connect(deadline_s, identity, user), deadline_s + 5)

    async def _connect(
        self, deadline_s: float, identity: ClientIdentity | None, user: UserCredentials | None
    ) -> None:
        connection = self.settings.connection
        await self._disconnect()
        client = Client(connection.endpoint, timeout=self._request_s)
        client.name = client.description = f"unskit opcua-adapter {self.spec.id}"
        client.application_uri = f"urn:unskit:opcua-adapter:{self.spec.id}"
        client.session_timeout = _SESSION_TIMEOUT_MS
        client.connection_lost_callback = self._on_connection_lost
        try:
            # One deadline for both: security may fetch the endpoints first.
            async def session() -> None:
                await _apply_security(client, self._security, identity, user)
                await client.connect()

            await asyncio.wait_for(session(), deadline_s)
            namespaces = await client.get_namespace_array()
        except BaseException as error:
            self._count("OpcUaConnection", "connectFailures")
            await self._quietly(client.disconnect())
            if isinstance(error, asyncio.CancelledError):
                raise
            token = connection.user
            doing = "cannot open a session"
            if token is not None:  # a vault username shows as its reference, never its value
                name = token.username
                doing += f" as user {name!r}" if isinstance(name, str) else f" as user {name}"
            raise self._device_error(error, doing) from error
        self._client = client
        # A dropped socket is seen at once (asyncua's watchdog only ticks every second), and
        # in time to stop the publish loop before it logs the failed request as a crash.
        client.uaclient._add_state_listener(lambda state: self._on_state(client, state))
        self._lost = None
        self._namespaces = list(namespaces)
        self._count("OpcUaConnection", "connects")

    def _device_error(self, error: BaseException, doing: str) -> DeviceError:
        endpoint = self.settings.connection.endpoint
        if isinstance(error, DeviceError):
            # The status name in the text too: sb/status shows lastError as text only.
            tail = f" [{error.code}]" if error.code and error.code not in str(error) else ""
            return DeviceError(f"{endpoint}: {error}{tail}", code=error.code)
        if isinstance(error, ua.UaStatusCodeError):
            name = status_name(error.code)
            return DeviceError(
                f"{endpoint}: {doing}: the server answered {name}",
                code=name,
                connection_lost=name in _SESSION_GONE,
            )
        if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
            return DeviceError(f"{endpoint}: {doing}: timed out", connection_lost=True)
        if isinstance(error, (OSError, ConnectionError)):
            return DeviceError(f"{endpoint}: {doing}: {error}", connection_lost=True)
        return DeviceError(f"{endpoint}: {doing}: {type(error).__name__}: {error}")

    def _on_state(self, client: Client, state: UaClientState) -> None:
        if state is UaClientState.DISCONNECTED and client is self._client:
            self._session_lost("the server closed the connection")

    async def _on_connection_lost(self, error: Exception) -> None:
        self._session_lost(f"session lost ({type(error).__name__}: {error})")

    def _session_lost(self, why: str) -> None:
        if self._lost is not None or self._client is None:
            return
        self._lost = DeviceError(
            f"{self.settings.connection.endpoint}: {why}", connection_lost=True
        )
        self._count("OpcUaConnection", "sessionLosses")
        # asyncua's publish loop would retry on the dead transport: stop it now.
        task = self._client.uaclient.session._publish_task
        if task is not None:
            task.cancel()
        if self._sink is not None:
            self._sink.lost(self._lost)

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        with self._lock:
            self._items.clear()
            self._handles.clear()
            self._subscriptions.clear()
        self._verify.clear()
        self._model_changed = False
        if client is not None:
            await self._quietly(asyncio.wait_for(client.disconnect(), self._request_s))

    @staticmethod
    async def _quietly(coroutine: Coroutine[Any, Any, Any]) -> None:
        try:
            await coroutine
        except Exception as error:  # closing: nothing left to report to
            _log.debug("ignored while closing: %r", error)

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            try:
                self._call(self._disconnect(), self._request_s + 2)
            except Exception as error:
                _log.debug("close: %r", error)
            self._sink = None
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            self._loop = self._thread = None
        # After the loop: asyncua signs with the identity's key on the loop thread.
        self._security.close()

    def probe(self) -> None:
        value = self._call(
            self._read_one(ua.NodeId(ua.ObjectIds.Server_ServerStatus_State)), self._request_s + 1
        )
        state = value.Value.Value if value.Value is not None else None
        if state != ua.ServerState.Running:
            name = ua.ServerState(state).name if isinstance(state, int) else str(state)
            raise DeviceError(f"the server is not running (state {name})", connection_lost=True)

    def _require(self) -> Client:
        if self._lost is not None:
            raise self._lost
        if self._client is None:
            raise DeviceError("not connected", connection_lost=True)
        return self._client

    async def _read_one(
        self, nodeid: ua.NodeId, attribute: int = ua.AttributeIds.Value
    ) -> ua.DataValue:
        return (await self._read([(nodeid, attribute)]))[0]

    async def _read(self, what: Sequence[tuple[ua.NodeId, int]]) -> list[ua.DataValue]:
        client = self._require()
        results: list[ua.DataValue] = []
        for start in range(0, len(what), _ITEM_BATCH):
            params = ua.ReadParameters()
            params.TimestampsToReturn = ua.TimestampsToReturn.Both
            params.NodesToRead = [
                ua.ReadValueId(NodeId=nodeid, AttributeId=attribute)
                for nodeid, attribute in what[start : start + _ITEM_BATCH]
            ]
            try:
                results += await client.uaclient.read(params)
            except (OSError, ConnectionError, asyncio.TimeoutError) as error:
                raise self._device_error(error, "read failed") from error
        return results

    async def _children(
        self, client: Client, nodes: Sequence[ua.NodeId], variables_too: bool
    ) -> list[ua.ReferenceDescription]:
        params = ua.BrowseParameters()
        params.NodesToBrowse = [
            ua.BrowseDescription(
                NodeId=nodeid,
                BrowseDirection=ua.BrowseDirection.Forward,
                ReferenceTypeId=ua.NodeId(ua.ObjectIds.HierarchicalReferences),
                IncludeSubtypes=True,
                NodeClassMask=0
                if not variables_too
                else (ua.NodeClass.Object | ua.NodeClass.Variable),
                ResultMask=ua.BrowseResultMask.All,
            )
            for nodeid in nodes
        ]
        refs: list[ua.ReferenceDescription] = []
        results = await client.uaclient.browse(params)
        while results:
            points = []
            for result in results:
                refs += result.References
                if result.ContinuationPoint:
                    points.append(result.ContinuationPoint)
            if not points:
                break
            results = await client.uaclient.browse_next(
                ua.BrowseNextParameters(ReleaseContinuationPoints=False, ContinuationPoints=points)
            )
        return [ref for ref in refs if ref.NodeId.NamespaceIndex is not None]

    async def _types(self, nodeids: Sequence[ua.NodeId]) -> list[str]:
        values = await self._read(
            [(n, a) for n in nodeids for a in (ua.AttributeIds.DataType, ua.AttributeIds.ValueRank)]
        )
        names = []
        for index in range(len(nodeids)):
            data_type, rank = values[2 * index].Value, values[2 * index + 1].Value
            names.append(
                type_name(
                    data_type.Value if data_type is not None else None,
                    rank.Value if rank is not None else None,
                )
            )
        return names

    @staticmethod
    def _reading(signal_id: str, value: ua.DataValue | None) -> Reading:
        if value is None:
            return Reading(signal_id, None, Quality.BAD, detail="BadNoData")
        status = value.StatusCode
        quality = _quality(status)
        return Reading(
            signal_id,
            to_json(value.Value.Value) if value.Value is not None else None,
            quality,
            source_timestamp_ms=_ms(value.SourceTimestamp),
            detail="" if quality is Quality.GOOD else status_name(status),
            server_timestamp_ms=_server_ms(value),
        )
