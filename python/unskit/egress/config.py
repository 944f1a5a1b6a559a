"""The file-egress `component` section, parsed into instance and destination settings.

The schema refuses unknown keys and wrong types with their JSON path; the rules a schema
cannot say (unique ids, an archive directory for the archive action, kmsKeyId only with
aws:kms, a backend this build has) are checked here, also with their JSON path."""

from __future__ import annotations

import base64
import binascii
import functools
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from unskit.backoff import backoff_window
from unskit.config.model import ComponentConfig, thaw
from unskit.config.rules import directory_problem
from unskit.config.schema import load_schema
from unskit.egress.backends import extra_installed, missing_extra
from unskit.errors import ConfigError, ConfigIssue

__all__ = [
    "DEFAULT_MULTIPART_BYTES",
    "TOKEN",
    "DestinationSpec",
    "EgressSettings",
    "InstanceSpec",
    "RetryPolicy",
    "SourceSpec",
    "component_schema",
    "configuration_issues",
    "connection_string_key",
    "destination_spec",
    "parse_component",
    "parse_host_key",
]

TOKEN = "file-egress"
SCHEMA_FILE = "file-egress.schema.json"
DEFAULT_MULTIPART_BYTES = 8 * 1024 * 1024
DEFAULT_SETTLE_SECONDS = 5.0
DEFAULT_PROGRESS_INTERVAL_MS = 1000
DEFAULT_RETENTION_HOURS = 168.0
#: Files in flight per destination (issue 16): a second file goes while one waits on a
#: slow server, and two connections stay polite to it.
DEFAULT_MAX_CONCURRENT_FILES = 2
#: blobstore: files above thresholdBytes go as staged blocks of blockSizeBytes.
DEFAULT_BLOB_THRESHOLD_BYTES = 8 * 1024 * 1024
DEFAULT_BLOB_BLOCK_BYTES = 8 * 1024 * 1024


@functools.cache
def component_schema() -> Mapping[str, Any]:
    """The `component` section's JSON Schema (a data file shipped with the package)."""
    return load_schema(SCHEMA_FILE)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff between attempts; after maxAttempts a delivery fails for good."""

    initial_backoff_ms: int = 1000
    max_backoff_ms: int = 300_000
    max_attempts: int = 10

    def backoff_seconds(self, attempts: int) -> float:
        """Delay before attempt `attempts + 1`: doubling from the initial value, capped."""
        # Deliveries retry on a fixed schedule, without jitter: the window itself.
        return backoff_window(self.initial_backoff_ms, self.max_backoff_ms, attempts - 1) / 1000


@dataclass(frozen=True)
class SourceSpec:
    path: Path
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    recursive: bool = True
    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    completion_marker: str | None = None


@dataclass(frozen=True)
class DestinationSpec:
    """One entry of an instance's `egress` list; `settings` is the entry as written."""

    id: str
    type: str
    bandwidth: int
    settings: Mapping[str, Any] = field(repr=False)
    #: Files sent to this destination at once, each by its own worker and connection.
    max_concurrent_files: int = DEFAULT_MAX_CONCURRENT_FILES


def destination_spec(entry: Mapping[str, Any], index: int) -> DestinationSpec:
    """The `index`th entry of an instance's egress list (schema-checked), typed."""
    return DestinationSpec(
        id=destination_id(entry, index),
        type=entry["type"],
        bandwidth=entry.get("bandwidthBytesPerSec", 0),
        settings=entry,
        max_concurrent_files=entry.get("maxConcurrentFiles", DEFAULT_MAX_CONCURRENT_FILES),
    )


@dataclass(frozen=True)
class InstanceSpec:
    id: str
    source: SourceSpec
    destinations: tuple[DestinationSpec, ...]
    archive_dir: Path | None
    bandwidth: int
    retry: RetryPolicy


@dataclass(frozen=True)
class EgressSettings:
    instances: tuple[InstanceSpec, ...]
    bandwidth: int
    progress_interval_s: float
    retention_hours: float
    state_dir: Path | None


def _retry(section: Mapping[str, Any], base: RetryPolicy) -> RetryPolicy:
    return RetryPolicy(
        initial_backoff_ms=section.get("initialBackoffMs", base.initial_backoff_ms),
        max_backoff_ms=section.get("maxBackoffMs", base.max_backoff_ms),
        max_attempts=section.get("maxAttempts", base.max_attempts),
    )


