"""The camera service: composes the camera adapter's rooms over one catalog and one storage,
starts their threads and drains them.

- sessions: the configured cameras at run time (pause, reconnect, snapshots);
- admission: capture requests become jobs, all or nothing, and replies are held;
- pending: the non-terminal captures in memory, dispatch queues and the frame budget;
- pipeline: per-camera dispatchers running acquire, encode, persist;
- outcomes: terminal transitions, committed then announced, deadlines, recovery;
- announcements: terminal messages, lifecycle events, the storage alarm;
- queries and queues: what the status and administration verbs read and do;
- ptz_stops: the stops armed for continuous PTZ moves (ptz.py).

`reconfigure` applies a changed configuration live, per camera (see its docstring).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from unskit.camera.admission import Admission
from unskit.camera.announcements import Announcer, StorageWatch
from unskit.camera.backends import Backend, create_backend
from unskit.camera.catalog import Catalog
from unskit.camera.config import CameraSettings, CameraSpec, capture_mode
from unskit.camera.discovery import Discovery
from unskit.camera.jobs import BACKLOG, IN_FLIGHT, STAGES
from unskit.camera.outcomes import Outcomes
from unskit.camera.pending import DispatchQueue, PendingCaptures
from unskit.camera.pipeline import CapturePipeline
from unskit.camera.ptz import PtzStops
from unskit.camera.queries import CatalogQueries
from unskit.camera.queues import QueueAdministration
from unskit.camera.schedules import Schedules
from unskit.camera.sessions import CameraSession, CameraSessions
from unskit.camera.storage import Storage
from unskit.commands.codes import ErrorCode
from unskit.commands.verbs import ReloadOutcome
from unskit.config.secrets import SecretResolver
from unskit.envelope import EnvelopeStamp
from unskit.errors import CaptureError, ConfigError, ConfigIssue, UnskitError
from unskit.messaging import MessagingClient
from unskit.runtime.events import Events
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.publish_watch import PublishWatch
from unskit.runtime.supervision import Supervisor
from unskit.topics import TopicScope

__all__ = ["CameraService"]

_log = logging.getLogger(__name__)

# In-flight work a drain waits for before it leaves the rest to restart recovery.
DRAIN_WAIT_S = 5.0
#: How long a reload waits for a restarting (or removed) camera's capture in hand; past it,
#: that capture fails with DEVICE_UNAVAILABLE.
RESTART_WAIT_S = 5.0
#: Sections a reload cannot change: they are open (storage roots, the catalog) or built
#: into the verbs (the metadata bound, discovery).
_RESTART_ONLY = (
    ("$.component.storage.outputRoot", lambda s: s.storage.output_root),
    ("$.component.storage.stateRoot", lambda s: s.storage.state_root),
    ("$.component.limits.maxMetadataBytes", lambda s: s.limits.max_metadata_bytes),
    (
        "$.component.discovery",
        lambda s: (
            s.discovery_enabled,
            s.report_unconfigured,
            s.discovery_multicast,
            s.discovery_addresses,
            s.discovery_interface,
        ),
    ),
)


class CameraService:
    """Owns the cameras, the catalog and the pipeline; the verbs call its rooms."""

    def __init__(
        self,
        settings: CameraSettings,
        *,
        messaging: MessagingClient,
        topics: TopicScope,
        stamp: EnvelopeStamp,
        metrics: MetricsRegistry,
        events: Events | None,
        secrets: SecretResolver | None = None,
        ipc: bool = False,
        publish_watch: PublishWatch | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.settings = settings
        self.storage = Storage(settings.storage)
        self.storage.prepare()
        self.catalog = Catalog(
            settings.storage.state_root / "catalog.sqlite3",
            synchronous_full=settings.storage.fsync,
            retention=settings.retention,
        )

        def backend(spec: CameraSpec) -> Backend:
            return create_backend(spec.backend, spec.connection, self._secrets)

        self._secrets = secrets
        self._metrics = metrics
        # The component's: a failed thread is alarmed and counted there, and a dead one
        # keeps readiness off.
        self._supervisor = supervisor or Supervisor(metrics)

        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.pending = PendingCaptures(settings.limits, settings.cameras)
        self.sessions = CameraSessions(settings.cameras.values(), backend, self.pending.lock)
        self.ptz_stops = PtzStops()
        self.discovery = Discovery(
            multicast=settings.discovery_multicast,
            addresses=settings.discovery_addresses,
            interface=settings.discovery_interface,
        )
        self.queries = CatalogQueries(self.catalog)
        announcer = Announcer(
            messaging=messaging,
            topics=topics,
            stamp=stamp,
            metrics=metrics,
            events=events,
            lifecycle=settings.capture_lifecycle_events,
            max_queued_events=settings.max_queued_events,
            publish_watch=publish_watch,
            supervisor=self._supervisor,
        )
        self._storage_watch = StorageWatch(
            self.storage, announcer, settings.storage.check_interval_ms / 1000
        )
        self.announcer = announcer
        self.outcomes = Outcomes(
            catalog=self.catalog,
            storage=self.storage,
            pending=self.pending,
            sessions=self.sessions,
            queries=self.queries,
            announcer=announcer,
            metrics=metrics,
        )
        self.admission = Admission(
            settings,
            sessions=self.sessions,
            pending=self.pending,
            catalog=self.catalog,
            storage=self.storage,
            queries=self.queries,
            announcer=announcer,
            stopping=self._stopping,
        )
        self.queues = QueueAdministration(
            settings.limits,
            sessions=self.sessions,
            pending=self.pending,
            catalog=self.catalog,
            outcomes=self.outcomes,
        )
        self._pipeline = CapturePipeline(
            settings,
            pending=self.pending,
            outcomes=self.outcomes,
            catalog=self.catalog,
            storage=self.storage,
            announcer=announcer,
            metrics=metrics,
            stopping=self._stopping,
            ipc=ipc,
        )
        self._schedule_stop = threading.Event()
        self._schedules = Schedules(
            self.sessions, self.admission, metrics, self._schedule_stop, announcer
        )
        self._schedule_thread: threading.Thread | None = None
        self._dispatchers: dict[str, threading.Thread] = {}
        # One reload at a time.
        self._reload_lock = threading.Lock()

    def start(self) -> None:
        """Recovers what the previous run left, then starts dispatchers, watchdog, schedules."""
        self.outcomes.recover()
        for session in self.sessions:
            if session.spec.enabled:
                self._dispatch(session)
        self._spawn("camera-deadlines", self.outcomes.watch_deadlines, self._stopping)
        self._storage_watch.start()
        if self._schedules.configured:
            self._schedule_thread = self._spawn("camera-schedules", self._schedules.run)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
        # Supervised: a failure is logged, counted and the loop restarted (until stopping),
        # instead of a dispatcher or the deadline watch ending unseen.
        body = functools.partial(target, *args)
        thread = self._supervisor.thread(name, body, self._stopping)
        thread.start()
        # Reloads start and end dispatchers: only the live ones are kept.
        self._threads = [*(t for t in self._threads if t.is_alive()), thread]
        return thread

    def _dispatch(self, session: CameraSession) -> None:
        """Starts the camera's dispatcher unless it runs."""
        running = self._dispatchers.get(session.instance)
        if running is None or not running.is_alive():
            self._dispatchers[session.instance] = self._spawn(
                f"camera-{session.instance}", self._pipeline.dispatch, session
            )

    # -- live reload ------------------------------------------------------------------------

    def reconfigure(
        self, settings: CameraSettings, secrets: SecretResolver | None = None
    ) -> ReloadOutcome:
        """Applies a changed configuration live: unchanged cameras are kept, a changed one
        restarts alone (its queued captures kept, or failed when it is now disabled or
        captures differently), added ones start, removed ones stop (queued captures failed
        NO_SUCH_INSTANCE); profiles, limits, storage floors and events apply to new captures.
        ConfigError rejects the candidate whole and keeps everything as it was."""
        with self._reload_lock:
            return self._reconfigure(settings, secrets)

    def _reconfigure(
        self, settings: CameraSettings, secrets: SecretResolver | None
    ) -> ReloadOutcome:
        old = self.settings
        issues = [
            ConfigIssue(path, "applies only at restart; the running value is kept")
            for path, value in _RESTART_ONLY
            if value(old) != value(settings)
        ]
        if issues:
            raise ConfigError(issues)
        running = {session.instance: session.spec for session in self.sessions}
        kept = [name for name, spec in settings.cameras.items() if running.get(name) == spec]
        added = [name for name in settings.cameras if name not in running]
        removed = [name for name in running if name not in settings.cameras]
        changed = [name for name in settings.cameras if name in running and name not in kept]
        # Every new backend is built before anything changes: a camera that cannot be built
        # rejects the candidate whole.
        backends: dict[str, Backend] = {}
        failures = []
        for name in [*changed, *added]:
            spec = settings.cameras[name]
            if not spec.enabled:
                continue
            try:
                backends[name] = create_backend(spec.backend, spec.connection, secrets)
            except (UnskitError, ValueError, OSError) as error:
                failures.append(ConfigIssue(f"$.component.cameras[{name}]", str(error)))
        if failures:
            for backend in backends.values():
                backend.close()
            raise ConfigError(failures)
        sections = _changed_sections(old, settings)
        self._secrets = secrets
        self.settings = settings
        self.storage.spec = settings.storage
        self.catalog.retention = settings.retention
        self.pending.limits = settings.limits
        self.queues.limits = settings.limits
        self.admission.reconfigure(settings)
        self._pipeline.reconfigure(settings)
        self.announcer.reconfigure(settings.capture_lifecycle_events, settings.max_queued_events)
        if settings.storage.check_interval_ms != old.storage.check_interval_ms:
            self._storage_watch.stop()
            self._storage_watch = StorageWatch(
                self.storage, self.announcer, settings.storage.check_interval_ms / 1000
            )
            self._storage_watch.start()
        cameras_changed = bool(added or removed or changed)
        if cameras_changed:
            self._stop_schedules()
        for name in removed:
            self._remove(name)
        for name in changed:
            self._restart(settings.cameras[name], backends.get(name))
        for name in added:
            spec = settings.cameras[name]
            session = CameraSession(spec, backends.get(name))
            self.pending.queues[name] = DispatchQueue()
            self.sessions.add(session)
            if spec.enabled:
                self._dispatch(session)
        self.sessions.reorder(settings.cameras)
        if cameras_changed:
            self._start_schedules()
        outcome = ReloadOutcome(
            started=[*changed, *added], stopped=removed, kept=kept, changed=sections
        )
        _log.info(
            "cameras: started %s, stopped %s, kept %s; sections changed: %s",
            outcome.started,
            outcome.stopped,
            outcome.kept,
            sections,
        )
        return outcome

    def _hold(self, session: CameraSession) -> bool:
        """Takes the camera between captures; past RESTART_WAIT_S fails the capture in hand
        (DEVICE_UNAVAILABLE) and returns False. The caller calls `_release`."""
        session.ready.clear()
        if session.in_use.acquire(timeout=RESTART_WAIT_S):
            return True
        message = "the camera was restarted by a configuration reload during the capture"
        self._fail(session.instance, IN_FLIGHT, ErrorCode.DEVICE_UNAVAILABLE, message)
        return False

    @staticmethod
    def _release(session: CameraSession, held: bool) -> None:
        if held:
            session.in_use.release()
        session.ready.set()

    def _fail(self, instance: str, states: Any, code: ErrorCode, message: str) -> None:
        for capture in self.pending.in_states(states, instance):
            capture.abandon.set()
            stage = STAGES.get(capture.job.state, "queue")
            self.outcomes.fail(capture, CaptureError(code, stage, message, retriable=True))

    def _restart(self, spec: CameraSpec, backend: Backend | None) -> None:
        session = self.sessions.get(spec.instance)
        previous = session.spec
        if not spec.enabled:
            message = "the camera was disabled by a configuration reload"
            self._fail(spec.instance, BACKLOG, ErrorCode.CAMERA_DISABLED, message)
        elif spec.backend != previous.backend or capture_mode(spec) != capture_mode(previous):
            message = (
                "the camera now captures differently (configuration reload); "
                "submit the capture again"
            )
            self._fail(spec.instance, BACKLOG, ErrorCode.DEVICE_UNAVAILABLE, message)
        held = self._hold(session)
        try:
            self.ptz_stops.stop_now(spec.instance)
            old = session.restart(spec, backend)
        finally:
            self._release(session, held)
        if old is not None:
            old.close()
        if spec.enabled:
            self._dispatch(session)

    def _remove(self, instance: str) -> None:
        session = self.sessions.get(instance)
        message = "the camera was removed by a configuration reload"
        self._fail(instance, BACKLOG, ErrorCode.NO_SUCH_INSTANCE, message)
        held = self._hold(session)
        try:
            self.ptz_stops.stop_now(instance)
            self.sessions.remove(instance)
            queue = self.pending.queues.pop(instance)
            queue.close()
        finally:
            self._release(session, held)
        self._dispatchers.pop(instance, None)
        if session.backend is not None:
            session.backend.close()

    def _stop_schedules(self) -> None:
        self._schedule_stop.set()
        if self._schedule_thread is not None:
            self._schedule_thread.join(RESTART_WAIT_S)

    def _start_schedules(self) -> None:
        # Rebuilt from the cameras now configured; each counts its periods from the reload.
        self._schedule_stop = threading.Event()
        self._schedules = Schedules(
            self.sessions, self.admission, self._metrics, self._schedule_stop, self.announcer
        )
        self._schedule_thread = None
        if self._schedules.configured and not self._stopping.is_set():
            self._schedule_thread = self._spawn("camera-schedules", self._schedules.run)

    def drain(self) -> None:
        """Fails the backlog with COMPONENT_STOPPING and lets in-flight captures finish."""
        # What still runs after DRAIN_WAIT_S becomes INTERRUPTED at the next start.
        self._stopping.set()
        self._schedule_stop.set()
        self._storage_watch.stop()
        self.outcomes.stop_backlog()
        self.outcomes.abandon(self.pending.wait_idle(DRAIN_WAIT_S))
        self.pending.wake_dispatchers()
        self.ptz_stops.close()
        self.discovery.close()
        self.announcer.close()
        self.sessions.close()

    def close(self) -> None:
        """Closes the catalog, after `drain` and after everything that reads it stopped."""
        self.catalog.close()

    @property
    def stopping(self) -> bool:
        """True once drain has begun."""
        return self._stopping.is_set()


def _changed_sections(old: CameraSettings, new: CameraSettings) -> list[str]:
    """The sections beside the cameras that a reload changed, by their configuration key."""
    pairs = (
        ("captureProfiles", old.profiles, new.profiles),
        ("limits", old.limits, new.limits),
        ("storage", old.storage, new.storage),
        ("catalog", old.retention, new.retention),
        (
            "global",
            (old.job_terminal_ms, old.capture_lifecycle_events, old.max_queued_events),
            (new.job_terminal_ms, new.capture_lifecycle_events, new.max_queued_events),
        ),
    )
    return [name for name, before, after in pairs if before != after]
