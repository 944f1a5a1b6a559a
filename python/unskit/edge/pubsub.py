"""The edge runtime's two publish/subscribe buses, as small calls over an `IpcConnection`'s
client: the messaging transport's only way to the SDK. `Bus.LOCAL` is the local pub/sub
(aws.greengrass.ipc.pubsub: PublishToTopic/SubscribeToTopic); `Bus.IOT_CORE` the nucleus's
cloud MQTT proxy (aws.greengrass.ipc.mqttproxy: PublishToIoTCore/SubscribeToIoTCore, QoS 0
and 1), which the nucleus answers once it took the message (sent, or held in its spooler
while its cloud connection is down), not once the cloud acknowledged it.

Every call returns at once with a future; stream events and the futures' callbacks run on
the SDK's event-loop thread (the connection has no executor), so callers hand them on
without blocking.
"""

from __future__ import annotations

import concurrent.futures
import enum
import json
from collections.abc import Callable
from typing import Any

__all__ = [
    "Bus",
    "StreamCallbacks",
    "close_stream",
    "is_connection_lost",
    "is_service_error",
    "publish",
    "publish_binary",
    "subscribe",
    "subscribe_bus",
]

#: The CRT's error names for a call on a connection (or its stream) that is closing.
_CONNECTION_CLOSED = (
    "AWS_ERROR_EVENT_STREAM_RPC_CONNECTION_CLOSED",
    "AWS_ERROR_EVENT_STREAM_RPC_STREAM_CLOSED",
)

#: (topic, payload) of one message a subscription received.
ReceivedCallback = Callable[[str, bytes], None]


class StreamCallbacks:
    """What a subscription's stream reports: messages, and its close (an error or not)."""

    def __init__(
        self, on_message: ReceivedCallback, on_closed: Callable[[Exception | None], None]
    ) -> None:
        self.on_message = on_message
        self.on_closed = on_closed


class Bus(enum.Enum):
    """Which of the nucleus's buses a transport uses; the values name their publish call."""

    LOCAL = "PublishToTopic"
    IOT_CORE = "PublishToIoTCore"

    @property
    def subscribe_operation(self) -> str:
        """The subscribe call's name, for errors."""
        return "SubscribeToTopic" if self is Bus.LOCAL else "SubscribeToIoTCore"


def publish(
    client: Any, bus: Bus, topic: str, payload: bytes, at_least_once: bool
) -> concurrent.futures.Future[Any]:
    """Publishes on `bus`: the local bus has no QoS (`at_least_once` is for the proxy)."""
    if bus is Bus.LOCAL:
        return publish_binary(client, topic, payload)
    return publish_iot_core(client, topic, payload, at_least_once)


def publish_iot_core(
    client: Any, topic: str, payload: bytes, at_least_once: bool
) -> concurrent.futures.Future[Any]:
    """PublishToIoTCore (QoS 1 or 0); the future settles when the nucleus answered."""
    from awsiot.greengrasscoreipc import model

    qos = model.QOS.AT_LEAST_ONCE if at_least_once else model.QOS.AT_MOST_ONCE
    future: concurrent.futures.Future[Any] = client.publish_to_iot_core_async(
        topic_name=topic, qos=qos, payload=payload
    )
    return future


def subscribe_bus(
    client: Any,
    bus: Bus,
    topic_filter: str,
    *,
    receive_all: bool,
    at_least_once: bool,
    callbacks: StreamCallbacks,
) -> tuple[concurrent.futures.Future[Any], Any]:
    """Subscribes on `bus` (`receive_all` is the local bus's, `at_least_once` the proxy's)."""
    if bus is Bus.LOCAL:
        return subscribe(client, topic_filter, receive_all=receive_all, callbacks=callbacks)
    return subscribe_iot_core(client, topic_filter, at_least_once, callbacks)


