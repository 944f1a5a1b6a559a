"""The OPC UA driver's subscriptions: nodes matched and monitored, data changes and
status changes turned into readings, and per-node recovery from `maintain()`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from asyncua import Client, ua

from unskit.opcua.matchers import (
    BrowsedNode,
    Child,
    MonitoredNode,
    Selected,
    resolve_namespaces,
    select,
    walk,
)
from unskit.opcua.session import _ITEM_BATCH, _Session, _Subscription
from unskit.opcua.variants import (
    identifier_text,
    node_id,
    stable_id,
    status_name,
)
from unskit.southbound.driver import (
    PublishMode,
    Quality,
    Reading,
    ReadingSink,
    SignalSpec,
)

# One logger for the whole driver, named as it was when the driver was one module.
_log = logging.getLogger("unskit.opcua.adapter")

_SUBSCRIBE_TIMEOUT_S = 600.0
#: Statuses that mean "the node is not there (now)": the item is dropped and retried.
_GONE = frozenset({"BadNodeIdUnknown", "BadNodeIdInvalid"})
#: Subscription-wide statuses that end the subscription (or the session) itself.
_SUBSCRIPTION_ENDED = frozenset(
    {"BadTimeout", "BadShutdown", "BadSessionClosed", "BadNoSubscription"}
)
_HAS_PROPERTY = ua.NodeId(ua.ObjectIds.HasProperty)


class _Subscriptions(_Session):
    """The subscription layer of `OpcUaDriver` (a `PushDriver`'s subscribe and maintain)."""

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
