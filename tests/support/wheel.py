"""The built wheel (`make wheel` leaves it in dist/) and the wheelhouse of its dependencies
that installs it without an index, shared by tests/test_wheel.py and tests/edge/test_deploy.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

ROOT = Path(__file__).resolve().parents[2]
#: Where `make wheel` leaves the wheel and the sdist (UNSKIT_DIST for another folder).
DIST = Path(os.environ.get("UNSKIT_DIST", ROOT / "dist"))
#: Sources a wheel older than is stale (caches and bytecode excluded).
SOURCES = ("python/**/*.py", "python/**/*.json", "rust/**/*.rs", "Cargo.toml", "pyproject.toml")


def built(pattern: str) -> Path:
    """The one file of `pattern` in DIST, asserted newer than every source."""
    found = sorted(DIST.glob(pattern))
    assert len(found) == 1, f"one {pattern} expected in {DIST} (`make wheel` builds it): {found}"
    made = found[0].stat().st_mtime
    newer = [p for g in SOURCES for p in ROOT.glob(g) if p.stat().st_mtime > made]
    assert not newer, f"{found[0]} is older than {newer[:3]}: run `make wheel`"
    return found[0]


@contextlib.contextmanager
def wheelhouse() -> Iterator[Path]:
    """The wheels of the dependencies, kept between runs (the index is asked only for what is
    missing), locked against another run filling it at the same time."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "unskit-tests" / "wheelhouse"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pip(env: dict[str, str], cwd: Path, *args: str) -> Callable[..., CompletedProcess[str]]:
    """The development environment's pip with `args`; call it with the rest."""

    def run(*more: str) -> CompletedProcess[str]:
        command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
        return subprocess.run(
            [*command, *more], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
        )

    return run


def fill_wheelhouse(folder: Path, requirement: str, env: dict[str, str], cwd: Path) -> None:
    """Fetches what `requirement` needs and `folder` lacks (the first run, a new pin): the one
    time a test asks the index. Our own wheel, which pip copies too, is removed."""
    fetched = pip(env, cwd, "download", "--dest", str(folder))(requirement)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    for ours in folder.glob("unskit-*"):
        ours.unlink()