def subscribe_iot_core(
    client: Any, topic_filter: str, at_least_once: bool, callbacks: StreamCallbacks
) -> tuple[concurrent.futures.Future[Any], Any]:
    """SubscribeToIoTCore; messages arrive as IoTCoreMessage (topic and payload)."""
    from awsiot.greengrasscoreipc import model

    def on_event(event: Any) -> None:
        message = event.message
        if message is not None:
            callbacks.on_message(message.topic_name or topic_filter, bytes(message.payload or b""))

    def on_error(error: Exception) -> bool:
        callbacks.on_closed(error)
        return True

    def on_closed() -> None:
        callbacks.on_closed(None)

    qos = model.QOS.AT_LEAST_ONCE if at_least_once else model.QOS.AT_MOST_ONCE
    future, operation = client.subscribe_to_iot_core_async(
        topic_name=topic_filter,
        qos=qos,
        on_stream_event=on_event,
        on_stream_error=on_error,
        on_stream_closed=on_closed,
    )
    return future, operation


def publish_binary(client: Any, topic: str, payload: bytes) -> concurrent.futures.Future[Any]:
    """PublishToTopic of `payload` as a BinaryMessage; the future settles when the nucleus
    answered (its exception is the SDK's: map it with `edge_error`)."""
    from awsiot.greengrasscoreipc import model

    message = model.PublishMessage(binary_message=model.BinaryMessage(message=payload))
    future: concurrent.futures.Future[Any] = client.publish_to_topic_async(
        topic=topic, publish_message=message
    )
    return future


def subscribe(
    client: Any, topic_filter: str, *, receive_all: bool, callbacks: StreamCallbacks
) -> tuple[concurrent.futures.Future[Any], Any]:
    """SubscribeToTopic with an explicit receive mode (this nucleus defaults a wildcard
    filter without one to others-only); returns the response future and the stream, which
    `close_stream` ends."""
    from awsiot.greengrasscoreipc import model

    mode = (
        model.ReceiveMode.RECEIVE_ALL_MESSAGES
        if receive_all
        else model.ReceiveMode.RECEIVE_MESSAGES_FROM_OTHERS
    )

    def on_event(event: Any) -> None:
        binary = event.binary_message
        if binary is not None:
            topic = binary.context.topic if binary.context is not None else topic_filter
            callbacks.on_message(topic, bytes(binary.message or b""))
            return
        document = event.json_message
        if document is not None:
            # Handed on as its JSON bytes: the envelope decoder rejects it (spec 1: foreign
            # JSON is never turned into a message), and the rejection is counted there.
            topic = document.context.topic if document.context is not None else topic_filter
            callbacks.on_message(topic, json.dumps(document.message).encode())

    def on_error(error: Exception) -> bool:
        callbacks.on_closed(error)
        return True  # the stream is of no use after an error: close it

    def on_closed() -> None:
        callbacks.on_closed(None)

    future, operation = client.subscribe_to_topic_async(
        topic=topic_filter,
        receive_mode=mode,
        on_stream_event=on_event,
        on_stream_error=on_error,
        on_stream_closed=on_closed,
    )
    return future, operation


def close_stream(operation: Any) -> None:
    """Ends a subscription's stream (an unsubscribe; IPC has no other)."""
    operation.close()


def is_connection_lost(exc: BaseException) -> bool:
    """Whether a call failed because the connection went (not because the nucleus refused
    it): such a publish is held for the next connection, not counted as refused."""
    from awscrt.exceptions import AwsCrtError
    from awsiot import eventstreamrpc

    if isinstance(
        exc, (eventstreamrpc.ConnectionClosedError, eventstreamrpc.StreamClosedError, AwsCrtError)
    ):
        return True
    # A call made while the connection closes fails with a bare RuntimeError naming the CRT's
    # error code (measured: "4104 (AWS_ERROR_EVENT_STREAM_RPC_CONNECTION_CLOSED)"); taken as
    # a refusal, an outbox entry would be deleted unsent.
    return isinstance(exc, RuntimeError) and any(name in str(exc) for name in _CONNECTION_CLOSED)


def is_service_error(exc: BaseException) -> bool:
    """Whether the nucleus refused a call with ServiceError: on the cloud proxy, what it
    answers while its spooler is full ("Message spool is full", measured), a refusal for now
    rather than for good (AccessDenied, InvalidArguments)."""
    from awsiot.greengrasscoreipc import model

    return isinstance(exc, model.ServiceError)
