"""Directory watching with Linux inotify (through ``inotify_simple``), for mounted configuration.

The watcher thread blocks in ``poll(2)`` on the inotify descriptor and a wake-up pipe; it
never wakes on a timer, so an unchanged directory costs no CPU. It watches the directory,
not the file, because an orchestrator's config mount swaps a ``..data`` symlink atomically
(``..data_tmp`` renamed over ``..data``) and never writes the document in place.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import select
import sys
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["DirectoryWatcher", "inotify_available"]

_log = logging.getLogger(__name__)

if sys.platform.startswith("linux"):
    from inotify_simple import INotify, flags

    # IN_MODIFY is left out on purpose: a file still being written would be read half done;
    # its IN_CLOSE_WRITE follows when it is complete.
    _MASK = (
        flags.ATTRIB
        | flags.CLOSE_WRITE
        | flags.MOVED_FROM
        | flags.MOVED_TO
        | flags.CREATE
        | flags.DELETE
        | flags.DELETE_SELF
        | flags.MOVE_SELF
        | flags.ONLYDIR
    )
else:  # pragma: no cover - inotify_simple is a Linux-only dependency
    INotify = None


@functools.cache
def inotify_available() -> bool:
    """True when this system has inotify (Linux)."""
    if INotify is None:
        return False
    # One descriptor opened and closed: the binding finds and loads libc on first use.
    try:
        INotify().close()
    except OSError:
        return False
    return True


class DirectoryWatcher:
    """Calls `on_change` (on its own thread) after each batch of changes in one directory."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        on_change: Callable[[], None],
        *,
        name: str = "unskit-config-watch",
    ) -> None:
        self.directory = Path(directory)
        self._on_change = on_change
        self._name = name
        self._thread: threading.Thread | None = None
        self._inotify: INotify | None = None
        self._wake_r = -1
        self._wake_w = -1
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._close_on_exit = False
        # How many times the thread left poll(2): it stays put while nothing changes.
        self.wakeups = 0

    def start(self) -> DirectoryWatcher:
        """Starts watching; raises OSError if the directory cannot be watched."""
        if INotify is None:
            raise OSError(errno.ENOSYS, "watching a directory needs Linux inotify")
        inotify = INotify(nonblocking=True)
        try:
            inotify.add_watch(self.directory, _MASK)
        except OSError as exc:
            inotify.close()
            raise OSError(
                exc.errno, f"cannot watch {self.directory}: {os.strerror(exc.errno or 0)}"
            ) from exc
        self._inotify = inotify
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    @property
    def native_id(self) -> int | None:
        """The watcher thread's OS thread id (for CPU-time checks)."""
        return None if self._thread is None else self._thread.native_id

    @property
    def ident(self) -> int | None:
        """The watcher thread's Python thread id."""
        return None if self._thread is None else self._thread.ident

    def close(self) -> None:
        """Stops the thread and releases the descriptors; idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            thread = self._thread
            if thread is None:
                return
            # The descriptors stay open until the thread is done with them, so the wake-up
            # write can never land in a reused descriptor number.
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
            if thread is threading.current_thread():
                self._close_on_exit = True  # called from a change handler: cannot join
                return
        thread.join(timeout=5)
        if not thread.is_alive():
            self._release()

    def _release(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._inotify = None
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> DirectoryWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        assert self._inotify is not None
        inotify = self._inotify
        poller = select.poll()
        poller.register(inotify.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._closed.is_set():
                ready = poller.poll()  # no timeout: sleeps until an event or close()
                self.wakeups += 1
                if self._closed.is_set() or any(fd == self._wake_r for fd, _ in ready):
                    break
                relevant, gone = self._drain(inotify)
                if relevant:
                    self._notify()
                if gone:
                    _log.error(
                        "config directory %s was removed or moved; no longer watching it",
                        self.directory,
                    )
                    break
        finally:
            with self._lock:
                if self._close_on_exit:
                    self._release()

    def _drain(self, inotify: INotify) -> tuple[bool, bool]:
        relevant = False
        gone = False
        while True:
            # timeout=0: read what is queued now; poll(2) above did the waiting.
            events = inotify.read(timeout=0)
            if not events:
                return relevant, gone
            for event in events:
                mask = event.mask
                if mask & (flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED):
                    gone = True
                elif mask & flags.Q_OVERFLOW:
                    relevant = True  # events were lost: re-read to be sure
                elif (
                    mask & flags.CREATE and not mask & flags.ISDIR and not self._is_link(event.name)
                ):
                    # A new regular file is empty until written; IN_CLOSE_WRITE follows.
                    # A new directory has no such follow-up: a recursive watcher (the
                    # egress) must hear of it to watch it before files land in it.
                    continue
                else:
                    relevant = True

    def _is_link(self, name: str) -> bool:
        return os.path.islink(os.path.join(self.directory, name))

    def _notify(self) -> None:
        try:
            self._on_change()
        except Exception:
            _log.exception("configuration change handler failed")
