"""The egress pipeline: per instance, a scanner that queues settled source files
(discovery), one worker per destination that delivers them (worker), the record of each
attempt's outcome and its retry schedule (outcomes), and what becomes of the source
(lifecycle): a file completes (source deleted or archived) only once every destination
has delivered and verified it. This module composes them and is what the component and
`unskit egress send` talk to."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from unskit.config.secrets import SecretResolver
from unskit.egress.backends import Backend, open_backend
from unskit.egress.config import EgressSettings, InstanceSpec
from unskit.egress.context import EventSink, InstanceContext, ProgressSink, no_events
from unskit.egress.discovery import SourceScanner
from unskit.egress.lifecycle import SourceLifecycle
from unskit.egress.outcomes import DeliveryOutcomes
from unskit.egress.state import DeliveryState, EgressState
from unskit.egress.throttle import TokenBucket
from unskit.egress.worker import DeliveryClaims, DestinationWorker
from unskit.errors import ConfigError, ConfigIssue, UnskitError
from unskit.runtime.metrics import MetricsRegistry
from unskit.runtime.supervision import Supervisor

__all__ = ["EventSink", "InstancePipeline", "Pipeline", "ProgressSink"]

_log = logging.getLogger(__name__)

#: How many queued files sb/status lists per instance.
STATUS_QUEUE_LIMIT = 100


class InstancePipeline:
    """One instance: its source watch, its queue and its destination workers."""

    def __init__(
        self,
        spec: InstanceSpec,
        state: EgressState,
        *,
        metrics: MetricsRegistry,
        events: EventSink = no_events,
        secrets: SecretResolver | None = None,
        shared_buckets: tuple[TokenBucket, ...] = (),
        progress_interval_s: float = 1.0,
        progress: ProgressSink | None = None,
        watch: bool = True,
        files: Mapping[str, Path] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.spec = spec
        self.state = state
        self._context = InstanceContext(
            spec,
            state,
            metrics,
            events,
            files=dict(files) if files is not None else None,
            supervisor=supervisor,
        )
        # One backend (one connection) per worker: maxConcurrentFiles per destination.
        backends: list[list[Backend]] = []
        try:
            for dest in spec.destinations:
                backends.append([])
                for _ in range(dest.max_concurrent_files):
                    backends[-1].append(open_backend(dest.settings, secrets))
        except BaseException:
            for backend in (b for group in backends for b in group):
                backend.close()
            raise
        self._lifecycle = SourceLifecycle(
            self._context,
            {dest.id: group[0] for dest, group in zip(spec.destinations, backends, strict=True)},
        )
        outcomes = DeliveryOutcomes(
            self._context,
            self._lifecycle,
            progress=progress,
            progress_interval_s=progress_interval_s,
        )
        bucket = TokenBucket(spec.bandwidth)
        self.workers: list[DestinationWorker] = []
        for dest, group in zip(spec.destinations, backends, strict=True):
            claims = DeliveryClaims()
            buckets = (bucket, TokenBucket(dest.bandwidth), *shared_buckets)
            self.workers.extend(
                DestinationWorker(
                    self._context,
                    dest,
                    backend,
                    lifecycle=self._lifecycle,
                    outcomes=outcomes,
                    claims=claims,
                    buckets=buckets,
                    slot=slot,
                )
                for slot, backend in enumerate(group)
            )
        self._scanner = SourceScanner(self._context, self._lifecycle, watch=watch)

    @property
    def paused(self) -> bool:
        """Whether sb/pause holds this instance's transfers."""
        return self._context.paused

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> InstancePipeline:
        """Creates the source directory if missing, starts watching and delivering."""
        self.spec.source.path.mkdir(parents=True, exist_ok=True)
        dest_ids = [dest.id for dest in self.spec.destinations]
        for file in self.state.active_files(self.spec.id):
            self.state.ensure_destinations(file.id, dest_ids)
            # Verified everywhere before a crash (or a destination was removed from the
            # configuration): only the completion is left to do.
            self._lifecycle.complete_if_done(file)
        if self._context.files is None:
            self._scanner.start()
        else:
            self._scanner.submit(self._context.files)
        for worker in self.workers:
            worker.thread.start()
        return self

    def discard(self) -> None:
        """Releases a pipeline built but never started (a reload that was refused)."""
        for worker in self.workers:
            worker.backend.close()
        self._scanner.close()

    def request_stop(self) -> None:
        """Tells every thread to stop; transfers in flight stop at their next chunk."""
        self._context.halt.set()
        self._context.stopping.set()

    def stop(self) -> None:
        """Stops every thread; transfers in flight keep their recorded progress."""
        self.request_stop()
        self._context.notify()
        for worker in self.workers:
            if worker.thread.is_alive():
                worker.thread.join(30)
        self._scanner.close()
        for worker in self.workers:
            worker.backend.close()

    def pause(self) -> bool:
        """Holds every transfer of this instance (in-flight ones stop at the next chunk)."""
        ctx = self._context
        with ctx.lock:
            changed = not ctx.paused
            ctx.paused = True
            ctx.halt.set()
        return changed

    def resume(self) -> bool:
        """Lets transfers run again."""
        ctx = self._context
        with ctx.lock:
            changed = ctx.paused
            ctx.paused = False
            if not ctx.stopping.is_set():
                ctx.halt.clear()
        ctx.notify()
        return changed

    def retry(self, rel: str | None) -> list[str]:
        """Puts permanently failed deliveries back in the queue."""
        files = self.state.retry_failed(self.spec.id, rel)
        self._context.notify()
        return files

    # -- one-shot mode ---------------------------------------------------------------------

    def settled(self, rels: Collection[str]) -> dict[str, dict[str, str]]:
        """Per file, each destination's state, once no delivery of these files is still
        pending (one-shot mode); empty while any is."""
        result: dict[str, dict[str, str]] = {}
        for file in self.state.files_by_rel(self.spec.id, rels):
            states = {d.dest: d.state.value for d in self.state.deliveries(file.id)}
            if DeliveryState.PENDING.value in states.values():
                return {}
            result[file.rel] = states
        return result if set(result) == set(rels) else {}

    def wait_settled(self, rels: Collection[str]) -> dict[str, dict[str, str]]:
        """Blocks until `settled(rels)` has an answer and returns it."""
        wake = self._context.wake
        with wake:
            # Woken by every delivery, failure and completion: no polling.
            while not (outcome := self.settled(rels)):
                wake.wait()
        return outcome

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The sb/status view: queue and each file's per-destination state."""
        files = self.state.active_files(self.spec.id)
        sending: dict[str, list[str]] = {dest.id: [] for dest in self.spec.destinations}
        for worker in self.workers:
            current = worker.current
            if current is not None:
                sending[worker.spec.id].append(current)
        queue = []
        for file in files[:STATUS_QUEUE_LIMIT]:
            queue.append(
                {
                    "file": file.rel,
                    "size": file.size,
                    "discoveredAt": file.discovered_at,
                    "destinations": {
                        d.dest: {
                            "state": d.state.value,
                            "offset": d.offset,
                            "bytesSent": d.bytes_sent,
                            "attempts": d.attempts,
                            "lastError": d.last_error,
                            "nextAttemptAt": d.next_at or None,
                        }
                        for d in self.state.deliveries(file.id)
                    },
                }
            )
        return {
            "instance": self.spec.id,
            "paused": self.paused,
            "source": str(self.spec.source.path),
            "files": self.state.counts(self.spec.id),
            "destinations": [
                {
                    "id": dest.id,
                    "type": dest.type,
                    "sending": next(iter(sending[dest.id]), None),
                    "inFlight": sending[dest.id],
                    "maxConcurrentFiles": dest.max_concurrent_files,
                    "bandwidthBytesPerSec": dest.bandwidth,
                }
                for dest in self.spec.destinations
            ],
            "queue": queue,
            "queueTotal": len(files),
        }


