"""The Component builder: configuration, logging, messaging, readiness, health probes,
signals, metrics, events and heartbeat, wired in one place for every component.

A component is a `ComponentApp`: it gets the `Runtime` in `start()` and drains in `drain()`.
`unskit run NAME` finds it through the ``unskit.components`` entry points.

`Runtime` is joined here from its layers: `accessors` (its state and what a component
reaches through it: messaging, the command inbox, gauges, readiness), `stopping` (shutdown,
its drain steps, the main thread's wait for a stop signal) and `reconfiguration` (the
reload-config verb and a changed configuration applied); the protocols a component
implements are in `app`. This module keeps the wiring: start, the heartbeat, run, and
`unskit run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Sequence
from importlib.metadata import entry_points

from unskit.config.loader import ConfigLoader, add_config_arguments
from unskit.config.model import EMBEDDED_HOST, MessagingConfig
from unskit.config.platform import Platform, detect_platform
from unskit.edge.lifecycle import report_failed_start
from unskit.envelope import Message, MessageBuilder
from unskit.errors import ConfigError, ConfigIssue, EdgeRuntimeError, UnskitError
from unskit.localhost import free_port
from unskit.messaging import MessagingClient
from unskit.runtime.accessors import QUEUES_FAMILY as QUEUES_FAMILY
from unskit.runtime.app import ComponentApp as ComponentApp
from unskit.runtime.app import ReconfigurableApp as ReconfigurableApp
from unskit.runtime.embedded_broker import EmbeddedBroker
from unskit.runtime.events import Events
from unskit.runtime.health import HealthServer, ReadinessState
from unskit.runtime.logging_config import configure_logging
from unskit.runtime.metrics import MetricsReporter, create_emitter
from unskit.runtime.outbox_watch import OutboxWatch
from unskit.runtime.publish_watch import PublishWatch
from unskit.runtime.reconfiguration import _Reconfiguring
from unskit.runtime.shutdown import ShutdownCoordinator
from unskit.runtime.stopping import DRAIN_TIMEOUT_S as DRAIN_TIMEOUT_S
from unskit.runtime.stopping import _Stopping

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


class _LibraryPublisher:
    """Publishes on the library's own classes (state, metric): no reserved-topic check."""

    def __init__(self, messaging: MessagingClient, northbound: bool) -> None:
        self._messaging = messaging
        self._northbound = northbound

    def publish(self, topic: str, message: Message) -> None:
        self._messaging.publish_reserved(topic, message, northbound=self._northbound)


class Runtime(_Stopping, _Reconfiguring):
    """Everything a running component is wired to; built by `Runtime.start`."""

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
            if isinstance(error, (ConfigError, EdgeRuntimeError)):
                # The caller reports it (`unskit run` in one line); a traceback says nothing more.
                # Not the message itself: the caller prints it, once.
                _log.info("start-up refused; stopping what already started")
            else:
                _log.exception("start-up failed; stopping what already started")
            if self._coordinator is not None:
                self._coordinator.shutdown()
            else:
                self._abandon()
            raise

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

        probes = config.health.enabled_for(config.platform)
        if probes or self.lifecycle is not None:
            # The edge runtime's RUNNING waits on readiness too, probes or none.
            self.readiness = ReadinessState(self._answers)
        if probes and self.readiness is not None:
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
            if messaging_config.has_northbound
            else None
        )
        self.events = Events(self._messaging, self.topics, stamp=config)
        self.supervisor.attach_alarms(self.events)
        links = ("local", "northbound") if messaging_config.has_northbound else ("local",)
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
        if self.lifecycle is not None and self.readiness is not None:
            self.lifecycle.report_when_ready(
                self.readiness.is_ready, self.readiness.is_shutting_down
            )
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

    def _start_embedded_broker(self, messaging: MessagingConfig) -> MessagingConfig:
        local = messaging.local
        if local is None or local.host != EMBEDDED_HOST:
            return messaging
        port = local.port or free_port()
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
            config_source=args.config_source,
            component_schema=app_class.schema,
            default_component=app_class.token,
            broker=args.broker,
        )
        try:
            config = loader.load()
            # A component may refuse its configuration at start (no valid instance): exit 2
            # too, after the runtime stopped what had started.
            return Runtime(config).run(app_class(), loader)
        finally:
            loader.close()  # the edge runtime's IPC connection, for its sources
    except (ConfigError, EdgeRuntimeError) as error:
        # EdgeRuntimeError: on the edge runtime without its IPC variables (or its SDK).
        print(f"unskit run {name}: {error}", file=sys.stderr)
        _report_failed_start(args.platform)
        return 2
    except Exception:
        _report_failed_start(args.platform)
        raise


def _report_failed_start(platform: str | None) -> None:
    """ERRORED to the edge runtime, when on it (`platform` is the --platform override)."""
    try:
        resolved = detect_platform(override=platform)
    except ValueError:
        return  # the loader already refused the unknown name: no platform, nobody to tell
    report_failed_start(resolved is Platform.EDGE_RUNTIME)
