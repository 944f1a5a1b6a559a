"""The Component builder: configuration, logging, messaging, readiness, health probes,
signals, metrics, events and heartbeat, wired in one place for every component.

A component is a `ComponentApp`: it gets the `Runtime` in `start()` and drains in `drain()`.
`unskit run NAME` finds it through the ``unskit.components`` entry points.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol

from unskit.commands.codes import ErrorCode
from unskit.commands.idempotency import IdempotencyStore
from unskit.commands.inbox import CommandInbox
from unskit.commands.verbs import CommandContext, ReloadOutcome, RequestIdRule, Verb
from unskit.config.loader import ConfigLoader, add_config_arguments
from unskit.config.model import EMBEDDED_HOST, ComponentConfig, MessagingConfig
from unskit.envelope import Message, MessageBuilder
from unskit.errors import CommandError, ConfigError, ConfigIssue, UnskitError
from unskit.messaging import MessagingClient, ReplyRefusal
from unskit.runtime.embedded_broker import EmbeddedBroker
from unskit.runtime.events import Events
from unskit.runtime.health import HealthServer, ReadinessState
from unskit.runtime.logging_config import configure_logging
from unskit.runtime.metrics import MetricsRegistry, MetricsReporter, create_emitter
from unskit.runtime.outbox_watch import OutboxWatch
from unskit.runtime.publish_watch import PublishWatch
from unskit.runtime.shutdown import ShutdownCoordinator
from unskit.runtime.supervision import Supervisor

__all__ = [
    "COMPONENT_ENTRY_POINTS",
    "QUEUES_FAMILY",
    "ComponentApp",
    "ReconfigurableApp",
    "Runtime",
    "load_component",
    "run_component",
]

_log = logging.getLogger(__name__)

COMPONENT_ENTRY_POINTS = "unskit.components"
#: The family of the queue-depth gauges (`Runtime.observe_queue`).
QUEUES_FAMILY = "queues"
# How long messaging may take to flush QoS 1/2 publishes and drain handlers at shutdown.
DRAIN_TIMEOUT_S = 5.0


class ComponentApp(Protocol):
    """What a component implements; the runtime owns everything around it. A component
    whose section has rules its schema cannot say also offers a classmethod
    ``configuration_issues(config) -> list[ConfigIssue]``, which `unskit validate` calls.
    A component holding stores that its metrics, verbs or message handlers read (a catalog,
    delivery progress) also offers ``close()``: the runtime calls it once at shutdown, after
    the final metric emission and after messaging closed, so nothing reads a closed store."""

    #: The {component} topic token used when the configuration sets none.
    token: ClassVar[str]
    #: JSON Schema of the `component` section, or None to accept any object.
    schema: ClassVar[Mapping[str, Any] | None]

    def start(self, runtime: Runtime) -> None:
        """Subscribes, starts its own threads; returns promptly."""
        ...

    def drain(self) -> None:
        """Finishes in-flight work; called once at shutdown, before messaging closes."""
        ...


class ReconfigurableApp(ComponentApp, Protocol):
    """A component that applies a changed configuration live (and so offers reload-config)."""

    def reconfigure(self, config: ComponentConfig) -> ReloadOutcome | None:
        """Applies `config`; raises ConfigError to reject it and keep the running one."""
        ...


class _LibraryPublisher:
    """Publishes on the library's own classes (state, metric): no reserved-topic check."""

    def __init__(self, messaging: MessagingClient, northbound: bool) -> None:
        self._messaging = messaging
        self._northbound = northbound

    def publish(self, topic: str, message: Message) -> None:
        self._messaging.publish_reserved(topic, message, northbound=self._northbound)


