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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from unskit.camera.admission import Admission
from unskit.camera.announcements import Announcer
from unskit.camera.backends import Backend, create_backend
from unskit.camera.catalog import Catalog
from unskit.camera.config import CameraSettings, CameraSpec
from unskit.camera.discovery import Discovery
from unskit.camera.outcomes import Outcomes
from unskit.camera.pending import PendingCaptures
from unskit.camera.pipeline import CapturePipeline
from unskit.camera.ptz import PtzStops
from unskit.camera.queries import CatalogQueries
from unskit.camera.queues import QueueAdministration
from unskit.camera.schedules import Schedules
from unskit.camera.sessions import CameraSessions
from unskit.camera.storage import Storage
from unskit.config.secrets import SecretResolver
from unskit.envelope import EnvelopeStamp
from unskit.messaging import MessagingClient
from unskit.runtime.events import Events
from unskit.runtime.metrics import MetricsRegistry
from unskit.topics import TopicScope

__all__ = ["CameraService"]

# In-flight work a drain waits for before it leaves the rest to restart recovery.
DRAIN_WAIT_S = 5.0


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
            return create_backend(spec.backend, spec.connection, secrets)

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
        )
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
            stopping=self._stopping,
            ipc=ipc,
        )
        self._schedules = Schedules(
            self.sessions, self.admission, metrics, self._stopping, announcer
        )

    def start(self) -> None:
        """Recovers what the previous run left, then starts dispatchers, watchdog, schedules."""
        self.outcomes.recover()
        for session in self.sessions:
            if session.spec.enabled:
                self._spawn(f"camera-{session.instance}", self._pipeline.dispatch, session)
        self._spawn("camera-deadlines", self.outcomes.watch_deadlines, self._stopping)
        if self._schedules.configured:
            self._spawn("camera-schedules", self._schedules.run)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def drain(self) -> None:
        """Fails the backlog with COMPONENT_STOPPING and lets in-flight captures finish."""
        # What still runs after DRAIN_WAIT_S becomes INTERRUPTED at the next start.
        self._stopping.set()
        self.outcomes.stop_backlog()
        self.outcomes.abandon(self.pending.wait_idle(DRAIN_WAIT_S))
        self.pending.wake_dispatchers()
        self.ptz_stops.close()
        self.discovery.close()
        self.sessions.close()
        self.catalog.close()

    @property
    def stopping(self) -> bool:
        """True once drain has begun."""
        return self._stopping.is_set()
