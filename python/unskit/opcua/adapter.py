"""The OPC UA driver: a `PushDriver` over asyncua (the only module that drives an asyncua
client; `variants` maps values, `matchers` decides which nodes a subscription takes).

asyncua runs on an event loop in a daemon thread the driver owns; every driver method
hands a coroutine to that loop and waits for it with a deadline. Notifications arrive on
the loop thread: one publish response becomes one `ReadingSink.deliver` batch.

Per-node recovery: a monitored item that cannot be created, or whose node disappears
(a BadNodeIdUnknown notification, a vanished node at a re-match, or asyncua's
subscription-wide StatusChange for a deleted node, after which the items are checked with
one Read), is reported as a BAD reading carrying the status name and retried from
`maintain()` after 5 s, doubling to 60 s. A model change event re-runs the matching.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from asyncua import Client, ua
from asyncua.client.ua_client import UaClientState
from asyncua.crypto import security_policies

from unskit.config.secrets import SecretResolver
from unskit.opcua.config import OpcUaSettings, SubscriptionSpec
from unskit.opcua.matchers import (
    BrowsedNode,
    Child,
    MonitoredNode,
    Selected,
    resolve_namespaces,
    select,
    walk,
)
from unskit.opcua.security import (
    ClientIdentity,
    SessionSecurity,
    UserCredentials,
    certificate_summary,
)
from unskit.opcua.variants import (
    from_json,
    identifier_text,
    node_id,
    stable_id,
    status_name,
    to_json,
    type_name,
)
from unskit.runtime.metrics import Counter, MetricsRegistry
from unskit.southbound.driver import (
    DeviceError,
    InstanceSpec,
    PollGroupSpec,
    PublishMode,
    Quality,
    Reading,
    ReadingSink,
    SignalSpec,
)

__all__ = ["OpcUaDriver"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class _LostTeardown(logging.Filter):
    """Drops asyncua's warnings about closing a session whose socket is already gone: the
    driver reported the loss itself, and closes what is left on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "was called but connection is closed" not in record.getMessage()


for _name in ("asyncua.client.ua_session.UaSession", "asyncua.client.ua_client.UaClient"):
    logging.getLogger(_name).addFilter(_LostTeardown())

_ITEM_BATCH = 1000
_SUBSCRIBE_TIMEOUT_S = 600.0
_SESSION_TIMEOUT_MS = 600_000
#: Statuses that mean "the node is not there (now)": the item is dropped and retried.
_GONE = frozenset({"BadNodeIdUnknown", "BadNodeIdInvalid"})
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
#: Subscription-wide statuses that end the subscription (or the session) itself.
_SUBSCRIPTION_ENDED = frozenset(
    {"BadTimeout", "BadShutdown", "BadSessionClosed", "BadNoSubscription"}
)
_HAS_PROPERTY = ua.NodeId(ua.ObjectIds.HasProperty)
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


