"""The egress backend interface: one backend per destination type, one SDK per module.

A backend delivers one file to one destination: it resumes from the progress the pipeline
recorded, reports new progress through the `Journal` as it goes, verifies the copy, and
raises an `EgressError` subclass when it cannot. Adding a backend (blobstore,
bucketstore) is a new module here and one line in `BACKENDS`.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from unskit import errors
from unskit.config.secrets import SecretResolver
from unskit.egress.records import Part
from unskit.egress.throttle import Throttle
from unskit.errors import ConfigError, ConfigIssue, SourceChangedError, UnsafePathError

__all__ = [
    "BACKENDS",
    "EXTRAS",
    "Backend",
    "BackendEntry",
    "Journal",
    "Outcome",
    "Transfer",
    "extra_installed",
    "missing_extra",
    "open_backend",
    "safe_relative",
    "safe_target",
]


class Journal(Protocol):
    """Where a backend records durable progress (committed before the call returns)."""

    def offset(self, offset: int) -> None:
        """Bytes 0..offset are at the destination (streamed backends)."""
        ...

    def upload(self, upload_id: str | None) -> None:
        """The multipart upload this delivery resumes into (None: none)."""
        ...

    def part(self, part: Part) -> None:
        """One part is uploaded."""
        ...

    def forget_part(self, number: int) -> None:
        """A recorded part is not at the destination as recorded."""
        ...

    def sent(self, amount: int) -> None:
        """`amount` more bytes went out (progress only, not durable)."""
        ...


@dataclass
class Transfer:
    """One file to one destination, with the progress recorded so far."""

    source: Path
    relative: PurePosixPath
    size: int
    mtime_ns: int
    offset: int
    upload_id: str | None
    parts: Mapping[int, Part]
    throttle: Throttle
    cancel: threading.Event
    journal: Journal

    def check_source(self) -> None:
        """Raises SourceChangedError if the source's size or mtime is not as queued."""
        try:
            st = os.stat(self.source)
        except FileNotFoundError as exc:
            raise SourceChangedError(f"{self.relative} vanished while it was sent") from exc
        if st.st_size != self.size or st.st_mtime_ns != self.mtime_ns:
            raise SourceChangedError(
                f"{self.relative} changed while it was sent (size {self.size} -> "
                f"{st.st_size}, mtime_ns {self.mtime_ns} -> {st.st_mtime_ns})"
            )


@dataclass(frozen=True)
class Outcome:
    """What one successful delivery did."""

    resumed_from: int
    bytes_sent: int
    detail: Mapping[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """Delivers files to one configured destination."""

    def deliver(self, transfer: Transfer) -> Outcome:
        """Sends what is missing, verifies the whole copy; raises EgressError subclasses."""
        ...

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Removes partial remote state of an abandoned delivery (best effort)."""
        ...

    def close(self) -> None:
        """Releases connections."""
        ...


BackendFactory = Callable[[Mapping[str, Any], "SecretResolver | None"], Backend]


@dataclass(frozen=True)
class BackendEntry:
    """Where one backend lives and what it needs beyond the base install."""

    module: str
    cls: str
    extra: str | None = None  # the pip extra of its SDK (None: in the base install)
    sdk: str | None = None  # the module that extra provides
    secrets: bool = True  # whether the class takes (settings, secrets) or settings alone


#: Every backend this build knows, by its `type`; a new backend is one line here.
BACKENDS: Mapping[str, BackendEntry] = {
    "local": BackendEntry("unskit.egress.backends.local", "LocalBackend", secrets=False),
    "objectstore": BackendEntry(
        "unskit.egress.backends.objectstore", "ObjectStoreBackend", "egress", "boto3"
    ),
    "sftp": BackendEntry("unskit.egress.backends.sftp", "SftpBackend", "egress", "paramiko"),
    "ftps": BackendEntry("unskit.egress.backends.ftps", "FtpsBackend"),
    "http": BackendEntry("unskit.egress.backends.http", "HttpBackend", "http", "requests"),
    "bucketstore": BackendEntry(
        "unskit.egress.backends.bucketstore", "BucketStoreBackend", "bucketstore", "requests"
    ),
    "blobstore": BackendEntry(
        "unskit.egress.backends.blobstore", "BlobStoreBackend", "blobstore", "azure.storage.blob"
    ),
}

#: The optional extra and the module each SDK-backed backend needs beyond the base install.
EXTRAS: Mapping[str, tuple[str, str]] = {
    kind: (entry.extra, entry.sdk)
    for kind, entry in BACKENDS.items()
    if entry.extra is not None and entry.sdk is not None
}


def open_backend(
    settings: Mapping[str, Any], secrets: SecretResolver | None, path: str = "$"
) -> Backend:
    """The backend for one `egress` entry; ConfigError if this build has none for it."""
    kind = settings["type"]
    entry = BACKENDS.get(kind)
    if entry is None:
        raise ConfigError([ConfigIssue(f"{path}.type", f"backend {kind!r} is not in this build")])
    # Imported on first use: a local-only configuration never loads an SDK.
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        if entry.extra is None:
            raise
        raise ConfigError([ConfigIssue(f"{path}.type", missing_extra(kind))]) from exc
    factory = getattr(module, entry.cls)
    backend: Backend = factory(settings, secrets) if entry.secrets else factory(settings)
    return backend


def missing_extra(kind: str) -> str:
    """The refusal of a backend whose extra is not installed, with the pip command."""
    extra, module = EXTRAS[kind]
    return errors.missing_extra(f"backend {kind!r}", module, extra)


def extra_installed(kind: str) -> bool:
    """False when `kind` needs an optional extra whose SDK cannot be imported."""
    return kind not in EXTRAS or errors.extra_installed(EXTRAS[kind][1])


def safe_relative(text: str) -> PurePosixPath:
    """A source-relative path that cannot leave a destination root: no '..', not absolute."""
    relative = PurePosixPath(text)
    if not text or relative.is_absolute() or any(p in ("..", ".", "") for p in text.split("/")):
        raise UnsafePathError(f"{text!r} is not a plain relative path under the root")
    return relative


def safe_target(root: Path, relative: PurePosixPath) -> Path:
    """`root` joined with `relative`, refused if a symlink in the tree leads outside it."""
    relative = safe_relative(str(relative))
    target = root.joinpath(*relative.parts)
    real_root = os.path.realpath(root)
    real_parent = os.path.realpath(target.parent)
    if real_parent != real_root and not real_parent.startswith(real_root + os.sep):
        raise UnsafePathError(f"{relative} would be written outside {root} (through a symlink)")
    if os.path.islink(target):
        raise UnsafePathError(f"{target} is a symlink; refusing to write through it")
    return target
