"""`unskit run ethernet-ip-adapter`: PLC tags polled over EtherNet/IP, or assemblies consumed
over class-1 implicit I/O (push mode), or the `sim` backend, published into the UNS through
the shared southbound runtime."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from unskit.cip.config import TOKEN, component_schema, parse_component
from unskit.cip.push import CipPushDriver, IoHubs
from unskit.config.model import ComponentConfig
from unskit.config.vault import VaultSecrets
from unskit.errors import UnskitError
from unskit.runtime.events import Events
from unskit.southbound.component import Candidate, SouthboundComponent
from unskit.southbound.driver import DeviceDriver, InstanceSpec
from unskit.southbound.service import DriverFactory
from unskit.southbound.sim import SimDriver

__all__ = ["EthernetIpAdapter"]

_log = logging.getLogger(__name__)


def _poll_driver(
    spec: InstanceSpec, secrets: VaultSecrets | None, events_of: Callable[[], Events | None]
) -> DeviceDriver:
    # Imported on first use: a sim-only adapter never loads pycomm3.
    from unskit.cip.poll import PollDriver

    def emit(severity: str, event_type: str, context: Mapping[str, Any]) -> None:
        events = events_of()  # looked up per event: the runtime may start after the driver
        if events is None:
            _log.info("instance %s: %s %s %s", spec.id, severity, event_type, dict(context))
            return
        try:
            events.emit(severity, event_type, context, instance=spec.id)
        except UnskitError as error:
            _log.warning("%s of %s not published: %s", event_type, spec.id, error)

    return PollDriver(spec, secrets=secrets, events=emit)


def _is_push(spec: InstanceSpec) -> bool:
    return bool(spec.entry.get("mode") == "push")


class EthernetIpAdapter(SouthboundComponent):
    """Polls PLC tags per poll group and publishes SouthboundSignalUpdate envelopes."""

    token: ClassVar[str] = TOKEN
    schema: ClassVar[Mapping[str, Any] | None] = component_schema()
    _secrets: VaultSecrets | None = None

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
        return _poll_driver(spec, self._secrets, self._events)

    def _events(self) -> Events | None:
        return None if self._runtime is None else self._runtime.events

    def parse(self, config: ComponentConfig) -> Candidate:
        """Valid instances with precedence resolved; malformed ones skipped with their path."""
        # The drivers of this candidate resolve with its vault (parse runs right before the
        # candidate is applied); nothing is opened until a tls connect reads it.
        self._secrets = config.secrets() if config.credentials is not None else None
        return parse_component(config)

    def drain(self) -> None:
        """Stops every instance, then closes the class-1 sockets they shared."""
        super().drain()
        self._io_hubs.close()
