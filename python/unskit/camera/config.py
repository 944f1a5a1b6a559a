"""The camera-adapter's `component` section, parsed into typed settings with the defaults of
docs/configuration.md applied. The schema checks shapes; `configuration_issues` checks what
a schema cannot say (unique instances, profiles that exist)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unskit.config.model import ComponentConfig, thaw
from unskit.config.schema import load_schema
from unskit.errors import ConfigError, ConfigIssue

__all__ = [
    "DEFAULT_PROFILE",
    "SCHEMA_FILE",
    "TOKEN",
    "CameraSettings",
    "CameraSpec",
    "CatalogRetention",
    "Limits",
    "ProfileSpec",
    "PtzSpec",
    "ScheduleSpec",
    "StorageSpec",
    "capture_mode",
    "component_schema",
    "configuration_issues",
    "parse_settings",
]

TOKEN = "camera-adapter"
SCHEMA_FILE = "camera-adapter.schema.json"
#: The profile every camera has unless the configuration defines its own of that name.
DEFAULT_PROFILE = "default"

DEFAULT_JOB_TERMINAL_MS = 30_000
DEFAULT_QUALITY = 90
MIB = 1024 * 1024
#: backend -> the captureMode its frames are reported with.
BACKEND_MODES = {
    "sim": "simulated",
    "snapshot-uri": "snapshot-uri",
    "rtsp-frame": "rtsp-frame",
    "onvif": "snapshot-uri",
}
#: How a capture profile treats a frame that is provably the previous capture's.
FRESHNESS_POLICIES = ("require", "warn", "off")
DEFAULT_FRESHNESS = "warn"
#: How long before its capture's request a frame may have arrived and still be fresh (a
#: stream's jitter and an HTTP header's one-second resolution stay inside it).
DEFAULT_MAX_FRAME_AGE_MS = 1_000
DEFAULT_MAX_QUEUED_EVENTS = 256
DEFAULT_STORAGE_CHECK_MS = 5_000


def capture_mode(spec: CameraSpec) -> str:
    """The captureMode a camera's frames are reported with (a sim camera may be triggered)."""
    if spec.backend == "sim":
        return str(spec.connection.get("captureMode", "simulated"))
    return BACKEND_MODES[spec.backend]


@functools.cache
def component_schema() -> Mapping[str, Any]:
    """The `component` section's JSON Schema (a data file shipped with the package)."""
    return load_schema(SCHEMA_FILE)


@dataclass(frozen=True)
class ProfileSpec:
    """A capture profile: how a frame becomes the stored image."""

    name: str
    capture_mode: str | None = None
    encoding: str = "jpeg"
    quality: int = DEFAULT_QUALITY
    store_as_received: bool = True
    timeout_ms: int | None = None
    thumbnail_size: str | None = None
    freshness: str = DEFAULT_FRESHNESS


@dataclass(frozen=True)
class ScheduleSpec:
    """A periodic capture of one camera."""

    id: str
    interval_ms: int
    capture_profile: str | None = None
    enabled: bool = True


#: The spec's bound on a continuous PTZ move, and the default of ptz.maximumContinuousMoveMs.
MAX_CONTINUOUS_MOVE_MS = 60_000


@dataclass(frozen=True)
class PtzSpec:
    """A camera's PTZ gates and bounds (ptz.*): off unless enabled."""

    enabled: bool = False
    allow_preset_mutation: bool = False
    maximum_continuous_move_ms: int = MAX_CONTINUOUS_MOVE_MS
    home: Mapping[str, float] = field(
        default_factory=lambda: {"pan": 0.0, "tilt": 0.0, "zoom": 0.0}
    )


@dataclass(frozen=True)
class CameraSpec:
    """One configured camera."""

    instance: str
    backend: str
    enabled: bool = True
    connection: Mapping[str, Any] = field(default_factory=dict)
    default_capture_profile: str = DEFAULT_PROFILE
    schedules: tuple[ScheduleSpec, ...] = ()
    ptz: PtzSpec = field(default_factory=PtzSpec)
    max_frame_age_ms: int = DEFAULT_MAX_FRAME_AGE_MS


@dataclass(frozen=True)
class Limits:
    """Admission ceilings (the defaults are decisions, see docs/decisions.md)."""

    max_metadata_bytes: int = 8192
    max_cameras_per_group: int = 16
    max_concurrent_captures: int = 4
    max_in_flight_bytes: int = 512 * MIB
    max_queued_captures_per_camera: int = 32
    max_pending_captures: int = 256


@dataclass(frozen=True)
class StorageSpec:
    """Where images, sidecars and the catalog live, and the free-space floors."""

    output_root: Path
    state_root: Path
    output_min_free_bytes: int = 64 * MIB
    state_min_free_bytes: int = 16 * MIB
    fsync: bool = True
    sidecar: bool = True
    check_interval_ms: int = DEFAULT_STORAGE_CHECK_MS


