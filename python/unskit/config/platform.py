"""Where a component runs: HOST, CLUSTER or EDGE_RUNTIME, detected or given explicitly."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping

__all__ = ["PLATFORM_ENV", "Platform", "detect_platform"]

# Explicit override, e.g. UNSKIT_PLATFORM=CLUSTER; wins over detection.
PLATFORM_ENV = "UNSKIT_PLATFORM"
# The orchestrator injects its service address into every container.
_CLUSTER_MARKERS = ("KUBERNETES_SERVICE_HOST",)
# The managed edge runtime hands each component its IPC socket and service token.
_EDGE_RUNTIME_MARKERS = (
    "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT",
    "SVCUID",
)


class Platform(enum.Enum):
    """The platform kinds of the specification."""

    HOST = "HOST"
    CLUSTER = "CLUSTER"
    EDGE_RUNTIME = "EDGE_RUNTIME"


def detect_platform(
    environ: Mapping[str, str] | None = None, override: str | Platform | None = None
) -> Platform:
    """An explicit override (argument, then UNSKIT_PLATFORM) wins; else the environment tells."""
    env = os.environ if environ is None else environ
    chosen = override if override is not None else env.get(PLATFORM_ENV)
    if isinstance(chosen, Platform):
        return chosen
    if chosen:
        try:
            return Platform(chosen.strip().upper())
        except ValueError:
            names = ", ".join(p.value for p in Platform)
            raise ValueError(f"unknown platform {chosen!r}; expected one of {names}") from None
    if any(env.get(name) for name in _EDGE_RUNTIME_MARKERS):
        return Platform.EDGE_RUNTIME
    if any(env.get(name) for name in _CLUSTER_MARKERS):
        return Platform.CLUSTER
    return Platform.HOST
