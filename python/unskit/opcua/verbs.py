"""The OPC UA driver's verbs: reads of a poll group, typed writes, and paged browsing."""

from __future__ import annotations

import asyncio
from typing import Any

from asyncua import ua

from unskit.opcua.session import _Session
from unskit.opcua.variants import (
    from_json,
    node_id,
    stable_id,
    status_name,
    type_name,
)
from unskit.southbound.driver import (
    DeviceError,
    PollGroupSpec,
    Quality,
    Reading,
    SignalSpec,
)


class _Verbs(_Session):
    """The read, write and browse layer of `OpcUaDriver`."""

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
