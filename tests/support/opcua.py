"""The OPC UA simulator (`python -m unskit.opcua.sim`, a real asyncua server) as a test
peer, and RSA application certificates for its secure endpoints."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.pki import opcua_application_certificate, write_key_pem
from tests.support.servers import free_port, terminate, wait_until
from unskit.errors import DeviceError
from unskit.opcua.config import (
    ClientCertificate,
    DataChangeDeadband,
    OpcUaConnection,
    OpcUaSettings,
    ServerCertificatePin,
    SignalMatcher,
    SubscriptionSpec,
    TrustSettings,
    UserToken,
)
from unskit.southbound.driver import InstanceSpec, Quality, Reading, Timing

SIM = "urn:unskit:sim"


@dataclass(frozen=True)
class AppCertificate:
    """An OPC UA application instance certificate: DER and PEM copies, PEM key."""

    der: Path
    pem: Path
    key: Path
    uri: str


def make_app_certificate(folder: Path, name: str, uri: str) -> AppCertificate:
    """A self-signed RSA-2048 certificate with URI SAN `uri` and the key usages OPC UA wants."""
    folder.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = opcua_application_certificate(key, name, uri)
    paths = AppCertificate(
        folder / f"{name}.der", folder / f"{name}.pem", folder / f"{name}.key.pem", uri
    )
    paths.der.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    paths.pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_key_pem(key, paths.key)
    return paths


def file_identity(cert: AppCertificate) -> ClientCertificate:
    """A `clientCertificate` of source file for `cert`."""
    return ClientCertificate("file", cert_path=str(cert.der), key_path=str(cert.key))


def secure_connection(
    endpoint: str,
    pki: Path,
    identity: ClientCertificate,
    *,
    policy: str = "Basic256Sha256",
    mode: str = "SignAndEncrypt",
    user: UserToken | None = None,
    pin: ServerCertificatePin | None = None,
    application_uri: str | None = None,
) -> OpcUaConnection:
    """A secure connection with its trust list at `pki` (and an optional pin)."""
    return OpcUaConnection(
        endpoint=endpoint,
        security_policy=policy,
        message_mode=mode,
        application_uri=application_uri,
        user=user,
        client_certificate=identity,
        trust=TrustSettings(str(pki), pin),
    )


def trust(pki: Path, cert: AppCertificate) -> Path:
    """Puts `cert` into pki/trusted/ as an operator would; returns the file."""
    (pki / "trusted").mkdir(parents=True, exist_ok=True)
    target = pki / "trusted" / cert.der.name
    target.write_bytes(cert.der.read_bytes())
    return target


def sim_options(server: AppCertificate, *extra: str) -> tuple[str, ...]:
    """The sim's options for secure endpoints with `server`'s certificate."""
    return ("--certificate", str(server.der), "--private-key", str(server.key), *extra)


@dataclass
class OpcUaSim:
    """`python -m unskit.opcua.sim` on 127.0.0.1; `stop()` then `start()` reuses the port."""

    folder: Path
    options: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    #: How Python runs it: the module, or the `unskit opcua-sim` command.
    command: Sequence[str] = ("-m", "unskit.opcua.sim")

    @property
    def endpoint(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}/unskit/"

    @property
    def log(self) -> Path:
        return self.folder / "opcua-sim.log"

    def start(self, options: Sequence[str] | None = None) -> OpcUaSim:
        """Starts the server (with other options, for a restart) and waits for READY."""
        if options is not None:
            self.options = options
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log.write_bytes(b"")
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    *self.command,
                    "--port",
                    str(self.port),
                    *self.options,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self._ready, 60, f"the OPC UA sim on {self.endpoint}", interval=0.05)
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        text = self.log.read_text(errors="replace")
        if self.process.poll() is not None:
            raise RuntimeError(f"opcua-sim exited with {self.process.returncode}:\n{text[-3000:]}")
        return "READY" in text

    def stop(self) -> None:
        terminate(self.process)
        self.process = None


class CollectingSink:
    """A ReadingSink that keeps everything, with waits on conditions."""

    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self.lost_errors: list[DeviceError] = []
        self.changes = 0
        self.wakes = 0
        self._cond = threading.Condition()

    def deliver(self, readings: Sequence[Reading]) -> None:
        with self._cond:
            self.readings.extend(readings)
            self._cond.notify_all()

    def signals_changed(self) -> None:
        with self._cond:
            self.changes += 1
            self._cond.notify_all()

    def lost(self, error: DeviceError) -> None:
        with self._cond:
            self.lost_errors.append(error)
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self.wakes += 1
            self._cond.notify_all()

    def of(self, signal_id: str) -> list[Reading]:
        with self._cond:
            return [r for r in self.readings if r.signal_id == signal_id]

    def wait_for(
        self, condition: Callable[[], bool], timeout: float, what: str, quiet: bool = False
    ) -> None:
        with self._cond:
            if not self._cond.wait_for(condition, timeout) and not quiet:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def matcher(
    match: str,
    *,
    uri: str | None = SIM,
    namespace: int = 0,
    path: str = "$.component.instances[0].subscriptions[0].include[0]",
    deadband: DataChangeDeadband | None = None,
    sampling_rate_ms: float = 0,
) -> SignalMatcher:
    return SignalMatcher(
        path=path,
        namespace_uri=uri,
        namespace=namespace,
        match=re.compile(match),
        sampling_rate_ms=sampling_rate_ms,
        queue_size=10,
        deadband=deadband or DataChangeDeadband(),
    )


def subscription(
    *include: SignalMatcher, exclude: Sequence[SignalMatcher] = (), publish_ms: float = 100
) -> SubscriptionSpec:
    return SubscriptionSpec("sub1", publish_ms, tuple(include), tuple(exclude))


def instance(
    endpoint: str,
    subscriptions: Sequence[SubscriptionSpec] = (),
    *,
    connection: OpcUaConnection | None = None,
) -> InstanceSpec:
    settings = OpcUaSettings(
        connection=connection or OpcUaConnection(endpoint=endpoint),
        subscriptions=tuple(subscriptions),
        batch_ms=0,
    )
    return InstanceSpec(
        id="plc1",
        adapter="opcua",
        endpoint=endpoint,
        poll_groups=(),
        timing=Timing(connect_ms=10000, request_timeout_ms=5000),
        settings=settings,
    )


def good(sink: CollectingSink, signal_id: str) -> list[Reading]:
    return [r for r in sink.of(signal_id) if r.quality is Quality.GOOD]


def pump(
    driver: Any, sink: CollectingSink, condition: Callable[[], bool], timeout: float, what: str
) -> None:
    """Plays the runtime's part: calls `maintain()` whenever the driver asks (a wake or its
    own timer) until `condition` holds; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    wakes = -1
    due = 0.0
    while not condition():
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        if sink.wakes != wakes or now >= due:
            wakes = sink.wakes
            after = driver.maintain()
            due = now + (after if after is not None else 3600)
        sink.wait_for(
            lambda seen=wakes: condition() or sink.wakes != seen,
            min(0.2, max(0.0, deadline - time.monotonic())) or 0.01,
            what,
            quiet=True,
        )