@dataclass(frozen=True)
class CatalogRetention:
    """How long terminal jobs stay in the catalog (the defaults are decisions)."""

    max_terminal_jobs: int = 10_000
    max_age_hours: float = 168.0

    @property
    def max_age_ms(self) -> int:
        """`max_age_hours` in milliseconds."""
        return int(self.max_age_hours * 3_600_000)


@dataclass(frozen=True)
class CameraSettings:
    """The whole parsed section."""

    cameras: Mapping[str, CameraSpec]
    profiles: Mapping[str, ProfileSpec]
    limits: Limits
    storage: StorageSpec
    job_terminal_ms: int = DEFAULT_JOB_TERMINAL_MS
    retention: CatalogRetention = field(default_factory=CatalogRetention)
    capture_lifecycle_events: bool = False
    max_queued_events: int = DEFAULT_MAX_QUEUED_EVENTS
    discovery_enabled: bool = False
    report_unconfigured: bool = False
    #: discovery.multicast and discovery.probeAddresses (host:port, unicast probes).
    discovery_multicast: bool = True
    discovery_addresses: tuple[str, ...] = ()
    #: discovery.multicastInterface: the IPv4 address of the interface multicast leaves by.
    discovery_interface: str | None = None


def _profile(name: str, entry: Mapping[str, Any]) -> ProfileSpec:
    thumb = entry.get("thumbnail") or {}
    return ProfileSpec(
        name=name,
        capture_mode=entry.get("captureMode"),
        encoding=entry.get("encoding", "jpeg"),
        quality=int(entry.get("quality", DEFAULT_QUALITY)),
        store_as_received=bool(entry.get("storeAsReceived", True)),
        timeout_ms=entry.get("timeoutMs"),
        thumbnail_size=thumb.get("size"),
        freshness=str(entry.get("freshness", DEFAULT_FRESHNESS)),
    )


def _camera(entry: Mapping[str, Any]) -> CameraSpec:
    schedules = tuple(
        ScheduleSpec(
            id=item["id"],
            interval_ms=int(item["intervalMs"]),
            capture_profile=item.get("captureProfile"),
            enabled=bool(item.get("enabled", True)),
        )
        for item in entry.get("schedules") or ()
    )
    ptz = entry.get("ptz") or {}
    home = ptz.get("home") or {}
    return CameraSpec(
        ptz=PtzSpec(
            enabled=bool(ptz.get("enabled", False)),
            allow_preset_mutation=bool(ptz.get("allowPresetMutation", False)),
            maximum_continuous_move_ms=int(
                ptz.get("maximumContinuousMoveMs", MAX_CONTINUOUS_MOVE_MS)
            ),
            home={axis: float(home.get(axis, 0.0)) for axis in ("pan", "tilt", "zoom")},
        ),
        instance=entry["instance"],
        backend=entry["backend"],
        enabled=bool(entry.get("enabled", True)),
        connection=dict(entry.get("connection") or {}),
        default_capture_profile=entry.get("defaultCaptureProfile", DEFAULT_PROFILE),
        schedules=schedules,
        max_frame_age_ms=int(entry.get("maxFrameAgeMs", DEFAULT_MAX_FRAME_AGE_MS)),
    )


def default_state_root(config: ComponentConfig) -> Path:
    """``{commands.stateDir}/{thing}/{component}``: beside the command idempotency store."""
    return config.commands.store_path(config.thing_name, config.component_token).parent


def configuration_issues(config: ComponentConfig) -> list[ConfigIssue]:
    """Rules the schema cannot say: unique instances and schedules, profiles that exist."""
    section = thaw(config.component)
    profiles = {DEFAULT_PROFILE, *(section.get("captureProfiles") or {})}
    issues: list[ConfigIssue] = []
    seen: set[str] = set()
    for index, camera in enumerate(section.get("cameras") or ()):
        path = f"$.component.cameras[{index}]"
        instance = camera.get("instance")
        if instance in seen:
            issues.append(ConfigIssue(f"{path}.instance", f"duplicate instance {instance!r}"))
        seen.add(instance)
        default = camera.get("defaultCaptureProfile", DEFAULT_PROFILE)
        if default not in profiles:
            issues.append(
                ConfigIssue(f"{path}.defaultCaptureProfile", f"unknown capture profile {default!r}")
            )
        missing = _missing_extra(camera.get("backend"))
        if missing is not None:
            issues.append(ConfigIssue(f"{path}.backend", missing))
        if camera.get("backend") in ("snapshot-uri", "rtsp-frame", "onvif") and not (
            camera.get("connection") or {}
        ).get("uri"):
            issues.append(ConfigIssue(f"{path}.connection.uri", f"{camera['backend']} needs a uri"))
        mode = (camera.get("connection") or {}).get("captureMode")
        if mode is not None and camera.get("backend") != "sim":
            issues.append(
                ConfigIssue(
                    f"{path}.connection.captureMode",
                    f"only a sim camera chooses its captureMode; {camera.get('backend')} "
                    "captures in its own",
                )
            )
        schedule_ids: set[str] = set()
        for position, schedule in enumerate(camera.get("schedules") or ()):
            where = f"{path}.schedules[{position}]"
            if schedule.get("id") in schedule_ids:
                issues.append(ConfigIssue(f"{where}.id", f"duplicate schedule {schedule['id']!r}"))
            schedule_ids.add(schedule.get("id"))
            profile = schedule.get("captureProfile")
            if profile is not None and profile not in profiles:
                issues.append(
                    ConfigIssue(f"{where}.captureProfile", f"unknown capture profile {profile!r}")
                )
    discovery = section.get("discovery") or {}
    if discovery.get("enabled"):
        missing = _missing_extra("onvif")
        if missing is not None:
            issues.append(ConfigIssue("$.component.discovery.enabled", f"discovery: {missing}"))
        if discovery.get("multicast") is False and not discovery.get("probeAddresses"):
            issues.append(
                ConfigIssue(
                    "$.component.discovery.probeAddresses",
                    "with multicast off, discovery needs at least one probe address",
                )
            )
    return issues


