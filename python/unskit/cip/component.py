"""`unskit run ethernet-ip-adapter`: PLC tags polled over EtherNet/IP (or the `sim` backend)
and published into the UNS through the shared southbound runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from unskit.cip.config import TOKEN, component_schema, parse_component
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


class EthernetIpAdapter(SouthboundComponent):
    """Polls PLC tags per poll group and publishes SouthboundSignalUpdate envelopes."""

    token: ClassVar[str] = TOKEN
    schema: ClassVar[Mapping[str, Any] | None] = component_schema()

    def drivers(self) -> Mapping[str, DriverFactory]:
        """`ethernet-ip` (poll mode over pycomm3) and `sim` (waveforms, no PLC)."""
        return {"ethernet-ip": _poll_driver, "sim": SimDriver}

    def parse(self, config: ComponentConfig) -> Candidate:
        """Valid instances with precedence resolved; malformed ones skipped with their path."""
        return parse_component(config)