def parse_host_key(line: str) -> tuple[str, bytes]:
    """The key type and blob of a pinned host key line (`type base64`, optionally after a
    known_hosts host field); ValueError when it is not one."""
    fields = line.split()
    for index in range(len(fields) - 1):
        kind, text = fields[index], fields[index + 1]
        try:
            blob = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            continue
        # The blob starts with its own type name: a length-prefixed string.
        if len(blob) >= 4:
            (length,) = struct.unpack(">I", blob[:4])
            if blob[4 : 4 + length] == kind.encode():
                return kind, blob
    raise ValueError('not an SSH public key line ("ssh-ed25519 AAAA...")')


def destination_id(entry: Mapping[str, Any], index: int) -> str:
    """An entry's id, or ``{type}-{index + 1}`` when it sets none."""
    return str(entry.get("id") or f"{entry['type']}-{index + 1}")


def configuration_issues(config: ComponentConfig) -> list[ConfigIssue]:
    """The rules of the section a schema cannot say, each with its JSON path."""
    return list(_rules(thaw(config.component)))


def _rules(component: Mapping[str, Any]) -> Iterator[ConfigIssue]:
    ids: set[str] = set()
    # Directories the component creates at start: a file in the way is refused here, not a
    # traceback there. (A destination's path is not: it fails as a transfer, and the other
    # destinations still deliver.)
    directories = [("$.component.global.stateDir", (component.get("global") or {}).get("stateDir"))]
    for index, entry in enumerate(component.get("instances") or []):
        path = f"$.component.instances[{index}]"
        directories.append((f"{path}.source.path", entry["source"]["path"]))
        directories.append(
            (f"{path}.onComplete.archiveDir", (entry.get("onComplete") or {}).get("archiveDir"))
        )
        if entry["id"] in ids:
            yield ConfigIssue(f"{path}.id", f"duplicate instance id {entry['id']!r}")
        ids.add(entry["id"])
        source = Path(os.path.abspath(entry["source"]["path"]))
        on_complete = entry.get("onComplete") or {}
        action = on_complete.get("action", "delete")
        if action == "archive" and "archiveDir" not in on_complete:
            yield ConfigIssue(f"{path}.onComplete.archiveDir", "the archive action needs it")
        if action == "delete" and "archiveDir" in on_complete:
            yield ConfigIssue(f"{path}.onComplete.archiveDir", "applies to the archive action only")
        if "archiveDir" in on_complete:
            archive = Path(os.path.abspath(on_complete["archiveDir"]))
            if archive == source:
                yield ConfigIssue(
                    f"{path}.onComplete.archiveDir", "must differ from the source directory"
                )
        destination_ids: set[str] = set()
        for d, destination in enumerate(entry["egress"]):
            at = f"{path}.egress[{d}]"
            ident = destination_id(destination, d)
            if ident in destination_ids:
                yield ConfigIssue(f"{at}.id", f"duplicate egress id {ident!r} in this instance")
            destination_ids.add(ident)
            kind = destination["type"]
            if not extra_installed(kind):
                yield ConfigIssue(f"{at}.type", missing_extra(kind))
                continue
            if kind == "http":
                yield from _http_rules(destination, at)
            if kind == "local":
                root = Path(os.path.abspath(destination["path"]))
                if root == source or source in root.parents:
                    yield ConfigIssue(f"{at}.path", "must not lie inside the source directory")
            if kind == "sftp" and "hostKey" in destination:
                try:
                    parse_host_key(destination["hostKey"])
                except ValueError as error:
                    yield ConfigIssue(f"{at}.hostKey", str(error))
            if kind in ("sftp", "ftps"):
                bundle = "credentials" in destination
                for name in ("username", "password", "privateKey", "passphrase"):
                    if bundle and name in destination:
                        yield ConfigIssue(f"{at}.{name}", "not allowed with credentials")
                if not bundle and "username" not in destination:
                    yield ConfigIssue(f"{at}.username", "required without credentials")
            if kind == "bucketstore":
                yield from _bucketstore_rules(destination, at)
            if kind == "objectstore":
                if "kmsKeyId" in destination and destination.get("sse") != "aws:kms":
                    yield ConfigIssue(f"{at}.kmsKeyId", "applies only with sse aws:kms")
                multipart = destination.get("multipart") or {}
                threshold = multipart.get("thresholdBytes", DEFAULT_MULTIPART_BYTES)
                if threshold < multipart.get("partSizeBytes", 0):
                    yield ConfigIssue(
                        f"{at}.multipart.thresholdBytes", "must be at least partSizeBytes"
                    )
            if kind == "blobstore":
                yield from _blobstore_rules(destination, at)
    for at, directory in directories:
        if isinstance(directory, str) and (problem := directory_problem(directory)):
            yield ConfigIssue(at, f"cannot be a directory: {problem}")


