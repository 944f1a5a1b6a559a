"""unskit: industrial edge components for a Unified Namespace over MQTT, with a Rust core.

The envelope and the errors load with the package; configuration, messaging and the
component runtime load on first use (`unskit.MessagingClient` imports paho only then).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from unskit._core import __version__
from unskit.digests import Crc32c, Sha256, WrittenFile, write_hashed
from unskit.envelope import (
    MAX_OPAQUE_BYTES,
    EnvelopeStamp,
    Header,
    Identity,
    Message,
    MessageBuilder,
)
from unskit.errors import (
    AccessDeniedError,
    CaptureError,
    CipError,
    CommandError,
    ComponentNotFoundError,
    ConfigError,
    ConfigIssue,
    EdgeRuntimeError,
    EnvelopeError,
    ImageError,
    MessagingError,
    PublishError,
    RequestTimeoutError,
    ReservedTopicError,
    SecretError,
    SignalError,
    UnskitError,
    UnsupportedQosError,
)
from unskit.thumbnails import Thumbnail, make_thumbnail, thumbnail_from_jpeg

if TYPE_CHECKING:
    from unskit.commands import (
        CommandClient,
        CommandContext,
        CommandInbox,
        ErrorCode,
        Kind,
        Page,
        ReloadOutcome,
        RequestIdRule,
        Scope,
        Verb,
    )
    from unskit.config import ComponentConfig, ConfigLoader, Platform, load_config
    from unskit.messaging import MessagingClient, QoS, RequestFuture, TopicScope
    from unskit.runtime.component import ComponentApp, Runtime
    from unskit.runtime.health import HealthServer, ReadinessState
    from unskit.runtime.logging_config import configure_logging

_LAZY = {
    "CommandClient": "unskit.commands",
    "CommandContext": "unskit.commands",
    "CommandInbox": "unskit.commands",
    "ErrorCode": "unskit.commands",
    "Kind": "unskit.commands",
    "Page": "unskit.commands",
    "ReloadOutcome": "unskit.commands",
    "RequestIdRule": "unskit.commands",
    "Scope": "unskit.commands",
    "Verb": "unskit.commands",
    "ComponentConfig": "unskit.config",
    "ConfigLoader": "unskit.config",
    "Platform": "unskit.config",
    "load_config": "unskit.config",
    "MessagingClient": "unskit.messaging",
    "QoS": "unskit.messaging",
    "RequestFuture": "unskit.messaging",
    "TopicScope": "unskit.messaging",
    "ComponentApp": "unskit.runtime.component",
    "Runtime": "unskit.runtime.component",
    "HealthServer": "unskit.runtime.health",
    "ReadinessState": "unskit.runtime.health",
    "configure_logging": "unskit.runtime.logging_config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'unskit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "MAX_OPAQUE_BYTES",
    "AccessDeniedError",
    "CaptureError",
    "CipError",
    "CommandClient",
    "CommandContext",
    "CommandError",
    "CommandInbox",
    "ComponentApp",
    "ComponentConfig",
    "ComponentNotFoundError",
    "ConfigError",
    "ConfigIssue",
    "ConfigLoader",
    "Crc32c",
    "EdgeRuntimeError",
    "EnvelopeError",
    "EnvelopeStamp",
    "ErrorCode",
    "Header",
    "HealthServer",
    "Identity",
    "ImageError",
    "Kind",
    "Message",
    "MessageBuilder",
    "MessagingClient",
    "MessagingError",
    "Page",
    "Platform",
    "PublishError",
    "QoS",
    "ReadinessState",
    "ReloadOutcome",
    "RequestFuture",
    "RequestIdRule",
    "RequestTimeoutError",
    "ReservedTopicError",
    "Runtime",
    "Scope",
    "SecretError",
    "Sha256",
    "SignalError",
    "Thumbnail",
    "TopicScope",
    "UnskitError",
    "UnsupportedQosError",
    "Verb",
    "WrittenFile",
    "__version__",
    "configure_logging",
    "load_config",
    "make_thumbnail",
    "thumbnail_from_jpeg",
    "write_hashed",
]
