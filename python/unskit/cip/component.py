"""`unskit run ethernet-ip-adapter`: PLC tags polled over EtherNet/IP, or assemblies consumed
over class-1 implicit I/O (push mode), or the `sim` backend, published into the UNS through
the shared southbound runtime."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from unskit.cip.config import TOKEN, component_schema, parse_component
from unskit.cip.enrollment import EnrolledIdentity, EnrollmentManager, est_enabled
from unskit.cip.push import CipPushDriver, IoHubs
from unskit.commands import ReloadOutcome
from unskit.config.model import ComponentConfig
from unskit.config.vault import VaultSecrets
from unskit.errors import UnskitError
from unskit.runtime.component import Runtime
from unskit.runtime.events import Events
from unskit.southbound.component import Candidate, SouthboundComponent
from unskit.southbound.driver import DeviceDriver, InstanceSpec
from unskit.southbound.service import DriverFactory
from unskit.southbound.sim import SimDriver

__all__ = ["CREDENTIAL_SWAP", "EthernetIpAdapter"]

_log = logging.getLogger(__name__)

#: The poll driver's method that takes enrolled credentials (the tls branch's
#: ``swap_client_credentials(cert_chain_pem, key_pem, ca_pem)``: thread-safe, checks the
#: material, reconnects on the instance thread). Without it the transport reads them from
#: `into` at its next connect or vault reload.
CREDENTIAL_SWAP = "swap_client_credentials"


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
        #: EST managers of poll instances with connection.security.est enabled, by id.
        self._enrollments: dict[str, EnrollmentManager] = {}

    def drivers(self) -> Mapping[str, DriverFactory]:
        """`ethernet-ip` (poll mode over pycomm3, push mode over class-1 I/O) and `sim`
        (waveforms, no PLC)."""
        return {"ethernet-ip": self._ethernet_ip, "sim": SimDriver}

    def _ethernet_ip(self, spec: InstanceSpec) -> DeviceDriver:
        if _is_push(spec):
            metrics = None if self._runtime is None else self._runtime.metrics
            return CipPushDriver(spec, self._io_hubs, metrics)
        driver = _poll_driver(spec, self._secrets, self._events)
        driver.enrollment = self._enrollment(spec, driver)  # type: ignore[attr-defined]
        return driver

    def _events(self) -> Events | None:
        return None if self._runtime is None else self._runtime.events

    def _enrollment(self, spec: InstanceSpec, driver: DeviceDriver) -> EnrollmentManager | None:
        """The instance's EST manager, not yet started: the service may still discard the
        driver (a candidate refused whole), so `_follow_enrollments` starts it."""
        security = spec.entry["connection"].get("security")
        if not est_enabled(security) or spec.unavailable is not None or self._runtime is None:
            return None
        return EnrollmentManager(
            spec.id,
            security,
            secrets=self._secrets,
            events=self._runtime.events,
            metrics=self._runtime.metrics,
            on_enrolled=_credential_swap(spec.id, driver),
        )

    def parse(self, config: ComponentConfig) -> Candidate:
        """Valid instances with precedence resolved; malformed ones skipped with their path."""
        # The drivers of this candidate resolve with its vault (parse runs right before the
        # candidate is applied); nothing is opened until a tls connect reads it.
        self._secrets = config.secrets() if config.credentials is not None else None
        return parse_component(config)

    def start(self, runtime: Runtime) -> None:
        """Starts the instances, then the EST managers of those that enroll."""
        self._io_hubs.supervisor = runtime.supervisor
        super().start(runtime)
        self._follow_enrollments()

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome:
        """Applies the change, then starts and stops EST managers to match the instances."""
        outcome = super().reconfigure(config)
        self._follow_enrollments()
        return outcome

    def _follow_enrollments(self) -> None:
        """One running manager per running poll instance that enrolls: the one its driver
        holds; managers of stopped or replaced drivers are stopped."""
        assert self.service is not None
        live: dict[str, EnrollmentManager] = {}
        for instance_id in self.service.instance_ids():
            manager = getattr(self.service.runner(instance_id).driver, "enrollment", None)
            if isinstance(manager, EnrollmentManager):
                live[instance_id] = manager
        for instance_id, manager in list(self._enrollments.items()):
            if live.get(instance_id) is not manager:
                del self._enrollments[instance_id]
                manager.stop()
        for instance_id, manager in live.items():
            if instance_id not in self._enrollments:
                self._enrollments[instance_id] = manager.start()

    def drain(self) -> None:
        """Stops every instance and EST manager, then closes the class-1 sockets they shared."""
        super().drain()
        for manager in self._enrollments.values():
            manager.stop()
        self._enrollments.clear()
        self._io_hubs.close()


def _credential_swap(instance: str, driver: DeviceDriver) -> Callable[[EnrolledIdentity], None]:
    swap = getattr(driver, CREDENTIAL_SWAP, None)

    def enrolled(identity: EnrolledIdentity) -> None:
        if swap is None:
            _log.info(
                "instance %s: enrolled credentials stored; the transport reads them at its "
                "next connect",
                instance,
            )
            return
        ca = None if identity.ca_pem is None else identity.ca_pem.encode()
        try:
            swap(identity.cert_pem.encode(), identity.key_pem.reveal().encode(), ca)
        except UnskitError as error:
            # Stored already: the transport's next connect reads them from `into`.
            _log.warning(
                "instance %s: enrolled credentials not swapped in (%s); the transport reads "
                "them from the into destination at its next connect",
                instance,
                error,
            )

    return enrolled
