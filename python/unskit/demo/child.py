"""A demo process: `python -m unskit.demo.child SUPERVISOR_PID [--demo DIR] run NAME ...`.

`--demo DIR` only names the demo's output folder on the command line, so `ps` (and the
demo's own tests) can tell which demo a process belongs to, a device like `opcua-sim` too.

It asks the kernel for SIGTERM when its supervisor dies (Linux PR_SET_PDEATHSIG), then runs
the `unskit` command line with the remaining arguments. Doing this in the child, before the
component starts, needs no `preexec_fn` (which may deadlock in a process with threads, as the
supervisor is: its broker and live view run on threads). The signal follows the *thread* that
forked the child, so the supervisor starts its components from its main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent", "main"]

#: From <linux/prctl.h>.
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> bool:
    """Asks for `sig` when `parent` dies; exits at once if it is already gone. False when the
    platform has no parent-death signal (not Linux): the supervisor's own stop path remains."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0) != 0:
        return False
    # The supervisor may have died between our fork and the prctl: then no signal will come,
    # and we were re-parented (to init or a subreaper).
    if os.getppid() != parent:
        sys.exit(f"unskit demo: the supervisor (pid {parent}) is gone; not starting")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Arms the parent-death signal, then runs `unskit` with the rest of the arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].isdigit():
        usage = "usage: python -m unskit.demo.child SUPERVISOR_PID [--demo DIR] COMMAND ..."
        print(usage, file=sys.stderr)
        return 2
    die_with_parent(int(args[0]))
    if args[1:2] == ["--demo"]:
        args = [args[0], *args[3:]]
    from unskit.cli import main as unskit_main  # after the prctl: the import takes a while

    return unskit_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