def _missing_extra(backend: Any) -> str | None:
    # Imported here: the backends package pulls in the image codec, the schema does not.
    from unskit.camera.backends import missing_extra

    return missing_extra(str(backend))


def parse_settings(config: ComponentConfig) -> CameraSettings:
    """The section with defaults applied; ConfigError lists every broken rule."""
    issues = configuration_issues(config)
    if issues:
        raise ConfigError(issues, config.source)
    section = thaw(config.component)
    glob = section.get("global") or {}
    profiles = {DEFAULT_PROFILE: ProfileSpec(DEFAULT_PROFILE)}
    for name, entry in (section.get("captureProfiles") or {}).items():
        profiles[name] = _profile(name, entry)
    limits_section = section.get("limits") or {}
    defaults = Limits()
    limits = Limits(
        max_metadata_bytes=limits_section.get("maxMetadataBytes", defaults.max_metadata_bytes),
        max_cameras_per_group=limits_section.get(
            "maxCamerasPerGroup", defaults.max_cameras_per_group
        ),
        max_concurrent_captures=limits_section.get(
            "maxConcurrentCaptures", defaults.max_concurrent_captures
        ),
        max_in_flight_bytes=limits_section.get("maxInFlightBytes", defaults.max_in_flight_bytes),
        max_queued_captures_per_camera=limits_section.get(
            "maxQueuedCapturesPerCamera", defaults.max_queued_captures_per_camera
        ),
        max_pending_captures=limits_section.get(
            "maxPendingCaptures", defaults.max_pending_captures
        ),
    )
    storage_section = section.get("storage") or {}
    state_root = Path(storage_section.get("stateRoot") or default_state_root(config)).absolute()
    output_root = Path(storage_section.get("outputRoot") or state_root / "images").absolute()
    storage_defaults = StorageSpec(output_root, state_root)
    storage = StorageSpec(
        output_root=output_root,
        state_root=state_root,
        output_min_free_bytes=storage_section.get(
            "outputMinFreeBytes", storage_defaults.output_min_free_bytes
        ),
        state_min_free_bytes=storage_section.get(
            "stateMinFreeBytes", storage_defaults.state_min_free_bytes
        ),
        fsync=storage_section.get("fsync", storage_defaults.fsync),
        sidecar=storage_section.get("sidecar", storage_defaults.sidecar),
        check_interval_ms=storage_section.get(
            "checkIntervalMs", storage_defaults.check_interval_ms
        ),
    )
    retention_section = (section.get("catalog") or {}).get("retention") or {}
    retention_defaults = CatalogRetention()
    retention = CatalogRetention(
        max_terminal_jobs=retention_section.get(
            "maxTerminalJobs", retention_defaults.max_terminal_jobs
        ),
        max_age_hours=retention_section.get("maxAgeHours", retention_defaults.max_age_hours),
    )
    discovery = section.get("discovery") or {}
    cameras = {entry["instance"]: _camera(entry) for entry in section.get("cameras") or ()}
    return CameraSettings(
        cameras=cameras,
        profiles=profiles,
        limits=limits,
        storage=storage,
        job_terminal_ms=(glob.get("timeouts") or {}).get("jobTerminalMs", DEFAULT_JOB_TERMINAL_MS),
        retention=retention,
        capture_lifecycle_events=bool(
            (glob.get("operatorEvents") or {}).get("captureLifecycle", False)
        ),
        max_queued_events=(glob.get("operatorEvents") or {}).get(
            "maxQueuedEvents", DEFAULT_MAX_QUEUED_EVENTS
        ),
        discovery_enabled=bool(discovery.get("enabled", False)),
        report_unconfigured=bool(discovery.get("reportUnconfigured", False)),
        discovery_multicast=bool(discovery.get("multicast", True)),
        discovery_addresses=tuple(discovery.get("probeAddresses") or ()),
        discovery_interface=discovery.get("multicastInterface"),
    )
