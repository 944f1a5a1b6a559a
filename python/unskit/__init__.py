"""unskit: industrial edge components for a Unified Namespace over MQTT, with a Rust core."""

from unskit._core import __version__
from unskit.envelope import (
    MAX_OPAQUE_BYTES,
    EnvelopeStamp,
    Header,
    Identity,
    Message,
    MessageBuilder,
)
from unskit.errors import EnvelopeError, UnskitError

__all__ = [
    "MAX_OPAQUE_BYTES",
    "EnvelopeError",
    "EnvelopeStamp",
    "Header",
    "Identity",
    "Message",
    "MessageBuilder",
    "UnskitError",
    "__version__",
]
