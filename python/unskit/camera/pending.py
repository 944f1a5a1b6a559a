"""Pending captures: every non-terminal capture held in memory (its deadline, held replies,
abandon flag and frame memory), the groups still waiting for members, each camera's dispatch
queue and the in-flight frame budget.

One lock guards the table, the budget and the deadlines; each dispatch queue has its own
condition, and a capture's terminal transition its own lock.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from unskit.camera.backends import Acquired
from unskit.camera.catalog import GroupRecord
from unskit.camera.codec import Thumbnail
from unskit.camera.config import Limits, ProfileSpec
from unskit.camera.jobs import IN_FLIGHT, Job, JobState
from unskit.errors import CaptureError

__all__ = ["DispatchQueue", "PendingCapture", "PendingCaptures", "PendingGroup"]

#: A reply held until a capture (or a whole group) is terminal.
Reply = Future[Mapping[str, Any]]


@dataclass
class PendingCapture:
    """A non-terminal job held in memory with what its pipeline measured."""

    job: Job
    #: The frame memory this capture needs while in flight (an estimate: width x height x 3).
    frame_bytes: int
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    abandon: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    #: Whether frame_bytes is counted in the in-flight budget right now.
    holding: bool = False
    waiters: list[Reply] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    thumbnail: Thumbnail | None = None
    #: The body's `freshness` object, once the frame was judged.
    freshness: Mapping[str, Any] | None = None
    #: The profile as it was at admission (a reload applies profile changes to new captures).
    profile: ProfileSpec | None = None
    #: The monotonic instant the capture was requested (accepted): a frame is fresh for it
    #: only if it arrived after this, or within the camera's maxFrameAgeMs before it.
    requested: float = field(default_factory=time.monotonic)
    #: The last frame the capture acquired, and how long before `requested` it arrived
    #: (0 when after): every terminal body where a frame was seen carries both.
    frame: Acquired | None = None
    frame_age_ms: int | None = None
    #: Why the last frame was refused while `freshness: require` waits for a fresher one;
    #: the failure if none comes before the deadline.
    rejected: CaptureError | None = None


@dataclass
class PendingGroup:
    """A capture group with members not yet terminal, and the replies held for it."""

    record: GroupRecord
    remaining: set[str]
    waiters: list[Reply] = field(default_factory=list)


class DispatchQueue:
    """One camera's dispatcher queue: its QUEUED captures, oldest first."""

    def __init__(self) -> None:
        self._queue: deque[PendingCapture] = deque()
        self._ready = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, capture: PendingCapture) -> int:
        """Appends a capture and wakes the dispatcher; its one-based queue position."""
        with self._ready:
            self._queue.append(capture)
            position = len(self._queue)
            self._ready.notify()
        return position

    def take(self, stopping: threading.Event) -> PendingCapture | None:
        """The oldest capture, waiting for one; None once stopping and empty."""
        with self._ready:
            while not self._queue and not stopping.is_set() and not self._closed:
                self._ready.wait()
            if self._closed or (stopping.is_set() and not self._queue):
                return None
            return self._queue.popleft()

    def close(self) -> None:
        """Ends the dispatcher's loop (its camera was removed by a reload)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def remove(self, capture: PendingCapture) -> None:
        """Takes a capture out if it is still queued."""
        with self._ready, contextlib.suppress(ValueError):
            self._queue.remove(capture)

    def wake(self) -> None:
        """Wakes the dispatcher (to see the stop)."""
        with self._ready:
            self._ready.notify_all()


class PendingCaptures:
    """The in-memory table of pending captures, against limits.maxInFlightBytes."""

    def __init__(self, limits: Limits, instances: Iterable[str]) -> None:
        #: Replaced by a reload; read at each check.
        self.limits = limits
        #: Admission holds this while it checks the ceilings and commits the jobs.
        self.lock = threading.Lock()
        self._captures: dict[str, PendingCapture] = {}
        self._groups: dict[str, PendingGroup] = {}
        # Frame memory of the captures in flight (ACQUIRING to PERSISTING); queued captures
        # hold none and wait for room.
        self._in_flight_bytes = 0
        self._budget = threading.Condition(self.lock)
        self._deadlines: list[tuple[float, str]] = []
        self._deadline_ready = threading.Condition(self.lock)
        self._idle = threading.Condition(self.lock)
        self.queues = {instance: DispatchQueue() for instance in instances}

    # -- admission (the caller holds self.lock) -----------------------------------------------

    @property
    def count_locked(self) -> int:
        """How many captures are pending."""
        return len(self._captures)

    @property
    def in_flight_bytes_locked(self) -> int:
        """Frame memory held by the captures in flight."""
        return self._in_flight_bytes

    def add_locked(self, captures: Iterable[PendingCapture], group: GroupRecord | None) -> None:
        """Registers admitted captures (and their group) and arms their deadlines."""
        ids = set()
        for capture in captures:
            capture_id = capture.job.capture_id
            self._captures[capture_id] = capture
            heapq.heappush(self._deadlines, (capture.deadline, capture_id))
            ids.add(capture_id)
        if group is not None:
            self._groups[group.group_id] = PendingGroup(group, ids)
        self._deadline_ready.notify_all()

    # -- held replies -------------------------------------------------------------------------

    def hold_reply(self, capture_id: str, future: Reply) -> bool:
        """Holds `future` until the capture is terminal; False if it is not pending."""
        with self.lock:
            capture = self._captures.get(capture_id)
            if capture is None:
                return False
            capture.waiters.append(future)
            return True

    def hold_group_reply(self, group_id: str, future: Reply) -> bool:
        """Holds `future` until every member is terminal; False if none is pending."""
        with self.lock:
            group = self._groups.get(group_id)
            if group is None:
                return False
            group.waiters.append(future)
            return True

    # -- lookups ------------------------------------------------------------------------------

    def get(self, capture_id: str) -> PendingCapture | None:
        """The pending capture, or None once terminal."""
        with self.lock:
            return self._captures.get(capture_id)

    def in_states(
        self, states: Iterable[JobState], camera: str | None = None
    ) -> list[PendingCapture]:
        """Pending captures in `states` (of one camera when given)."""
        wanted = set(states)
        with self.lock:
            return [
                c
                for c in self._captures.values()
                if c.job.state in wanted and (camera is None or c.job.camera == camera)
            ]

    def ids(self, instance: str | None, states: Iterable[JobState]) -> list[str]:
        """captureIds of pending captures in `states` (of one camera when given)."""
        wanted = set(states)
        with self.lock:
            return [
                capture_id
                for capture_id, capture in self._captures.items()
                if capture.job.state in wanted
                and (instance is None or capture.job.camera == instance)
            ]

    def usage(self) -> tuple[int, int]:
        """(captures in flight, frame bytes they hold)."""
        with self.lock:
            in_flight = sum(c.job.state in IN_FLIGHT for c in self._captures.values())
            return in_flight, self._in_flight_bytes

    # -- the frame budget ---------------------------------------------------------------------

    def hold_budget(self, capture: PendingCapture, stopping: threading.Event) -> bool:
        """Waits until the capture's frame fits limits.maxInFlightBytes (or its deadline)."""
        with self.lock:
            limit = self.limits.max_in_flight_bytes
            while self._in_flight_bytes + capture.frame_bytes > limit:
                remaining = capture.deadline - time.monotonic()
                if capture.done or remaining <= 0 or stopping.is_set():
                    return False
                self._budget.wait(remaining)
            if capture.done:
                return False
            self._in_flight_bytes += capture.frame_bytes
            capture.holding = True
            return True

    def release(self, capture: PendingCapture) -> PendingGroup | None:
        """Forgets a terminal capture and frees its frame memory; its group if now complete."""
        job = capture.job
        complete: PendingGroup | None = None
        with self.lock:
            self._captures.pop(job.capture_id, None)
            if capture.holding:
                self._in_flight_bytes -= capture.frame_bytes
                capture.holding = False
            # Also wakes a capture that waited for room and was cancelled meanwhile.
            self._budget.notify_all()
            if job.group_id is not None:
                group = self._groups.get(job.group_id)
                if group is not None:
                    group.remaining.discard(job.capture_id)
                    if not group.remaining:
                        complete = self._groups.pop(job.group_id)
            self._idle.notify_all()
        return complete

    # -- deadlines and stopping ---------------------------------------------------------------

    def wait_expired(self) -> list[PendingCapture]:
        """The pending captures past their deadline; waits for the next one when none is."""
        expired: list[PendingCapture] = []
        with self.lock:
            now = time.monotonic()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, capture_id = heapq.heappop(self._deadlines)
                capture = self._captures.get(capture_id)
                if capture is not None:
                    expired.append(capture)
            if not expired:
                wait = self._deadlines[0][0] - now if self._deadlines else None
                self._deadline_ready.wait(wait)
        return expired

    def wait_idle(self, timeout_s: float) -> list[PendingCapture]:
        """Waits up to `timeout_s` for every capture to settle; those still pending."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while self._captures and time.monotonic() < deadline:
                self._idle.wait(max(deadline - time.monotonic(), 0.0))
            # The watchdog and captures waiting for room see the stop.
            self._deadline_ready.notify_all()
            self._budget.notify_all()
            return list(self._captures.values())

    def wake_dispatchers(self) -> None:
        """Wakes every camera's dispatcher (to see the stop)."""
        for queue in self.queues.values():
            queue.wake()