class Runtime:
    """Everything a running component is wired to; built by `Runtime.start`."""

    def __init__(self, config: ComponentConfig) -> None:
        self.config = config
        self.platform = config.platform
        self.topics = config.topics
        self.metrics = MetricsRegistry()
        #: Reports, counts and restarts the component's failed threads; what is dead keeps
        #: readiness off (`_answers`).
        self.supervisor = Supervisor(self.metrics)
        self.embedded_broker: EmbeddedBroker | None = None
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
        assert broker is not None
        status = functools.partial(self.get_messaging().link_status, link == "northbound")
        for host, port in broker.addresses:
            endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

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
        """Sets the component's readiness gate; a no-op when the probe server is disabled."""
        if self.readiness is not None:
            self.readiness.set_ready(ready)

    def shutdown(self) -> None:
        """Readiness off first, then every subsystem drains, the health server last."""
        if self._coordinator is not None:
            self._coordinator.shutdown()
        self._stopped.set()
        if self._wakeup is not None:
            with contextlib.suppress(OSError):
                self._wakeup.send(b"\0")

    def _stop_requested(self, signal_name: str) -> None:
        # Called by the signal handler: record only; the wakeup fd already woke the main thread.
        self._stop_signal = signal_name

    @property
    def shutting_down(self) -> bool:
        """True once shutdown has begun."""
        return self._stopped.is_set() or (
            self._coordinator is not None and self._coordinator.shutting_down
        )

    # -- wiring ---------------------------------------------------------------------------

    def start(
        self,
        app: ComponentApp | None = None,
        loader: ConfigLoader | None = None,
        *,
        signals: bool = False,
    ) -> Runtime:
        """Starts logging, the embedded broker, messaging, probes, metrics, heartbeat, `app`;
        on a failure, stops what already started and raises. `loader` is the configuration
        source the reload-config verb reads again; `signals` installs the SIGTERM/SIGINT
        handlers before the probes can report ready (what `run` does)."""
        if loader is not None:
            self._loader = loader
        try:
            return self._start(app, signals)
        except BaseException as error:
            if isinstance(error, ConfigError):
                # The caller reports it (`unskit run` in one line); a traceback says nothing more.
                _log.info("configuration refused at start-up; stopping what already started")
            else:
                _log.exception("start-up failed; stopping what already started")
            if self._coordinator is not None:
                self._coordinator.shutdown()
            else:
                self._abandon()
            raise

    def _abandon(self) -> None:
        if self._messaging is not None:
            self._messaging.close(DRAIN_TIMEOUT_S)
        if self.health is not None:
            self.health.stop()
        if self.embedded_broker is not None:
            self.embedded_broker.stop()

    def _start(self, app: ComponentApp | None, signals: bool) -> Runtime:
        config = self.config
        configure_logging(config.logging, config.platform)
        _log.info(
            "starting %s on %s (platform %s)",
            config.component_token,
            config.thing_name,
            config.platform.value,
        )
        messaging_config = self._start_embedded_broker(config.messaging)
        secrets = config.secrets() if config.credentials is not None else None
        # Held until the component has subscribed: a resumed session delivers what waited
        # on the broker (requests sent while we were down) right after CONNACK.
        self._messaging = MessagingClient(
            messaging_config, secrets=secrets, on_reply_refused=self._count_refused_reply
        ).start(hold=True)

        if config.health.enabled_for(config.platform):
            self.readiness = ReadinessState(self._answers)
            self.health = HealthServer(config.health, self.readiness)
        coordinator = ShutdownCoordinator(
            self.readiness, self.health, on_signal=self._stop_requested
        )
        self._coordinator = coordinator
        # Registered before anything else starts, so a failed start-up drains the same way.
        # Order: the component's own work, then what publishes on its behalf, then messaging
        # (flushes QoS 1/2), then the embedded broker; the health server is last.
        coordinator.add_drain_step("command inbox", self._refuse_commands)
        coordinator.add_drain_step(config.component_token, lambda: self._drain_app(app))
        coordinator.add_drain_step("held commands", self._close_commands)
        coordinator.add_drain_step("heartbeat", self._stop_heartbeat)
        coordinator.add_drain_step("publish watch", self._stop_publish_watch)
        coordinator.add_drain_step("metrics", self._stop_metrics)
        coordinator.add_drain_step("messaging", lambda: self.get_messaging().close(DRAIN_TIMEOUT_S))
        # After messaging: no request can reach the idempotency store any more.
        coordinator.add_drain_step("command store", self._close_command_store)
        # Likewise the component's own stores, after the last metric read them too.
        if callable(getattr(app, "close", None)):
            coordinator.add_drain_step(
                f"{config.component_token} stores", lambda: self._close_app(app)
            )
        if self.embedded_broker is not None:
            coordinator.add_drain_step("embedded broker", self.embedded_broker.stop)
        # Before the probes answer: whoever sees ready may signal, and must get a drain.
        if signals:
            coordinator.install_signal_handlers()
        if self.health is not None:
            self.health.start()
            _log.info("health probes on port %s", self.health.port)

        local = _LibraryPublisher(self._messaging, northbound=False)
        cloud = (
            _LibraryPublisher(self._messaging, northbound=True)
            if messaging_config.northbound is not None
            else None
        )
        self.events = Events(self._messaging, self.topics, stamp=config)
        self.supervisor.attach_alarms(self.events)
        links = ("local", "northbound") if messaging_config.northbound is not None else ("local",)
        self.publish_watch = PublishWatch(self._messaging, self.events, links).start()
        for link in links:
            self.observe_queue(
                f"messaging.{link}",
                functools.partial(_publish_backlog, self._messaging, link == "northbound"),
            )
            self._observe_link(link, messaging_config)
        if self._messaging.outbox_status() is not None:
            self.outbox_watch = OutboxWatch(self._messaging, self.events, self.metrics).start()
        emission = config.metric_emission
        if emission.enabled:
            emitter = create_emitter(
                emission, self.metrics, scope=self.topics, local=local, cloud=cloud, stamp=config
            )
            self._reporter = MetricsReporter(self.metrics, emitter, emission.interval_seconds)
            self._reporter.start()
        if config.heartbeat.enabled:
            self._heartbeat = self.supervisor.thread(
                "unskit-heartbeat",
                functools.partial(self._beat, local, time.monotonic()),
                self._heartbeat_stop,
            )
            self._heartbeat.start()

        if app is not None:
            self._app = app
            app.start(self)
            self._app_started = True
        if self._inbox is not None:
            self._inbox.register(self._reload_verb(app))
            self._inbox.start()
        self._messaging.release()
        self._serving = True
        return self

    def _answers(self) -> bool:
        """Readiness's connectivity check: start-up has ended, the local link is up and the
        broker acknowledged every subscription (the command inbox's among them), and no part
        of the component is dead (`Supervisor.problems`: a thread that could not go on, every
        southbound instance failed)."""
        messaging = self._messaging
        return (
            self._serving
            and messaging is not None
            and (
                (messaging.connected() and messaging.subscriptions_acknowledged())
                # A failover between listed brokers is a reconnect, not an outage.
                or messaging.within_failover_grace()
            )
            and not self.supervisor.problems()
        )

    def _reload_verb(self, app: ComponentApp | None) -> Verb:
        reason = None
        if getattr(app, "reconfigure", None) is None:
            reason = "this component applies configuration changes only at restart"
        return Verb(
            "reload-config",
            self._reload,
            request_id=RequestIdRule.REQUIRED,
            enabled=reason is None,
            disabled_reason=reason,
            summary="re-read the configuration source and apply it live",
        )

    def _reload(self, _context: CommandContext) -> dict[str, list[str]]:
        if self._loader is None or self._app is None:
            raise CommandError(
                ErrorCode.UNSUPPORTED_CAPABILITY, "this runtime has no configuration source"
            )
        try:
            config = self._loader.resolve(self._loader.read())
            outcome = self.apply_config(config, self._app)
        except ConfigError as error:
            raise CommandError(
                ErrorCode.BAD_ARGS, f"the configuration was rejected, the running one kept: {error}"
            ) from None
        return (outcome or ReloadOutcome()).to_body()

    def _refuse_commands(self) -> None:
        if self._inbox is not None:
            self._inbox.stop_accepting()

    def _close_commands(self) -> None:
        if self._inbox is not None:
            self._inbox.close()

    def _close_command_store(self) -> None:
        if self._inbox is not None:
            self._inbox.close_store()

    def _drain_app(self, app: ComponentApp | None) -> None:
        if app is not None and self._app_started:
            app.drain()

    def _close_app(self, app: ComponentApp | None) -> None:
        close = getattr(app, "close", None)
        if close is not None and self._app_started:
            close()

    def _stop_publish_watch(self) -> None:
        if self.publish_watch is not None:
            self.publish_watch.stop(DRAIN_TIMEOUT_S)
        if self.outbox_watch is not None:
            self.outbox_watch.stop(DRAIN_TIMEOUT_S)

    def _stop_metrics(self) -> None:
        if self._reporter is not None:
            self._reporter.stop()

    def _start_embedded_broker(self, messaging: MessagingConfig) -> MessagingConfig:
        local = messaging.local
        if local is None or local.host != EMBEDDED_HOST:
            return messaging
        port = local.port or _free_port()
        self.embedded_broker = EmbeddedBroker(port).start()
        _log.info("messaging.local is embedded: this component owns a broker on 127.0.0.1:%d", port)
        return dataclasses.replace(
            messaging, local=dataclasses.replace(local, host="127.0.0.1", port=port)
        )

    def _beat(self, publisher: _LibraryPublisher, started: float) -> None:
        interval = self.config.heartbeat.interval_seconds
        topic = self.topics.topic("state", "heartbeat")
        while not self._heartbeat_stop.wait(interval):
            message = (
                MessageBuilder("Heartbeat", "1.0", self.config)
                .body({"status": "alive", "uptimeSeconds": round(time.monotonic() - started, 3)})
                .build()
            )
            try:
                publisher.publish(topic, message)
            except UnskitError as error:
                _log.warning("heartbeat not published: %s", error)

    def apply_config(self, config: ComponentConfig, app: ComponentApp) -> ReloadOutcome | None:
        """A changed, valid configuration: logging follows at once; the component applies
        the rest through its `reconfigure(config)` if it has one, else a restart does.
        While it applies, every command verb answers DEVICE_UNAVAILABLE."""
        with self._inbox.draining() if self._inbox is not None else contextlib.nullcontext():
            return self._apply_config(config, app)

    def _apply_config(self, config: ComponentConfig, app: ComponentApp) -> ReloadOutcome | None:
        reconfigure = getattr(app, "reconfigure", None)
        outcome: ReloadOutcome | None = None
        if reconfigure is not None:
            # A rejection (ConfigError) leaves the running configuration in place.
            outcome = reconfigure(config)
        previous, self.config = self.config, config
        if config.logging != previous.logging:
            configure_logging(config.logging, config.platform)
        if outcome is not None and self.events is not None:
            self.events.info("config-applied", outcome.to_body())
        if reconfigure is None and config.document != previous.document:
            _log.warning(
                "configuration changed; %s applies only logging changes live, restart it "
                "to apply the rest",
                config.component_token,
            )
        return outcome

    def _apply_watched(self, config: ComponentConfig, app: ComponentApp) -> None:
        try:
            self.apply_config(config, app)
        except ConfigError as error:
            _log.warning("configuration change rejected, keeping the running one: %s", error)

    def _stop_heartbeat(self) -> None:
        self._heartbeat_stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(DRAIN_TIMEOUT_S)

    def run(self, app: ComponentApp, loader: ConfigLoader | None = None) -> int:
        """Starts, installs SIGTERM/SIGINT handlers, follows configuration changes when the
        source is watchable (a mounted directory), blocks until shutdown; returns 0."""
        # Watching starts before anything else, so no change slips in during start-up.
        watch = loader.watch(lambda config: self._apply_watched(config, app)) if loader else None
        try:
            self.start(app, loader, signals=True)
        except BaseException:
            if watch is not None:
                watch.close()
            raise
        assert self._coordinator is not None
        if watch is not None:
            # First in line: no change is applied while the component drains.
            self._coordinator.add_drain_step("configuration watch", watch.close, first=True)
        _log.info("%s running", self.config.component_token)
        # A stop signal is recorded by its handler; this thread drains, then returns 0.
        self._wait_until_stopped()
        return 0

    def _wait_until_stopped(self) -> None:
        """Blocks until shutdown. The kernel may deliver SIGTERM to any thread, and then a
        plain Event.wait() in the main thread never returns to run the Python handler; the
        main thread therefore waits on the signal wakeup fd, which every signal writes to."""
        if threading.current_thread() is not threading.main_thread():
            self._stopped.wait()
            return
        receive, send = socket.socketpair()
        receive.setblocking(False)
        send.setblocking(False)
        self._wakeup = send
        previous = signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
        try:
            while not self._stopped.is_set():
                if self._stop_signal is not None:
                    self.shutdown()
                    break
                select.select([receive], [], [])
                with contextlib.suppress(BlockingIOError):
                    receive.recv(512)
        finally:
            signal.set_wakeup_fd(previous)
            self._wakeup = None
            receive.close()
            send.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _publish_backlog(messaging: MessagingClient, northbound: bool) -> int:
    return messaging.publish_status(northbound=northbound).backlog