def _blobstore_rules(destination: Mapping[str, Any], at: str) -> Iterator[ConfigIssue]:
    given = [k for k in ("accountKey", "connectionString", "credentials") if k in destination]
    for name in given[1:]:
        yield ConfigIssue(
            f"{at}.{name}",
            f"give one of accountKey, connectionString, credentials (already {given[0]})",
        )
    text = destination.get("connectionString")
    if isinstance(text, str) and not connection_string_key(text):
        yield ConfigIssue(f"{at}.connectionString", "holds no AccountKey=...")


def connection_string_key(text: str) -> str | None:
    """The AccountKey of an Azure Storage connection string (its only part that is used)."""
    for item in text.split(";"):
        name, _, value = item.strip().partition("=")
        if name.strip().lower() == "accountkey" and value.strip():
            return value.strip()
    return None


def _http_rules(destination: Mapping[str, Any], at: str) -> Iterator[ConfigIssue]:
    parts = urlsplit(destination["url"])
    if not parts.hostname:
        yield ConfigIssue(f"{at}.url", "has no host")
    if parts.username is not None or parts.password is not None:
        yield ConfigIssue(
            f"{at}.url", "must not carry credentials; use username and password or credentials"
        )
    if parts.fragment:
        yield ConfigIssue(f"{at}.url", "must not have a #fragment")
    bundle = "credentials" in destination
    for name in ("bearerToken", "username", "password"):
        if bundle and name in destination:
            yield ConfigIssue(f"{at}.{name}", "not allowed with credentials")
    if "bearerToken" in destination and "username" in destination:
        yield ConfigIssue(f"{at}.bearerToken", "not allowed with username (choose one)")
    if "password" in destination and "username" not in destination:
        yield ConfigIssue(f"{at}.username", "required with password")
    headers = {name.lower() for name in destination.get("headers") or {}}
    if "authorization" in headers and (
        bundle or "bearerToken" in destination or "username" in destination
    ):
        yield ConfigIssue(f"{at}.headers.Authorization", "conflicts with the credentials set")


def _bucketstore_rules(destination: Mapping[str, Any], at: str) -> Iterator[ConfigIssue]:
    given = [name for name in ("accessToken", "credentials") if name in destination]
    if destination.get("anonymous", False):
        for name in given:
            yield ConfigIssue(f"{at}.{name}", "not allowed with anonymous")
    elif not given:
        yield ConfigIssue(f"{at}.accessToken", "required unless credentials or anonymous is set")
    elif len(given) == 2:
        yield ConfigIssue(f"{at}.accessToken", "not allowed with credentials")


def parse_component(config: ComponentConfig) -> EgressSettings:
    """The settings of a schema-valid section; ConfigError lists every broken rule."""
    issues = configuration_issues(config)
    if issues:
        raise ConfigError(issues)
    component = thaw(config.component)
    global_section = component.get("global") or {}
    base_retry = _retry(global_section.get("retry") or {}, RetryPolicy())
    instances = []
    for entry in component["instances"]:
        source = entry["source"]
        on_complete = entry.get("onComplete") or {}
        archive = on_complete.get("archiveDir") if on_complete.get("action") == "archive" else None
        instances.append(
            InstanceSpec(
                id=entry["id"],
                source=SourceSpec(
                    path=Path(os.path.abspath(source["path"])),
                    include=tuple(source.get("include") or ("*",)),
                    exclude=tuple(source.get("exclude") or ()),
                    recursive=source.get("recursive", True),
                    settle_seconds=float(source.get("settleSeconds", DEFAULT_SETTLE_SECONDS)),
                    completion_marker=source.get("completionMarker"),
                ),
                destinations=tuple(
                    destination_spec(destination, index)
                    for index, destination in enumerate(entry["egress"])
                ),
                archive_dir=Path(os.path.abspath(archive)) if archive else None,
                bandwidth=entry.get("bandwidthBytesPerSec", 0),
                retry=_retry(entry.get("retry") or {}, base_retry),
            )
        )
    state_dir = global_section.get("stateDir")
    return EgressSettings(
        instances=tuple(instances),
        bandwidth=global_section.get("bandwidthBytesPerSec", 0),
        progress_interval_s=global_section.get("progressIntervalMs", DEFAULT_PROGRESS_INTERVAL_MS)
        / 1000,
        retention_hours=float(
            global_section.get("completedRetentionHours", DEFAULT_RETENTION_HOURS)
        ),
        state_dir=Path(state_dir) if state_dir else None,
    )
