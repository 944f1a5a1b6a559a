"""A destination's delivery workers: each takes the instance's next file due for that
destination that no other worker of the destination holds (`maxConcurrentFiles` workers,
each with its own backend connection), hands it to the backend under the throttle, and
turns what the backend raised into the outcome to record.

A worker never polls: it sleeps until a file is queued, a retry falls due, a file is
released by another worker, or the instance is resumed."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import PurePosixPath

from unskit.egress.backends import Backend, Transfer
from unskit.egress.config import DestinationSpec
from unskit.egress.context import InstanceContext
from unskit.egress.lifecycle import SourceLifecycle
from unskit.egress.outcomes import DeliveryOutcomes
from unskit.egress.records import DeliveryRecord, DeliveryState, FileRecord
from unskit.egress.throttle import Throttle, TokenBucket
from unskit.errors import (
    EgressError,
    SourceChangedError,
    TransferInterruptedError,
    UnsafePathError,
    VerificationError,
)
from unskit.runtime.supervision import Supervisor

__all__ = ["DeliveryClaims", "DestinationWorker"]

_log = logging.getLogger(__name__)


class DeliveryClaims:
    """The files a destination's workers hold: a file is sent by one worker at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[int] = set()

    def held(self) -> frozenset[int]:
        """The file ids being sent now."""
        with self._lock:
            return frozenset(self._held)

    def claim(self, file_id: int) -> bool:
        """Takes a file; False when another worker took it first."""
        with self._lock:
            if file_id in self._held:
                return False
            self._held.add(file_id)
            return True

    def release(self, file_id: int) -> None:
        """Gives a file back (sent, failed, interrupted or changed)."""
        with self._lock:
            self._held.discard(file_id)


class DestinationWorker:
    """One of a destination's workers: delivers its files one at a time."""

    def __init__(
        self,
        context: InstanceContext,
        spec: DestinationSpec,
        backend: Backend,
        *,
        lifecycle: SourceLifecycle,
        outcomes: DeliveryOutcomes,
        claims: DeliveryClaims,
        buckets: tuple[TokenBucket, ...],
        slot: int = 0,
    ) -> None:
        self.context = context
        self.spec = spec
        self.backend = backend
        self.lifecycle = lifecycle
        self.outcomes = outcomes
        self._claims = claims
        # The instance's, the destination's (shared by its workers) and the component's.
        self._buckets = list(buckets)
        #: The relative path being sent, if any (sb/status shows it).
        self.current: str | None = None
        # Supervised: a failure outside a transfer (the state database, a bug) is logged,
        # counted and the worker restarted, instead of the instance losing a worker unseen.
        supervisor = context.supervisor or Supervisor(context.metrics)
        self.thread = supervisor.thread(
            f"egress-{context.id}-{spec.id}-{slot}", self._run, context.stopping
        )

    def _run(self) -> None:
        ctx = self.context
        while not ctx.stopping.is_set():
            wait: float | None = None
            if not ctx.paused:
                due, wait = self._next_due()
                if due is not None:
                    file = due[0]
                    if self._claims.claim(file.id):
                        try:
                            # Read again under the claim: another worker may have sent it
                            # between the query and the claim.
                            delivery = self._still_due(file)
                            if delivery is not None:
                                self._deliver(file, delivery)
                        finally:
                            self._claims.release(file.id)
                            # A file this worker held may be due again for the others.
                            ctx.notify()
                    continue
            with ctx.wake:
                if ctx.stopping.is_set():
                    return
                ctx.wake.wait(wait)

    def _next_due(self) -> tuple[tuple[FileRecord, DeliveryRecord] | None, float | None]:
        now = time.time()
        due, later = self.context.state.next_due(
            self.context.id, self.spec.id, now, self._claims.held()
        )
        return due, None if later is None else max(later - now, 0.01)

    def _still_due(self, file: FileRecord) -> DeliveryRecord | None:
        delivery = self.context.state.delivery(file.id, self.spec.id)
        if delivery is None or delivery.state is not DeliveryState.PENDING:
            return None
        return delivery if delivery.next_at <= time.time() else None

    def _deliver(self, file: FileRecord, delivery: DeliveryRecord) -> None:
        ctx = self.context
        outcomes = self.outcomes
        if not self.lifecycle.unchanged(file):
            return
        journal = outcomes.journal(file, self.spec.id)
        transfer = Transfer(
            source=ctx.source_path(file.rel),
            relative=PurePosixPath(file.rel),
            size=file.size,
            mtime_ns=file.mtime_ns,
            offset=delivery.offset,
            upload_id=delivery.upload_id,
            parts=ctx.state.parts(file.id, self.spec.id),
            throttle=Throttle(self._buckets, ctx.halt),
            cancel=ctx.halt,
            journal=journal,
        )
        self.current = file.rel
        try:
            outcome = self.backend.deliver(transfer)
        except TransferInterruptedError:
            _log.info("%s -> %s: interrupted, progress kept", file.rel, self.spec.id)
            return
        except SourceChangedError as error:
            _log.warning("%s -> %s: %s; starting over", file.rel, self.spec.id, error)
            self.lifecycle.restart(file)
            return
        except VerificationError as error:
            ctx.state.reset_delivery(file.id, self.spec.id)
            self.backend.discard(transfer.relative, None)
            outcomes.failed_attempt(file, self.spec, str(error), verification=True)
            return
        except UnsafePathError as error:
            outcomes.failed_attempt(file, self.spec, str(error), permanent=True)
            return
        except EgressError as error:
            outcomes.failed_attempt(file, self.spec, str(error))
            return
        except Exception as error:  # a backend bug must not kill the worker thread
            _log.exception("%s -> %s: unexpected failure", file.rel, self.spec.id)
            outcomes.failed_attempt(file, self.spec, f"{type(error).__name__}: {error}")
            return
        finally:
            self.current = None
        outcomes.delivered(file, self.spec, outcome, journal)