def load_component(name: str) -> type[ComponentApp]:
    """The ComponentApp class registered under `name` in the ``unskit.components`` group."""
    found = entry_points(group=COMPONENT_ENTRY_POINTS, name=name)
    for entry in found:
        loaded: type[ComponentApp] = entry.load()
        return loaded
    known = sorted(e.name for e in entry_points(group=COMPONENT_ENTRY_POINTS))
    raise ConfigError(
        [ConfigIssue("COMPONENT", f"unknown component {name!r}; installed: {', '.join(known)}")]
    )


def run_component(
    name: str, argv: Sequence[str], app_class: type[ComponentApp] | None = None
) -> int:
    """`unskit run NAME -c FILE -t THING [--broker HOST:PORT]`: exit 0 after a clean shutdown,
    2 when the configuration is refused (nothing started). `app_class` runs a component that
    is not installed under `name` (a script's own)."""
    parser = argparse.ArgumentParser(prog=f"unskit run {name}")
    add_config_arguments(parser)
    parser.add_argument(
        "--broker",
        metavar="HOST:PORT",
        help="use this local broker instead of messaging.local (or 'embedded[:PORT]')",
    )
    args = parser.parse_args(argv)
    try:
        if app_class is None:
            app_class = load_component(name)
        loader = ConfigLoader(
            args.config,
            thing=args.thing,
            platform=args.platform,
            component_schema=app_class.schema,
            default_component=app_class.token,
            broker=args.broker,
        )
        config = loader.load()
        # A component may refuse its configuration at start (no valid instance): exit 2 too,
        # after the runtime stopped what had started.
        return Runtime(config).run(app_class(), loader)
    except ConfigError as error:
        print(f"unskit run {name}: {error}", file=sys.stderr)
        return 2
