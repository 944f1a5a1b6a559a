"""Directory watching with Linux inotify (through ctypes), for mounted configuration.

The watcher thread blocks in ``poll(2)`` on the inotify descriptor and a wake-up pipe; it
never wakes on a timer, so an unchanged directory costs no CPU. It watches the directory,
not the file, because an orchestrator's config mount swaps a ``..data`` symlink atomically
(``..data_tmp`` renamed over ``..data``) and never writes the document in place.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["DirectoryWatcher", "inotify_available"]

_log = logging.getLogger(__name__)

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)

# IN_MODIFY is left out on purpose: a file still being written would be read half done;
# its IN_CLOSE_WRITE follows when it is complete.
_MASK = (
    IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; the name follows
_READ_SIZE = 64 * 1024


class _Libc:
    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.init1 = lib.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch = lib.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int


_libc: _Libc | None = None


def _load_libc() -> _Libc:
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "watching a directory needs Linux inotify")
        _libc = _Libc()
    return _libc


def inotify_available() -> bool:
    """True when this system has inotify (Linux)."""
    try:
        _load_libc()
    except (OSError, AttributeError):
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
        self._inotify = -1
        self._wake_r = -1
        self._wake_w = -1
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._close_on_exit = False
        # How many times the thread left poll(2): it stays put while nothing changes.
        self.wakeups = 0

    def start(self) -> DirectoryWatcher:
        """Starts watching; raises OSError if the directory cannot be watched."""
        libc = _load_libc()
        fd = libc.init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        wd = libc.add_watch(fd, os.fsencode(self.directory), _MASK)
        if wd < 0:
            code = ctypes.get_errno()
            os.close(fd)
            raise OSError(code, f"cannot watch {self.directory}: {os.strerror(code)}")
        self._inotify = fd
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
        for fd in (self._inotify, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._inotify = self._wake_r = self._wake_w = -1

    def __enter__(self) -> DirectoryWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._inotify, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._closed.is_set():
                ready = poller.poll()  # no timeout: sleeps until an event or close()
                self.wakeups += 1
                if self._closed.is_set() or any(fd == self._wake_r for fd, _ in ready):
                    break
                relevant, gone = self._drain()
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

    def _drain(self) -> tuple[bool, bool]:
        relevant = False
        gone = False
        while True:
            try:
                data = os.read(self._inotify, _READ_SIZE)
            except BlockingIOError:
                return relevant, gone
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    gone = True
                elif mask & IN_Q_OVERFLOW:
                    relevant = True  # events were lost: re-read to be sure
                elif mask & IN_CREATE and not mask & IN_ISDIR and not self._is_link(name):
                    # A new regular file is empty until written; IN_CLOSE_WRITE follows.
                    # A new directory has no such follow-up: a recursive watcher (the
                    # egress) must hear of it to watch it before files land in it.
                    continue
                else:
                    relevant = True

    def _is_link(self, name: bytes) -> bool:
        return os.path.islink(os.path.join(os.fsencode(self.directory), name))

    def _notify(self) -> None:
        try:
            self._on_change()
        except Exception:
            _log.exception("configuration change handler failed")
