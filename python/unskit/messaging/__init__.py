"""Messaging: envelopes over MQTT (or the edge-runtime IPC bus), local and northbound."""

from unskit.messaging.client import LinkStats, MessagingClient
from unskit.messaging.reply_to import ReplyRefusal
from unskit.messaging.requests import RequestFuture
from unskit.messaging.transport import QoS, Transport
from unskit.topics import (
    REPLY_TOPIC_PREFIX,
    RESERVED_CLASSES,
    TopicScope,
    topic_matches_filter,
)

__all__ = [
    "REPLY_TOPIC_PREFIX",
    "RESERVED_CLASSES",
    "LinkStats",
    "MessagingClient",
    "QoS",
    "ReplyRefusal",
    "RequestFuture",
    "TopicScope",
    "Transport",
    "topic_matches_filter",
]