class Pipeline:
    """Every instance of a file-egress configuration over one state store."""

    def __init__(
        self,
        settings: EgressSettings,
        state: EgressState,
        *,
        metrics: MetricsRegistry,
        events: EventSink = no_events,
        secrets: SecretResolver | None = None,
        progress: ProgressSink | None = None,
        watch: bool = True,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self._metrics = metrics
        self._supervisor = supervisor
        self._events = events
        self._progress = progress
        self._watch = watch
        self._shared = TokenBucket(settings.bandwidth)
        self.instances: dict[str, InstancePipeline] = self._build(settings.instances, secrets)

    def _build(
        self, specs: Iterable[InstanceSpec], secrets: SecretResolver | None
    ) -> dict[str, InstancePipeline]:
        """Builds (does not start) a pipeline per spec; on a failure none is left open."""
        built: dict[str, InstancePipeline] = {}
        try:
            for spec in specs:
                built[spec.id] = InstancePipeline(
                    spec,
                    self.state,
                    metrics=self._metrics,
                    events=self._events,
                    secrets=secrets,
                    shared_buckets=(self._shared,),
                    progress_interval_s=self.settings.progress_interval_s,
                    progress=self._progress,
                    supervisor=self._supervisor,
                    watch=self._watch,
                )
        except BaseException:
            for instance in built.values():
                instance.discard()
            raise
        return built

    def reconfigure(
        self, settings: EgressSettings, secrets: SecretResolver | None
    ) -> tuple[list[str], list[str], list[str]]:
        """Applies changed settings as one transaction at instance granularity: a changed
        or added instance (every one when `global` changed) starts on its new settings, a
        removed one stops, the others keep running and their pause. Every new pipeline is
        built before anything stops, so a candidate that cannot be built is refused whole
        (ConfigError) with nothing touched. Transfers stopped keep their progress and
        resume. Returns (started, stopped, kept) instance ids."""
        global_changed = dataclasses.replace(settings, instances=()) != dataclasses.replace(
            self.settings, instances=()
        )
        wanted = {spec.id: spec for spec in settings.instances}
        kept = [
            i
            for i, running in self.instances.items()
            if not global_changed and wanted.get(i) == running.spec
        ]
        removed = [i for i in self.instances if i not in wanted]
        plan = [spec for spec in settings.instances if spec.id not in kept]
        previous_settings, previous_shared = self.settings, self._shared
        self.settings = settings
        if global_changed:
            self._shared = TokenBucket(settings.bandwidth)
        try:
            built = self._build(plan, secrets)
        except (UnskitError, ValueError, OSError) as error:
            self.settings, self._shared = previous_settings, previous_shared
            raise ConfigError(
                [ConfigIssue("$.component.instances", f"cannot start: {error}")]
            ) from error
        except BaseException:
            self.settings, self._shared = previous_settings, previous_shared
            raise
        stopping = [self.instances[i] for i in self.instances if i not in kept]
        for instance in stopping:
            instance.request_stop()
        for instance in stopping:
            instance.stop()
        for instance in built.values():
            instance.start()
        running = {i: self.instances[i] for i in kept}
        self.instances = {
            spec.id: running.get(spec.id) or built[spec.id] for spec in settings.instances
        }
        return [spec.id for spec in plan], removed, kept

    def instance_ids(self) -> tuple[str, ...]:
        """The configured instance ids, in configuration order."""
        return tuple(self.instances)

    def instance(self, instance_id: str) -> InstancePipeline | None:
        """One instance by id; None if there is no such instance."""
        return self.instances.get(instance_id)

    def status(self) -> list[dict[str, Any]]:
        """Every instance's sb/status view, in configuration order."""
        return [instance.status() for instance in self.instances.values()]

    def start(self) -> Pipeline:
        """Prunes old records, then starts every instance."""
        pruned = self.state.prune(self.settings.retention_hours * 3600)
        if pruned:
            _log.info("forgot %d finished file records", pruned)
        for instance in self.instances.values():
            instance.start()
        return self

    def stop(self) -> None:
        """Stops every instance."""
        for instance in self.instances.values():
            instance.request_stop()
        for instance in self.instances.values():
            instance.stop()
