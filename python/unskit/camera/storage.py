"""Images and sidecars on disk: written under temporary names in ``{outputRoot}/.partial``,
hashed in the same pass, then renamed into ``{outputRoot}/{camera}/{YYYY-MM-DD}/``.

A rename within one file system is atomic, so an installed image is always complete; what a
crash leaves behind is only ever in ``.partial``, which start-up empties.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from unskit.camera.codec import write_hashed
from unskit.camera.config import StorageSpec
from unskit.commands.codes import ErrorCode
from unskit.errors import CaptureError
from unskit.files import fsync_directory

__all__ = ["PARTIAL_DIR", "Staged", "Storage"]

_log = logging.getLogger(__name__)

PARTIAL_DIR = ".partial"


@dataclass(frozen=True)
class Staged:
    """An image (and sidecar) written under temporary names, not yet installed."""

    image_temp: Path
    image_path: Path
    sidecar_temp: Path | None
    sidecar_path: Path | None
    relative_path: str
    sidecar_relative_path: str | None
    sha256: str
    size: int


class Storage:
    """The output tree of one camera adapter."""

    def __init__(self, spec: StorageSpec) -> None:
        self.spec = spec
        self.root = spec.output_root
        self.partial = self.root / PARTIAL_DIR

    def prepare(self) -> int:
        """Creates the roots and removes temporary files a previous run left; returns how many."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.spec.state_root.mkdir(parents=True, exist_ok=True)
        self.partial.mkdir(exist_ok=True)
        removed = 0
        for leftover in self.partial.iterdir():
            leftover.unlink(missing_ok=True)
            removed += 1
        if removed:
            _log.info("removed %d temporary files left by the previous run", removed)
        return removed

    def pressure(self) -> str | None:
        """Why new work must be refused (a root below its floor or unreadable), or None."""
        for label, root, floor in (
            ("output root", self.root, self.spec.output_min_free_bytes),
            ("state root", self.spec.state_root, self.spec.state_min_free_bytes),
        ):
            try:
                stats = os.statvfs(root)
            except OSError as error:
                return f"the {label} {root} cannot be read: {error.strerror}"
            free = stats.f_bavail * stats.f_frsize
            if free < floor:
                return f"the {label} {root} has {free} bytes free, below its floor of {floor}"
        return None

    def _relative(self, camera: str, capture_id: str, taken_ms: int, extension: str) -> str:
        day = datetime.fromtimestamp(taken_ms / 1000, timezone.utc).strftime("%Y-%m-%d")
        return f"{camera}/{day}/{capture_id}.{extension}"

    def remove_outputs(self, camera: str, capture_id: str, taken_ms: int) -> bool:
        """Removes what a capture installed without a committed SUCCEEDED; whether any was."""
        # A crash between the rename and the catalog commit leaves such files.
        found = False
        for extension in ("jpg", "json"):
            path = self.root / self._relative(camera, capture_id, taken_ms, extension)
            if path.exists():
                path.unlink()
                found = True
        return found

    def stage(
        self,
        camera: str,
        capture_id: str,
        data: bytes,
        extension: str,
        sidecar: dict[str, Any] | None,
        taken_ms: int,
    ) -> Staged:
        """Writes the image (hashed as it is written) and the sidecar to temporary names."""
        relative = self._relative(camera, capture_id, taken_ms, extension)
        image_temp = self.partial / f"{capture_id}.{extension}"
        try:
            sha256 = write_hashed(image_temp, data, self.spec.fsync)
            sidecar_temp = sidecar_path = None
            sidecar_relative = None
            if sidecar is not None:
                sidecar_relative = self._relative(camera, capture_id, taken_ms, "json")
                sidecar_temp = self.partial / f"{capture_id}.json"
                sidecar_path = self.root / sidecar_relative
                sidecar["image"]["sha256"] = sha256
                encoded = json.dumps(sidecar, indent=2, ensure_ascii=False).encode("utf-8")
                write_hashed(sidecar_temp, encoded, self.spec.fsync)
        except OSError as error:
            self._remove(image_temp, self.partial / f"{capture_id}.json")
            raise CaptureError(
                ErrorCode.PERSISTENCE_FAILED, "persistence", f"writing failed: {error}"
            ) from error
        return Staged(
            image_temp=image_temp,
            image_path=self.root / relative,
            sidecar_temp=sidecar_temp,
            sidecar_path=sidecar_path,
            relative_path=relative,
            sidecar_relative_path=sidecar_relative,
            sha256=sha256,
            size=len(data),
        )

    def install(self, staged: Staged) -> None:
        """Renames the sidecar, then the image, into place."""
        # The image last: once it exists, its sidecar does too.
        folder = staged.image_path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if staged.sidecar_temp is not None and staged.sidecar_path is not None:
                os.replace(staged.sidecar_temp, staged.sidecar_path)
            os.replace(staged.image_temp, staged.image_path)
            if self.spec.fsync:
                fsync_directory(folder)
        except OSError as error:
            self.discard(staged)
            raise CaptureError(
                ErrorCode.PERSISTENCE_FAILED, "persistence", f"installing failed: {error}"
            ) from error

    def discard(self, staged: Staged) -> None:
        """Removes what a staged (or half-installed) capture wrote."""
        self._remove(staged.image_temp, staged.sidecar_temp, staged.sidecar_path)
        if staged.image_path.exists():
            staged.image_path.unlink(missing_ok=True)

    @staticmethod
    def _remove(*paths: Path | None) -> None:
        for path in paths:
            if path is not None:
                path.unlink(missing_ok=True)
