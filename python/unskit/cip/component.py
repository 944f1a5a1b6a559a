"""`unskit run ethernet-ip-adapter`: PLC tags polled over EtherNet/IP, or assemblies consumed
over class-1 implicit I/O (push mode), or the `sim` backend, published into the UNS through
the shared southbound runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from unskit.cip.config import TOKEN, component_schema, parse_component
from unskit.cip.push import CipPushDriver, IoHubs
from unskit.config.model import ComponentConfig
from unskit.southbound.component import Candidate, SouthboundComponent
from unskit.southbound.driver import DeviceDriver, InstanceSpec
from unskit.southbound.service import DriverFactory
from unskit.southbound.sim import SimDriver

__all__ = ["EthernetIpAdapter"]


def _poll_driver(spec: InstanceSpec) -> DeviceDriver:
    # Imported on first use: a sim-only adapter never loads pycomm3.
    from unskit.cip.poll import PollDriver

    return PollDriver(spec)


def _is_push(spec: InstanceSpec) -> bool:
    return bool(spec.entry.get("mode") == "push")


class EthernetIpAdapter(SouthboundComponent):
    """Polls PLC tags per poll group and publishes SouthboundSignalUpdate envelopes."""

    token: ClassVar[str] = TOKEN
    schema: ClassVar[Mapping[str, Any] | None] = component_schema()

    def __init__(self) -> None:
        super().__init__()
        #: The class-1 UDP sockets, shared by this component's push instances.
        self._io_hubs = IoHubs()

    def drivers(self) -> Mapping[str, DriverFactory]:
        """`ethernet-ip` (poll mode over pycomm3, push mode over class-1 I/O) and `sim`
        (waveforms, no PLC)."""
        return {"ethernet-ip": self._ethernet_ip, "sim": SimDriver}

    def _ethernet_ip(self, spec: InstanceSpec) -> DeviceDriver:
        if _is_push(spec):
            metrics = None if self._runtime is None else self._runtime.metrics
            return CipPushDriver(spec, self._io_hubs, metrics)
        return _poll_driver(spec)

    def parse(self, config: ComponentConfig) -> Candidate:
        """Valid instances with precedence resolved; malformed ones skipped with their path."""
        return parse_component(config)

    def drain(self) -> None:
        """Stops every instance, then closes the class-1 sockets they shared."""
        super().drain()
        self._io_hubs.close()
