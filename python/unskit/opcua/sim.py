"""A real OPC UA server (asyncua) for the tests, the example and `make demo`: `unskit opcua-sim`.

Namespace ``urn:unskit:sim`` holds the folder ``Line1`` with one variable of every built-in
scalar type (string ids named after the type), arrays, ``Counter`` and ``Temperature``
(updated every 100 ms; Temperature is an analog item with an EURange), the writable
``Setpoint`` and ``Level`` (Level has an EURange for Percent deadbands), and one variable
each with a numeric, a GUID and a ByteString node id. The methods ``RemoveNode(name)`` and
``RestoreNode(name)`` on Line1 delete and re-add a variable while the server runs; each
fires a GeneralModelChangeEvent from the Server object.

Two asyncua server gaps are filled here, since tests rely on them: a Percent deadband is
evaluated against the node's EURange (asyncua passes every value), and a Percent filter on
a node without EURange is refused with BadDeadbandFilterInvalid (OPC UA Part 4, 7.22.2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import math
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncua import Server, ua
from asyncua.common.node import Node
from asyncua.crypto.permission_rules import SimpleRoleRuleset, User, UserRole
from asyncua.server.monitored_item_service import MonitoredItemService, MonitoredItemValues

__all__ = ["DEFAULT_PATH", "DEFAULT_PORT", "SCALARS", "SIM_NAMESPACE", "main"]

SIM_NAMESPACE = "urn:unskit:sim"
DEFAULT_PORT = 4840
DEFAULT_PATH = "/unskit/"
DEFAULT_APPLICATION_URI = "urn:unskit:sim:server"

_log = logging.getLogger(__name__)

#: One Line1 variable per built-in scalar type: (name, variant type, value). The names are
#: also the string node ids.
SCALARS: tuple[tuple[str, ua.VariantType, Any], ...] = (
    ("Boolean", ua.VariantType.Boolean, True),
    ("SByte", ua.VariantType.SByte, -5),
    ("Byte", ua.VariantType.Byte, 200),
    ("Int16", ua.VariantType.Int16, -30000),
    ("UInt16", ua.VariantType.UInt16, 60000),
    ("Int32", ua.VariantType.Int32, -2000000000),
    ("UInt32", ua.VariantType.UInt32, 4000000000),
    ("Int64", ua.VariantType.Int64, -9000000000000000000),
    ("UInt64", ua.VariantType.UInt64, 18000000000000000000),
    ("Float", ua.VariantType.Float, 1.5),
    ("Double", ua.VariantType.Double, 3.25),
    ("String", ua.VariantType.String, "héllo"),
    (
        "DateTime",
        ua.VariantType.DateTime,
        datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc),
    ),
    ("Guid", ua.VariantType.Guid, uuid.UUID("72962b91-fa75-4ae6-8d28-b404dc7daf63")),
    ("ByteString", ua.VariantType.ByteString, b"\x00\x01\xfe\xff"),
    ("XmlElement", ua.VariantType.XmlElement, ua.XmlElement("<a>1</a>")),
    ("NodeId", ua.VariantType.NodeId, ua.NodeId(2258, 0)),
    ("QualifiedName", ua.VariantType.QualifiedName, ua.QualifiedName("Name", 1)),
    ("LocalizedText", ua.VariantType.LocalizedText, ua.LocalizedText("Hallo", "de")),
    ("StatusCode", ua.VariantType.StatusCode, ua.StatusCode(ua.StatusCodes.BadOutOfRange)),
    ("Range", ua.VariantType.ExtensionObject, ua.Range(Low=-1.5, High=99.5)),
)

ARRAYS: tuple[tuple[str, ua.VariantType, list[Any]], ...] = (
    ("Int32Array", ua.VariantType.Int32, [1, -2, 3]),
    ("DoubleArray", ua.VariantType.Double, [0.5, 1.5]),
    ("StringArray", ua.VariantType.String, ["a", "b"]),
)

#: A structure no client knows the encoding of: it stays an ExtensionObject on the wire.
OPAQUE_TYPE_ID = 5001
OPAQUE_BODY = b"\x01\x02\x03"


@dataclass
class _Removed:
    nodeid: ua.NodeId
    name: str
    value: ua.Variant
    writable: bool


class _Users:
    """UserName tokens from --users; anonymous only when allowed."""

    def __init__(self, users: dict[str, str], anonymous: bool) -> None:
        self.users = users
        self.anonymous = anonymous

    def get_user(
        self,
        iserver: Any,
        username: str | None = None,
        password: str | None = None,
        certificate: Any = None,
    ) -> User | None:
        if username is None:
            return User(role=UserRole.User) if self.anonymous else None
        if username in self.users and self.users[username] == password:
            return User(role=UserRole.User, name=username)
        return None  # the server answers BadUserAccessDenied


# -- Percent deadband (asyncua passes every value; see the module docstring) ------------------

_make_item = MonitoredItemService._create_data_change_monitored_item
_deadband = MonitoredItemService._is_deadband_exceeded


def _eu_span(service: MonitoredItemService, nodeid: ua.NodeId) -> float | None:
    node = service.aspace.get(nodeid)
    if node is None:
        return None
    for ref in node.references:
        if ref.IsForward and ref.BrowseName.Name == "EURange":
            value = service.aspace.read_attribute_value(ref.NodeId, ua.AttributeIds.Value)
            found = value.Value.Value if value.Value is not None else None
            if isinstance(found, ua.Range):
                return float(found.High - found.Low)
    return None


async def _create_item(
    self: MonitoredItemService, params: ua.MonitoredItemCreateRequest
) -> ua.MonitoredItemCreateResult:
    flt = params.RequestedParameters.Filter
    # Duck-typed: the decoded filter's class is not always the one ua exports.
    if getattr(flt, "DeadbandType", None) == ua.DeadbandType.Percent:
        span = _eu_span(self, params.ItemToMonitor.NodeId)
        if span is None:
            return ua.MonitoredItemCreateResult(
                StatusCode=ua.StatusCode(ua.StatusCodes.BadDeadbandFilterInvalid)
            )
        result = await _make_item(self, params)
        for mdata in self._monitored_items.values():
            if mdata.monitored_item_id == result.MonitoredItemId:
                mdata.mvalue.percent_span = span  # type: ignore[attr-defined]
        return result
    return await _make_item(self, params)


def _deadband_exceeded(
    self: MonitoredItemService, values: MonitoredItemValues, flt: ua.DataChangeFilter
) -> bool:
    span = getattr(values, "percent_span", None)
    if flt.DeadbandType != ua.DeadbandType.Percent or span is None:
        return bool(_deadband(self, values, flt))
    cur, old = values.get_current_datavalue(), values.get_old_datavalue()
    if old is None or cur is None or cur.Value is None or old.Value is None:
        return True
    return bool(abs(cur.Value.Value - old.Value.Value) > flt.DeadbandValue / 100 * span)


def _fill_asyncua_gaps() -> None:
    MonitoredItemService._create_data_change_monitored_item = _create_item  # type: ignore[method-assign]
    MonitoredItemService._is_deadband_exceeded = _deadband_exceeded  # type: ignore[method-assign]


# -- the server --------------------------------------------------------------------------------


class Simulator:
    """The sim's address space and its update loop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = Server(user_manager=_Users(_users(args.users), args.anonymous))
        self.idx = 0
        self.line1: Node | None = None
        self.nodes: dict[str, Node] = {}
        self.removed: dict[str, _Removed] = {}
        self.bench: list[ua.NodeId] = []
        self.model_change: Any = None

    async def setup(self) -> None:
        args = self.args
        server = self.server
        await server.init()
        server.set_endpoint(f"opc.tcp://{args.host}:{args.port}{DEFAULT_PATH}")
        server.set_server_name("unskit OPC UA simulator")
        await server.set_application_uri(args.application_uri)
        policies = [ua.SecurityPolicyType.NoSecurity]
        if args.certificate:
            # By content, not file name: asyncua takes anything not named .pem for DER.
            for path, load in (
                (args.certificate, server.load_certificate),
                (args.private_key, server.load_private_key),
            ):
                data = Path(path).read_bytes()
                await load(data, format="pem" if b"-----BEGIN" in data else "der")
            policies += [
                ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
                ua.SecurityPolicyType.Basic256Sha256_Sign,
                ua.SecurityPolicyType.Aes128Sha256RsaOaep_SignAndEncrypt,
                ua.SecurityPolicyType.Aes256Sha256RsaPss_SignAndEncrypt,
            ]
        server.set_security_policy(policies, permission_ruleset=SimpleRoleRuleset())
        tokens: list[type] = []
        if args.anonymous:
            tokens.append(ua.AnonymousIdentityToken)
        if args.users:
            tokens.append(ua.UserNameIdentityToken)
        server.set_identity_tokens(tokens)
        for uri in args.namespaces.split(","):
            index = await server.register_namespace(uri.strip())
            if uri.strip() == SIM_NAMESPACE:
                self.idx = index
        if not self.idx:
            self.idx = await server.register_namespace(SIM_NAMESPACE)
        await self._build()
        self.model_change = await server.get_event_generator(
            ua.ObjectIds.GeneralModelChangeEventType, server.nodes.server
        )

    async def _build(self) -> None:
        idx = self.idx
        objects = self.server.nodes.objects
        line1 = await objects.add_folder(ua.NodeId("Line1", idx), ua.QualifiedName("Line1", idx))
        self.line1 = line1
        for name, vtype, value in SCALARS:
            await self._variable(name, ua.Variant(value, vtype))
        for name, vtype, values in ARRAYS:
            await self._variable(name, ua.Variant(values, vtype))
        opaque = ua.ExtensionObject(TypeId=ua.NodeId(OPAQUE_TYPE_ID, idx), Body=OPAQUE_BODY)
        await self._variable(
            "Opaque",
            ua.Variant(opaque, ua.VariantType.ExtensionObject),
            datatype=ua.NodeId(ua.ObjectIds.Structure),
        )
        await self._variable("Counter", ua.Variant(0, ua.VariantType.Int32))
        temperature = await self._variable("Temperature", ua.Variant(20.0, ua.VariantType.Double))
        await temperature.add_property(idx, "EURange", ua.Range(Low=-50.0, High=150.0))
        await self._variable("Setpoint", ua.Variant(10.0, ua.VariantType.Double), writable=True)
        level = await self._variable(
            "Level", ua.Variant(50.0, ua.VariantType.Double), writable=True
        )
        await level.add_property(idx, "EURange", ua.Range(Low=0.0, High=200.0))
        await self._variable("Mode", ua.Variant(1, ua.VariantType.Int16), writable=True)
        # The other three node id types.
        for nodeid, name, variant in (
            (ua.NodeId(1001, idx), "NumericId", ua.Variant(1001, ua.VariantType.Int32)),
            (
                ua.NodeId(uuid.UUID("0d4f1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"), idx),
                "GuidId",
                ua.Variant(2.5, ua.VariantType.Double),
            ),
            (
                ua.NodeId(b"\x10\x20opaque", idx, ua.NodeIdType.ByteString),
                "OpaqueId",
                ua.Variant("bytes", ua.VariantType.String),
            ),
        ):
            self.nodes[name] = await line1.add_variable(
                nodeid, ua.QualifiedName(name, idx), variant
            )
        await line1.add_method(
            ua.NodeId("RemoveNode", idx),
            ua.QualifiedName("RemoveNode", idx),
            self._remove,
            [ua.VariantType.String],
            [],
        )
        await line1.add_method(
            ua.NodeId("RestoreNode", idx),
            ua.QualifiedName("RestoreNode", idx),
            self._restore,
            [ua.VariantType.String],
            [],
        )
        if self.args.variables:
            bench = await objects.add_folder(
                ua.NodeId("Bench", idx), ua.QualifiedName("Bench", idx)
            )
            for number in range(self.args.variables):
                name = f"Var{number:04d}"
                node = await bench.add_variable(
                    ua.NodeId(name, idx), ua.QualifiedName(name, idx), 0.0, ua.VariantType.Double
                )
                self.bench.append(node.nodeid)

    async def _variable(
        self,
        name: str,
        value: ua.Variant,
        writable: bool = False,
        datatype: ua.NodeId | None = None,
    ) -> Node:
        assert self.line1 is not None
        node = await self.line1.add_variable(
            ua.NodeId(name, self.idx), ua.QualifiedName(name, self.idx), value, datatype=datatype
        )
        if writable:
            await node.set_writable()
        if value.is_array:
            await node.write_value_rank(1)
            await node.write_array_dimensions([0])
        self.nodes[name] = node
        return node

    async def _remove(self, parent: ua.NodeId, name: ua.Variant | str) -> list[ua.Variant]:
        name = name.Value if isinstance(name, ua.Variant) else name
        node = self.nodes.pop(name, None)
        if node is None:
            raise ua.UaStatusCodeError(ua.StatusCodes.BadNodeIdUnknown)
        value = await node.read_data_value()
        access = (await node.read_attribute(ua.AttributeIds.AccessLevel)).Value
        writable = access is not None and bool(access.Value & ua.AccessLevel.CurrentWrite.mask)
        assert value.Value is not None
        self.removed[name] = _Removed(node.nodeid, name, value.Value, writable)
        await self.server.delete_nodes([node])
        await self._changed(node.nodeid, ua.ModelChangeStructureVerbMask.NodeDeleted)
        return []

    async def _restore(self, parent: ua.NodeId, name: ua.Variant | str) -> list[ua.Variant]:
        name = name.Value if isinstance(name, ua.Variant) else name
        gone = self.removed.pop(name, None)
        if gone is None:
            raise ua.UaStatusCodeError(ua.StatusCodes.BadNodeIdUnknown)
        assert self.line1 is not None
        node = await self.line1.add_variable(
            gone.nodeid, ua.QualifiedName(name, self.idx), gone.value
        )
        if gone.writable:
            await node.set_writable()
        self.nodes[name] = node
        await self._changed(gone.nodeid, ua.ModelChangeStructureVerbMask.NodeAdded)
        return []

    async def _changed(self, nodeid: ua.NodeId, verb: ua.ModelChangeStructureVerbMask) -> None:
        self.model_change.event.Changes = [
            ua.ModelChangeStructureDataType(
                Affected=nodeid,
                AffectedType=ua.NodeId(ua.ObjectIds.BaseDataVariableType),
                Verb=verb,
            )
        ]
        await self.model_change.trigger()

    async def update(self, stop: asyncio.Event) -> None:
        """Counter and Temperature every 100 ms; the bench variables every --interval-ms."""
        counter = 0
        period = 0.1
        bench_period = self.args.interval_ms / 1000
        next_bench = time.monotonic()
        while not stop.is_set():
            now = datetime.datetime.now(datetime.timezone.utc)
            counter += 1
            await self._write("Counter", ua.Variant(counter, ua.VariantType.Int32), now)
            temperature = 20.0 + 5.0 * math.sin(counter / 10)
            await self._write("Temperature", ua.Variant(temperature, ua.VariantType.Double), now)
            if self.bench and time.monotonic() >= next_bench:
                next_bench += bench_period
                for number, nodeid in enumerate(self.bench):
                    value = ua.DataValue(
                        ua.Variant(float(counter * 1000 + number), ua.VariantType.Double),
                        SourceTimestamp=now,
                        ServerTimestamp=now,
                    )
                    await self.server.write_attribute_value(nodeid, value)
            wait = (
                period if not self.bench else min(period, max(0.0, next_bench - time.monotonic()))
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def _write(self, name: str, variant: ua.Variant, now: datetime.datetime) -> None:
        node = self.nodes.get(name)
        if node is not None:  # removed by RemoveNode
            value = ua.DataValue(variant, SourceTimestamp=now, ServerTimestamp=now)
            await self.server.write_attribute_value(node.nodeid, value)


def _users(spec: str) -> dict[str, str]:
    users = {}
    for pair in filter(None, (part.strip() for part in spec.split(","))):
        name, colon, password = pair.partition(":")
        if not colon or not name:
            raise SystemExit(f"opcua-sim: --users wants user:password pairs, got {pair!r}")
        users[name] = password
    return users


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unskit opcua-sim",
        description="Runs an OPC UA test server (asyncua) on "
        f"opc.tcp://HOST:PORT{DEFAULT_PATH}; prints READY once serving.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--namespaces",
        default=SIM_NAMESPACE,
        help=f"namespace URIs registered in this order (default {SIM_NAMESPACE}; it is "
        "added last when not listed)",
    )
    parser.add_argument(
        "--variables", type=int, default=0, metavar="N", help="N extra Double variables (Bench)"
    )
    parser.add_argument(
        "--interval-ms", type=float, default=100.0, metavar="M", help="update period of them"
    )
    parser.add_argument("--certificate", help="server certificate (DER or PEM)")
    parser.add_argument("--private-key", help="its private key (PEM)")
    parser.add_argument("--application-uri", default=DEFAULT_APPLICATION_URI)
    parser.add_argument("--users", default="", help="user:password,... (UserName tokens)")
    parser.add_argument("--anonymous", action=argparse.BooleanOptionalAction, default=True)
    return parser


async def _serve(args: argparse.Namespace) -> None:
    _fill_asyncua_gaps()
    sim = Simulator(args)
    await sim.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    async with sim.server:
        print(f"READY opc.tcp://{args.host}:{args.port}{DEFAULT_PATH}", flush=True)
        await sim.update(stop)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the simulator until SIGTERM or Ctrl-C; returns the exit code."""
    args = _parser().parse_args(argv)
    if bool(args.certificate) != bool(args.private_key):
        print("opcua-sim: --certificate and --private-key go together", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
