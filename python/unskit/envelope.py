"""The message envelope: `Message` (Rust) and `MessageBuilder`, which stamps it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from unskit._core.envelope import (
    MAX_OPAQUE_BYTES,
    MAX_SAMPLE_STATUS_BYTES,
    MAX_VALUE_DEPTH,
    Body,
    Header,
    Identity,
    Message,
    build_message,
)

__all__ = [
    "MAX_OPAQUE_BYTES",
    "MAX_SAMPLE_STATUS_BYTES",
    "MAX_VALUE_DEPTH",
    "EnvelopeStamp",
    "Header",
    "Identity",
    "Message",
    "MessageBuilder",
]


class EnvelopeStamp(Protocol):
    """What a component configuration gives every message it publishes."""

    @property
    def identity(self) -> Identity | None: ...

    @property
    def tags(self) -> Mapping[str, str]: ...


class MessageBuilder:
    """Builds a `Message`, stamping uuid, correlation id and timestamp, and from the
    configuration (when given) the tags and the publisher identity."""

    __slots__ = (
        "_body",
        "_config",
        "_content_encoding",
        "_content_type",
        "_correlation_id",
        "_identity",
        "_instance",
        "_name",
        "_reply_to",
        "_schema",
        "_timestamp_ms",
        "_uuid",
        "_version",
    )

    def __init__(self, name: str, version: str, config: EnvelopeStamp | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("message name must be a non-empty str")
        if not isinstance(version, str) or not version:
            raise ValueError("message version must be a non-empty str")
        self._name = name
        self._version = version
        self._config = config
        self._identity: Identity | None = None
        self._instance: str | None = None
        self._body: Body | None = None
        self._uuid: str | None = None
        self._timestamp_ms: int | None = None
        self._correlation_id: str | None = None
        self._reply_to: str | None = None
        self._content_type: str | None = None
        self._content_encoding: str | None = None
        self._schema: str | None = None

    def body(self, payload: Any) -> MessageBuilder:
        """Sets the body: JSON text is parsed (other text stays a string), dicts and lists
        become structured values, bytes-like objects an opaque body of at most 64 KiB.
        Integers from -2**63 to 2**64-1 are carried exactly; others raise EnvelopeError."""
        self._body = Body.from_payload(payload)
        return self

    def signal_update(
        self,
        signal_id: str,
        samples: Iterable[Mapping[str, Any]],
        *,
        name: str | None = None,
    ) -> MessageBuilder:
        """Sets a `SouthboundSignalUpdate` body; each sample maps `value` and optionally
        `quality` (GOOD, UNCERTAIN, BAD; default GOOD), `source_timestamp_ms`,
        `server_timestamp_ms` and `status` (the source's symbolic status code name, at most
        MAX_SAMPLE_STATUS_BYTES; empty or absent means none)."""
        self._body = Body.signal_update(signal_id, samples, name=name)
        return self

    def instance(self, token: str | None) -> MessageBuilder:
        """Scopes the message to one instance of the component; None keeps component scope."""
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError("instance token must be a non-empty str or None")
        self._instance = token
        return self

    def identity(self, identity: Identity) -> MessageBuilder:
        """Overrides the configured identity for this message."""
        if not isinstance(identity, Identity):
            raise TypeError(f"identity must be an Identity, not {type(identity).__name__}")
        self._identity = identity
        return self

    def uuid(self, value: str) -> MessageBuilder:
        """Sets the message id instead of a random UUID (for deterministic tests)."""
        self._uuid = _non_empty_str("uuid", value)
        return self

    def timestamp_ms(self, value: int) -> MessageBuilder:
        """Sets the timestamp (epoch milliseconds) instead of the current time."""
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"timestamp_ms must be an int, not {type(value).__name__}")
        self._timestamp_ms = value
        return self

    def correlation_id(self, value: str) -> MessageBuilder:
        """Sets the correlation id instead of a random UUID."""
        self._correlation_id = _non_empty_str("correlation_id", value)
        return self

    def reply_to(self, topic: str) -> MessageBuilder:
        """Sets the topic a responder publishes its reply to."""
        self._reply_to = _non_empty_str("reply_to", topic)
        return self

    def content_type(self, value: str) -> MessageBuilder:
        """Sets the body's media type, e.g. ``image/jpeg``."""
        self._content_type = _non_empty_str("content_type", value)
        return self

    def content_encoding(self, value: str) -> MessageBuilder:
        """Sets the body's content encoding, e.g. ``gzip``."""
        self._content_encoding = _non_empty_str("content_encoding", value)
        return self

    def schema(self, value: str) -> MessageBuilder:
        """Names the schema the body follows."""
        self._schema = _non_empty_str("schema", value)
        return self

    def build(self) -> Message:
        """Returns the stamped message; the builder can build again (fresh uuid each time)."""
        config = self._config
        identity = self._identity
        tags: Mapping[str, str] | None = None
        if config is not None:
            tags = config.tags
            if identity is None:
                identity = config.identity
        if self._instance is not None:
            if identity is None:
                raise ValueError("an instance token needs an identity (configuration or override)")
            identity = identity.with_instance(self._instance)
        return build_message(
            self._name,
            self._version,
            uuid=self._uuid,
            timestamp_ms=self._timestamp_ms,
            correlation_id=self._correlation_id,
            reply_to=self._reply_to,
            identity=identity,
            tags=tags,
            body=self._body,
            content_type=self._content_type,
            content_encoding=self._content_encoding,
            schema=self._schema,
        )


def _non_empty_str(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{field} must not be empty")
    return value