def call_sim_method(endpoint: str, method: str, name: str) -> None:
    """Calls RemoveNode or RestoreNode on the sim's Line1 folder (a separate client)."""
    from asyncua import Client

    async def call() -> None:
        client = Client(endpoint)
        client.session_timeout = 600_000  # what the sim grants: no warning
        async with client:
            idx = await client.get_namespace_index(SIM)
            line1 = client.get_node(f"ns={idx};s=Line1")
            await line1.call_method(f"{idx}:{method}", name)

    asyncio.run(call())


#: The opcua-adapter timing of the component tests: quick reconnects and probes.
FAST_TIMING = {
    "connectMs": 5000,
    "requestTimeoutMs": 3000,
    "reconnectBackoffMinMs": 100,
    "reconnectBackoffMaxMs": 400,
    "keepaliveProbeIntervalMs": 200,
}


def opcua_instance(
    endpoint: str, match: str = "Counter|Temperature|Setpoint", **extra: Any
) -> dict[str, Any]:
    """An opcua-adapter instance entry on `endpoint` subscribed to the sim nodes `match`
    (`connection_user` sets connection.user)."""
    connection: dict[str, Any] = {"endpoint": endpoint}
    if "connection_user" in extra:
        connection["user"] = extra.pop("connection_user")
    return {
        "id": extra.pop("id", "line-1"),
        "connection": connection,
        "subscriptions": [
            {
                "id": "fast",
                "publishIntervalMs": 100,
                "include": [{"namespaceUri": "urn:unskit:sim", "match": match}],
            }
        ],
        "publish": {"batchMs": 0},
        **extra,
    }
