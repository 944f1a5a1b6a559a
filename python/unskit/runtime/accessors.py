"""The accessors layer of `Runtime`: its state, and what a component reaches through it
while it runs (the specification's runtime accessors): messaging and its links' status and
metrics, the command inbox, queue-depth gauges, the metric cadence, the readiness gate, and
the counts of command outcomes and refused replies."""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable, Collection
from typing import Any

from unskit.commands.idempotency import IdempotencyStore
from unskit.commands.inbox import CommandInbox
from unskit.config.loader import ConfigLoader
from unskit.config.model import ComponentConfig, MessagingConfig
from unskit.config.platform import Platform
from unskit.edge.lifecycle import LifecycleReporter
from unskit.errors import UnskitError
from unskit.messaging import MessagingClient, ReplyRefusal
from unskit.runtime.app import ComponentApp
from unskit.runtime.embedded_broker import EmbeddedBroker
from unskit.runtime.events import Events
from unskit.runtime.health import HealthServer, ReadinessState
from unskit.runtime.metrics import MetricsRegistry, MetricsReporter
from unskit.runtime.outbox_watch import OutboxWatch
from unskit.runtime.publish_watch import PublishWatch
from unskit.runtime.shutdown import ShutdownCoordinator
from unskit.runtime.supervision import Supervisor

#: The family of the queue-depth gauges (`Runtime.observe_queue`).
QUEUES_FAMILY = "queues"


class _Accessors:
    """The accessors layer of `Runtime`: its state and the runtime accessors."""

    def __init__(self, config: ComponentConfig) -> None:
        self.config = config
        self.platform = config.platform
        self.topics = config.topics
        self.metrics = MetricsRegistry()
        #: Reports, counts and restarts the component's failed threads; what is dead keeps
        #: readiness off (`_answers`).
        self.supervisor = Supervisor(self.metrics)
        self.embedded_broker: EmbeddedBroker | None = None
        #: Reports RUNNING/ERRORED to the edge runtime; None on every other platform.
        self.lifecycle = LifecycleReporter.for_component(config.platform is Platform.EDGE_RUNTIME)
        self.readiness: ReadinessState | None = None
        self.health: HealthServer | None = None
        self._messaging: MessagingClient | None = None
        self._reporter: MetricsReporter | None = None
        self._heartbeat_stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._stopped = threading.Event()
        #: Wakes the main thread's wait in `run` (see `_wait_until_stopped`).
        self._wakeup: socket.socket | None = None
        #: The stop signal received, if any: `run`'s main thread drains on seeing it.
        self._stop_signal: str | None = None
        self._coordinator: ShutdownCoordinator | None = None
        self._app_started = False
        self._app: ComponentApp | None = None
        self._loader: ConfigLoader | None = None
        self._inbox: CommandInbox | None = None
        # Set once start-up has ended: the component subscribed and held messages went out.
        self._serving = False
        self.events: Events | None = None
        #: Raises and clears message-publish-degraded; None until started.
        self.publish_watch: PublishWatch | None = None
        #: Samples the northbound outbox (storeAndForward); None when there is none.
        self.outbox_watch: OutboxWatch | None = None

    # -- the runtime accessors of the specification -------------------------------------

    def get_messaging(self) -> MessagingClient:
        """The messaging client."""
        if self._messaging is None:
            raise UnskitError("the runtime is not started: messaging is not available yet")
        return self._messaging

    def command_inbox(self, instances: Callable[[], Collection[str]] | None = None) -> CommandInbox:
        """The component's command inbox, created on first call (from `start()`); its
        verbs are served once `start()` returns. `instances` lists the configured
        instance ids the inbox resolves addressing against."""
        if self._inbox is None:
            messaging = self.get_messaging()
            commands = self.config.commands
            store = IdempotencyStore(
                commands.store_path(self.config.thing_name, self.config.component_token),
                retention_seconds=commands.idempotency_retention_hours * 3600,
                max_records=commands.max_idempotency_records,
                synchronous_full=commands.durable_sync,
            )
            self._inbox = CommandInbox(
                messaging,
                self.topics,
                store=store,
                instances=instances or tuple,
                stamp=self.config,
                max_concurrency=commands.max_concurrency,
                max_queued=commands.max_queued,
                cursor_ttl_seconds=commands.cursor_ttl_seconds,
                on_outcome=self._count_command,
                deadline_seconds=self.config.messaging.request_timeout_seconds,
                max_body_bytes=commands.max_body_bytes,
                max_body_depth=commands.max_body_depth,
            )
            inbox = self._inbox
            self.observe_queue(
                "commands.inbox", lambda: sum(messaging.queued(f) for f in inbox.filters)
            )
        return self._inbox

    def _observe_link(self, link: str, config: MessagingConfig) -> None:
        """``messaging/connectedEndpoint{link,endpoint}`` (1 for the broker the link is on,
        0 for the other listed ones), ``messaging/failovers{link}`` and
        ``messaging/refusedSubscriptions{link}`` (SUBACK refusals, retries counted) at each
        emit."""
        broker = config.northbound if link == "northbound" else config.local
        status = functools.partial(self.get_messaging().link_status, link == "northbound")
        # An IPC link (local, or northbound over the runtime's proxy) has no broker list:
        # its one endpoint is the nucleus's socket.
        endpoints = (
            [
                f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                for host, port in broker.addresses
            ]
            if broker is not None
            else [status()["endpoint"]]
        )
        for endpoint in endpoints:

            def on_it(endpoint: str = endpoint) -> int:
                now = status()
                return int(now["connected"] and now["endpoint"] == endpoint)

            self.metrics.observe(
                "messaging", "connectedEndpoint", on_it, {"link": link, "endpoint": endpoint}
            )
        self.metrics.observe(
            "messaging", "failovers", lambda: status()["failovers"], {"link": link}
        )
        stats = functools.partial(self.get_messaging().stats, link == "northbound")
        self.metrics.observe(
            "messaging",
            "refusedSubscriptions",
            lambda: stats().refused_subscriptions,
            {"link": link},
        )

    def messaging_status(self) -> dict[str, Any]:
        """The links' part of a component's sb/status: connected, endpoint, failovers."""
        messaging = self.get_messaging()
        links = {"local": messaging.link_status()}
        if messaging.has_northbound:
            links["northbound"] = messaging.link_status(northbound=True)
        return links

    def observe_queue(self, name: str, depth: Callable[[], int]) -> None:
        """Reports `depth()` as the gauge ``queues/depth{queue=name}`` at each metrics emit,
        so a backlog that only grows shows beside the others (`make soak` samples them)."""
        self.metrics.observe(QUEUES_FAMILY, "depth", depth, {"queue": name})

    def set_metrics_interval(self, seconds: float) -> None:
        """Sets the metric cadence from here on (an adapter's metricsIntervalSecs, given,
        overrides metricEmission.intervalSeconds); a no-op when metric emission is off."""
        if self._reporter is not None:
            self._reporter.set_interval(seconds)

    def _count_command(self, verb: str, outcome: str) -> None:
        self.metrics.counter("commands", "replies", {"verb": verb, "outcome": outcome}).inc()

    def _count_refused_reply(self, link: str, refusal: ReplyRefusal) -> None:
        self.metrics.counter(
            "messaging", "repliesRefused", {"link": link, "reason": refusal.value}
        ).inc()

    def set_ready(self, ready: bool) -> None:
        """Sets the component's readiness gate; a no-op when the probe server is disabled
        (except on the edge runtime, whose lifecycle report waits on readiness)."""
        if self.readiness is not None:
            self.readiness.set_ready(ready)