class OpcUaDriver:
    """A `PushDriver` for one OPC UA server."""

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

    def describe(self) -> Mapping[str, Any]:
        facts = self._security.facts()
        server = self._security.server_certificate
        with self._lock:
            subscriptions = [
                {
                    "id": sub.spec.id,
                    "publishIntervalMs": sub.publish_ms,
                    "items": sum(1 for i in self._items.values() if i.subscription == sub.spec.id),
                    "failedItems": sum(
                        1
                        for i in self._items.values()
                        if i.subscription == sub.spec.id and i.monitored is None
                    ),
                }
                for sub in self._subscriptions.values()
            ]
        return {
            "adapter": "opcua",
            "endpoint": self.settings.connection.endpoint,
            "securityPolicy": facts["securityPolicy"],
            "messageMode": facts["messageMode"],
            "serverCertificate": certificate_summary(server) if server is not None else None,
            "subscriptions": subscriptions,
            "namespaces": {str(index): uri for index, uri in enumerate(self._namespaces)},
            "security": facts,
        }

    # -- subscriptions ----------------------------------------------------------------------

    def subscribe(self, sink: ReadingSink) -> None:
        self._sink = sink
        self._call(self._subscribe(), _SUBSCRIBE_TIMEOUT_S)

    async def _subscribe(self) -> None:
        client = self._require()
        self._resolved = resolve_namespaces(self.settings.subscriptions, self._namespaces)
        try:
            for spec in self.settings.subscriptions:
                params = ua.CreateSubscriptionParameters(
                    RequestedPublishingInterval=spec.publish_interval_ms,
                    RequestedLifetimeCount=10000,
                    RequestedMaxKeepAliveCount=client.get_keepalive_count(spec.publish_interval_ms),
                    MaxNotificationsPerPublish=0,
                    PublishingEnabled=True,
                )
                result = await client.uaclient.create_subscription(params, self._on_publish)
                with self._lock:
                    self._subscriptions[spec.id] = _Subscription(
                        spec, result.SubscriptionId, result.RevisedPublishingInterval
                    )
            await self._watch_model_changes(client)
            await self._match()
        except (OSError, ConnectionError, asyncio.TimeoutError, ua.UaError) as error:
            raise self._device_error(error, "subscribing failed") from error

    async def _watch_model_changes(self, client: Client) -> None:
        """An event item on the Server object for GeneralModelChangeEvents (best effort)."""
        params = ua.CreateSubscriptionParameters(
            RequestedPublishingInterval=1000,
            RequestedLifetimeCount=10000,
            RequestedMaxKeepAliveCount=client.get_keepalive_count(1000),
            PublishingEnabled=True,
        )
        result = await client.uaclient.create_subscription(params, self._on_publish)
        event_filter = ua.EventFilter()
        select_type = ua.SimpleAttributeOperand(
            TypeDefinitionId=ua.NodeId(ua.ObjectIds.BaseEventType),
            BrowsePath=[ua.QualifiedName("EventType", 0)],
            AttributeId=ua.AttributeIds.Value,
        )
        event_filter.SelectClauses = [select_type]
        item = ua.MonitoredItemCreateRequest(
            ItemToMonitor=ua.ReadValueId(
                NodeId=ua.NodeId(ua.ObjectIds.Server), AttributeId=ua.AttributeIds.EventNotifier
            ),
            MonitoringMode=ua.MonitoringMode.Reporting,
            RequestedParameters=ua.MonitoringParameters(
                ClientHandle=0, QueueSize=100, Filter=event_filter
            ),
        )
        created = await client.uaclient.create_monitored_items(
            ua.CreateMonitoredItemsParameters(
                SubscriptionId=result.SubscriptionId, ItemsToCreate=[item]
            )
        )
        if not created[0].StatusCode.is_good():
            _log.info(
                "%s: the server offers no model change events (%s); matching runs at connect only",
                self.spec.id,
                status_name(created[0].StatusCode),
            )

    async def _walk(self) -> dict[str, Child]:
        """Every Variable under Objects in a matcher's namespace, by stable id."""
        client = self._require()

        async def children(nodes: list[Any]) -> list[Child]:
            return [
                Child(
                    ref.NodeId,
                    BrowsedNode(
                        ref.NodeId.NamespaceIndex,
                        *identifier_text(ref.NodeId),
                        ref.BrowseName.Name or "",
                        ref.DisplayName.Text or "",
                    ),
                    variable=ref.NodeClass == ua.NodeClass.Variable,
                    property=ref.ReferenceTypeId == _HAS_PROPERTY,
                )
                for ref in await self._children(client, nodes, variables_too=True)
            ]

        wanted = {ns for ns in self._resolved.values() if ns is not None}
        objects = ua.NodeId(ua.ObjectIds.ObjectsFolder)
        found, visited = await walk(children, objects, wanted, label=self.spec.id)
        self._count("OpcUaBrowse", "browses")
        self._count("OpcUaBrowse", "nodesVisited", visited)
        return found

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

    async def _match(self) -> None:
        """Browses, matches, creates the new items, drops the vanished ones."""
        found = await self._walk()
        chosen: dict[str, tuple[Selected, str]] = {}
        nodes = [child.node for child in found.values()]
        for spec in self.settings.subscriptions:
            for selected in select(spec, nodes, self._resolved):
                chosen.setdefault(selected.node.stable_id, (selected, spec.id))
        new = [key for key in chosen if key not in self._items]
        types = await self._types([found[key].address for key in new])
        now = time.monotonic()
        changed = bool(new)
        with self._lock:
            for key, data_type in zip(new, types, strict=True):
                selected, subscription = chosen[key]
                self._next_handle += 1
                signal = SignalSpec(
                    id=key,
                    name=selected.node.identifier,
                    type=data_type,
                    publish_mode=PublishMode.ALWAYS,
                    batch_ms=self.settings.batch_ms,
                    extra={"browseName": selected.node.browse_name},
                )
                item = MonitoredNode(
                    signal, found[key].address, subscription, selected.matcher, self._next_handle
                )
                self._items[key] = item
                self._handles[item.handle] = item
            for key, item in self._items.items():
                if key not in found and item.monitored is not None:
                    self._mark_failed(item, "BadNodeIdUnknown", now)
                    changed = True
                elif key in found and item.monitored is None:
                    item.retry_at = now  # back: retry at once
        await self._create_due()
        if changed and self._sink is not None:
            self._sink.signals_changed()

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

    async def _eu_spans(self, items: Sequence[MonitoredNode]) -> dict[int, float | None]:
        """EURange High - Low of each Percent-deadband item's node, by handle (None: none)."""
        client = self._require()
        spans: dict[int, float | None] = {}
        for item in items:
            params = ua.BrowseParameters()
            params.NodesToBrowse = [
                ua.BrowseDescription(
                    NodeId=item.address,
                    BrowseDirection=ua.BrowseDirection.Forward,
                    ReferenceTypeId=_HAS_PROPERTY,
                    IncludeSubtypes=True,
                    ResultMask=ua.BrowseResultMask.All,
                )
            ]
            refs = (await client.uaclient.browse(params))[0].References
            range_node = next((r.NodeId for r in refs if r.BrowseName.Name == "EURange"), None)
            spans[item.handle] = None
            if range_node is not None:
                value = (await self._read_one(range_node)).Value
                if value is not None and isinstance(value.Value, ua.Range):
                    spans[item.handle] = float(value.Value.High - value.Value.Low)
        return spans

    async def _create_due(self) -> None:
        """Creates every item that is new or due for a retry."""
        client = self._require()
        now = time.monotonic()
        with self._lock:
            due = [i for i in self._items.values() if i.due(now)]
        retried = [i for i in due if i.status != "Pending"]
        self._count("OpcUaSubscription", "itemRetries", len(retried))
        percent = [i for i in due if i.matcher.deadband.type == "Percent"]
        spans = await self._eu_spans(percent) if percent else {}
        failed: list[tuple[MonitoredNode, str]] = []
        for subscription in list(self._subscriptions.values()):
            requests, items = [], []
            for item in due:
                if item.subscription != subscription.spec.id:
                    continue
                if item.handle in spans and spans[item.handle] is None:
                    failed.append((item, "BadDeadbandFilterInvalid"))
                    continue
                requests.append(self._request(item))
                items.append(item)
            for start in range(0, len(requests), _ITEM_BATCH):
                results = await client.uaclient.create_monitored_items(
                    ua.CreateMonitoredItemsParameters(
                        SubscriptionId=subscription.server_id,
                        TimestampsToReturn=ua.TimestampsToReturn.Both,
                        ItemsToCreate=requests[start : start + _ITEM_BATCH],
                    )
                )
                for item, result in zip(items[start : start + _ITEM_BATCH], results, strict=True):
                    if result.StatusCode.is_good():
                        item.created(result.MonitoredItemId)
                        self._count("OpcUaSubscription", "itemsCreated")
                    else:
                        failed.append((item, status_name(result.StatusCode)))
        now = time.monotonic()
        with self._lock:
            for item, status in failed:
                self._mark_failed(item, status, now)
        if failed and self._sink is not None:
            self._sink.signals_changed()

    def _request(self, item: MonitoredNode) -> ua.MonitoredItemCreateRequest:
        deadband = item.matcher.deadband
        flt = None
        if deadband.type in ("Absolute", "Percent"):
            flt = ua.DataChangeFilter(
                Trigger=ua.DataChangeTrigger.StatusValue,
                DeadbandType=getattr(ua.DeadbandType, deadband.type),
                DeadbandValue=deadband.value,
            )
        return ua.MonitoredItemCreateRequest(
            ItemToMonitor=ua.ReadValueId(NodeId=item.address, AttributeId=ua.AttributeIds.Value),
            MonitoringMode=ua.MonitoringMode.Reporting,
            RequestedParameters=ua.MonitoringParameters(
                ClientHandle=item.handle,
                SamplingInterval=item.matcher.sampling_rate_ms,
                Filter=flt,
                QueueSize=item.matcher.queue_size,
                DiscardOldest=True,
            ),
        )

    def _mark_failed(self, item: MonitoredNode, status: str, now: float) -> None:
        """The item is not monitored: a BAD reading now, a retry later (lock held)."""
        new, stale = item.failed(status, now)
        if stale is not None:
            self._stale_items.append((item.subscription, stale))
        if new:
            self._count("OpcUaSubscription", "itemsFailed")
        if self._sink is not None:
            self._sink.deliver([Reading(item.signal.id, None, Quality.BAD, detail=status)])

    def _on_publish(self, result: ua.PublishResult) -> None:
        """One publish response (on the loop thread): one delivered batch."""
        readings: list[Reading] = []
        now = time.monotonic()
        for notification in result.NotificationMessage.NotificationData or ():
            if isinstance(notification, ua.DataChangeNotification):
                for change in notification.MonitoredItems:
                    item = self._handles.get(change.ClientHandle)
                    if item is None or item.monitored is None:
                        continue
                    reading = self._reading(item.signal.id, change.Value)
                    if reading.detail in _GONE:
                        with self._lock:
                            self._mark_failed(item, reading.detail, now)
                        self._wake()
                        continue
                    readings.append(reading)
            elif isinstance(notification, ua.StatusChangeNotification):
                self._status_change(result.SubscriptionId, notification.Status)
            elif isinstance(notification, ua.EventNotificationList):
                self._model_changed = True
                self._wake()
        if readings:
            self._count("OpcUaSubscription", "notifications", len(readings))
            if self._sink is not None:
                self._sink.deliver(readings)

    def _status_change(self, subscription_id: int, status: ua.StatusCode) -> None:
        name = status_name(status)
        if name in _SUBSCRIPTION_ENDED:
            self._session_lost(f"subscription {subscription_id} ended: {name}")
        elif not status.is_good():
            # asyncua servers report a deleted monitored node this way, for the whole
            # subscription: maintain() reads its items to find which.
            self._verify.add(subscription_id)
            self._wake()

    def _wake(self) -> None:
        if self._sink is not None:
            self._sink.wake()

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

    def hold(self, paused: bool) -> None:
        """Pause keeps the session and its subscriptions (the runtime drops what arrives)."""

    def maintain(self) -> float | None:
        if self._lost is not None:
            raise self._lost
        return self._call(self._maintain(), _SUBSCRIBE_TIMEOUT_S)

    async def _maintain(self) -> float | None:
        client = self._require()
        try:
            if self._verify:
                await self._verify_items()
            if self._model_changed:
                self._model_changed = False
                await self._match()
            await self._drop_stale(client)
            await self._create_due()
        except (OSError, ConnectionError, asyncio.TimeoutError) as error:
            raise self._device_error(error, "maintenance failed") from error
        with self._lock:
            waiting = [i.retry_at for i in self._items.values() if i.monitored is None]
        return max(0.0, min(waiting) - time.monotonic()) if waiting else None

    async def _verify_items(self) -> None:
        ids, self._verify = self._verify, set()
        subscriptions = {s.spec.id for s in self._subscriptions.values() if s.server_id in ids}
        items = [
            i
            for i in self._items.values()
            if i.subscription in subscriptions and i.monitored is not None
        ]
        values = await self._read([(i.address, ua.AttributeIds.NodeClass) for i in items])
        now = time.monotonic()
        with self._lock:
            for item, value in zip(items, values, strict=True):
                name = status_name(value.StatusCode)
                if name in _GONE:
                    self._mark_failed(item, name, now)

    async def _drop_stale(self, client: Client) -> None:
        stale, self._stale_items = self._stale_items, []
        by_subscription: dict[str, list[int]] = {}
        for key, monitored in stale:
            by_subscription.setdefault(key, []).append(monitored)
        for key, monitored_ids in by_subscription.items():
            subscription = self._subscriptions.get(key)
            if subscription is not None:
                await self._quietly(
                    client.uaclient.delete_monitored_items(
                        ua.DeleteMonitoredItemsParameters(
                            SubscriptionId=subscription.server_id, MonitoredItemIds=monitored_ids
                        )
                    )
                )

    def signals(self) -> Sequence[SignalSpec]:
        with self._lock:
            return [item.signal for item in self._items.values()]

    def signal_for(self, signal_id: str) -> SignalSpec:
        nodeid = node_id(signal_id)
        canonical = stable_id(nodeid)
        with self._lock:
            item = self._items.get(canonical)
        if item is not None:
            return item.signal
        return SignalSpec(
            id=canonical,
            name=identifier_text(nodeid)[1],
            type="BaseDataType",
            publish_mode=PublishMode.ALWAYS,
            batch_ms=self.settings.batch_ms,
        )

    # -- verbs ------------------------------------------------------------------------------

    def read(self, group: PollGroupSpec) -> list[Reading]:
        self._count("OpcUaCommand", "reads")
        return self._call(self._read_group(group), self._request_s * 2 + 1)

    async def _read_group(self, group: PollGroupSpec) -> list[Reading]:
        readings: dict[int, Reading] = {}
        wanted: list[tuple[int, ua.NodeId]] = []
        for index, signal in enumerate(group.signals):
            try:
                wanted.append((index, node_id(signal.id)))
            except ValueError:
                readings[index] = Reading(signal.id, None, Quality.BAD, detail="BadNodeIdInvalid")
        values = await self._read([(n, ua.AttributeIds.Value) for _, n in wanted])
        for (index, _), value in zip(wanted, values, strict=True):
            readings[index] = self._reading(group.signals[index].id, value)
        return [readings[index] for index in range(len(group.signals))]

    def write(self, signal: SignalSpec, value: Any) -> None:
        try:
            self._call(self._write(signal, value), self._request_s * 2 + 1)
        except Exception:
            self._count("OpcUaCommand", "writeErrors")
            raise
        self._count("OpcUaCommand", "writes")

    async def _write(self, signal: SignalSpec, value: Any) -> None:
        client = self._require()
        nodeid = node_id(signal.id)
        data_type, rank, current = await self._read(
            [
                (nodeid, ua.AttributeIds.DataType),
                (nodeid, ua.AttributeIds.ValueRank),
                (nodeid, ua.AttributeIds.Value),
            ]
        )
        if data_type.StatusCode is not None and not data_type.StatusCode.is_good():
            name = status_name(data_type.StatusCode)
            raise DeviceError(f"{signal.id}: cannot write: {name}", code=name)
        kind = data_type.Value.Value if data_type.Value is not None else None
        variant = current.Value
        if (
            isinstance(kind, ua.NodeId)
            and kind.NamespaceIndex == 0
            and isinstance(kind.Identifier, int)
            and 1 <= kind.Identifier <= 21
        ):
            vtype = ua.VariantType(kind.Identifier)
        elif variant is not None and variant.VariantType != ua.VariantType.Null:
            vtype = variant.VariantType
        else:
            raise ValueError(f"{signal.id}: cannot tell which type to write ({type_name(kind)})")
        if vtype == ua.VariantType.ExtensionObject:
            raise ValueError(f"{signal.id}: writing structures is not supported")
        rank_value = rank.Value.Value if rank.Value is not None else -1
        array = rank_value >= 1 or (
            rank_value in (-2, 0) and variant is not None and bool(variant.is_array)
        )
        params = ua.WriteParameters()
        params.NodesToWrite = [
            ua.WriteValue(
                NodeId=nodeid,
                AttributeId=ua.AttributeIds.Value,
                Value=ua.DataValue(from_json(value, vtype, array)),
            )
        ]
        try:
            results = await client.uaclient.write(params)
        except (OSError, ConnectionError, asyncio.TimeoutError) as error:
            raise self._device_error(error, "write failed") from error
        if not results[0].is_good():
            name = status_name(results[0])
            raise DeviceError(f"{signal.id}: the server refused the write: {name}", code=name)

    def browse(
        self, node: str | None = None, max_nodes: int = 100, continuation: str | None = None
    ) -> dict[str, Any]:
        """One page of a node's children (default: the Objects folder) for sb/browse."""
        if not 1 <= max_nodes <= 1000:
            raise ValueError("maxNodes is 1 to 1000")
        start = node_id(node) if node else ua.NodeId(ua.ObjectIds.ObjectsFolder)
        offset = 0
        if continuation:
            if not continuation.isdigit():
                raise ValueError(f"continuation {continuation!r} is not one this adapter gave")
            offset = int(continuation)
        return self._call(self._browse(start, max_nodes, offset), self._request_s * 3 + 1)

    async def _browse(self, start: ua.NodeId, max_nodes: int, offset: int) -> dict[str, Any]:
        client = self._require()
        refs = await self._children(client, [start], variables_too=False)
        page = refs[offset : offset + max_nodes]
        variables = [r.NodeId for r in page if r.NodeClass == ua.NodeClass.Variable]
        types = dict(zip(variables, await self._types(variables), strict=True))
        self._count("OpcUaBrowse", "browses")
        self._count("OpcUaBrowse", "nodesVisited", len(page))
        nodes = []
        for ref in page:
            entry: dict[str, Any] = {
                "nodeId": stable_id(ref.NodeId),
                "browseName": f"{ref.BrowseName.NamespaceIndex}:{ref.BrowseName.Name}",
                "displayName": ref.DisplayName.Text,
                "nodeClass": ua.NodeClass(ref.NodeClass).name,
            }
            if ref.NodeId in types:
                entry["dataType"] = types[ref.NodeId]
            nodes.append(entry)
        more = offset + len(page) < len(refs)
        return {
            "nodeId": stable_id(start),
            "nodes": nodes,
            "continuation": str(offset + len(page)) if more else None,
        }
