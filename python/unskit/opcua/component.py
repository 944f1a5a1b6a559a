"""`unskit run opcua-adapter`: OPC UA nodes found by matchers, subscribed through asyncua and
published into the UNS through the shared southbound runtime (as a push source)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from unskit.commands import (
    BodySpec,
    CommandContext,
    CommandInbox,
    ErrorCode,
    Page,
    Param,
    Scope,
    Text,
    Verb,
)
from unskit.config.model import ComponentConfig
from unskit.config.secrets import SecretResolver
from unskit.errors import CommandError
from unskit.opcua.config import TOKEN, component_schema, parse_component
from unskit.southbound.component import Candidate, SouthboundComponent
from unskit.southbound.driver import DeviceDriver, InstanceSpec
from unskit.southbound.service import DriverFactory

if TYPE_CHECKING:
    from unskit.opcua.adapter import OpcUaDriver

__all__ = ["OpcUaAdapter"]

#: sb/browse answers at most this many references of one node, asked for in pages of
#: BROWSE_PAGE; the inbox then serves them with its own limit and cursor.
BROWSE_LIMIT = 5_000
BROWSE_PAGE = 1_000


class OpcUaAdapter(SouthboundComponent):
    """Subscribes to matched OPC UA nodes and publishes SouthboundSignalUpdate envelopes."""

    token: ClassVar[str] = TOKEN
    schema: ClassVar[Mapping[str, Any] | None] = component_schema()
    _secrets: SecretResolver | None = None

    def drivers(self) -> Mapping[str, DriverFactory]:
        """`opcua`: asyncua, imported on first use."""
        metrics = None if self._runtime is None else self._runtime.metrics

        def opcua_driver(spec: InstanceSpec) -> DeviceDriver:
            return _opcua_driver_class()(spec, metrics=metrics, secrets=self._secrets)

        return {"opcua": opcua_driver}

    def parse(self, config: ComponentConfig) -> Candidate:
        """Valid instances with resolution applied; malformed ones skipped with their path."""
        # The drivers of this candidate resolve with its vault: parse runs right before the
        # candidate is applied, at start and at every reload (runtime.config is still the
        # old one then). The resolver opens nothing until a connect resolves a reference.
        self._secrets = config.secrets() if config.credentials is not None else None
        return parse_component(config)

    def register_verbs(self, inbox: CommandInbox) -> None:
        """sb/browse: what a user needs to write matchers."""
        inbox.register(
            Verb(
                "browse",
                self._browse,
                scope=Scope.INSTANCE,
                paged=True,
                body=BodySpec({"node": Param(Text(max_bytes=1024))}),
                summary="the references of one node (default: the Objects folder)",
            )
        )

    def _browse(self, context: CommandContext) -> Page:
        assert self.service is not None
        assert context.instance is not None
        runner = self.service.runner(context.instance)
        driver = runner.driver
        if not isinstance(driver, _opcua_driver_class()):
            raise CommandError(
                ErrorCode.UNSUPPORTED_CAPABILITY, f"{context.instance} cannot browse"
            )
        node = context.body.get("node")
        items: list[dict[str, Any]] = []
        continuation: str | None = None
        browsed: Mapping[str, Any] = {}
        while len(items) < BROWSE_LIMIT:
            page = functools.partial(driver.browse, node, BROWSE_PAGE, continuation)
            browsed = self.service.on_device(runner, page)
            items += browsed["nodes"]
            continuation = browsed["continuation"]
            if continuation is None:
                break
        return Page(
            items[:BROWSE_LIMIT],
            extra={
                "instance": context.instance,
                "nodeId": browsed.get("nodeId"),
                "truncated": continuation is not None or len(items) > BROWSE_LIMIT,
            },
        )


def _opcua_driver_class() -> type[OpcUaDriver]:
    from unskit.opcua.adapter import OpcUaDriver

    return OpcUaDriver
