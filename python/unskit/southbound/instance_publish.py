"""The publish layer of `InstanceRunner`: the due signal updates built (a sample whose
value the envelope cannot carry goes out BAD, with a status saying why) and handed to the
instance's publisher thread, which publishes them in order and counts samplesPublished and
publishErrors."""

from __future__ import annotations

import logging
from typing import Any

from unskit.envelope import Message, MessageBuilder
from unskit.errors import EnvelopeError, UnskitError
from unskit.southbound.driver import SignalSpec
from unskit.southbound.instance_connection import _Connection
from unskit.southbound.signals import bounded_status, not_encodable

# The logger keeps the name it had before this module was split out of instance.py.
_log = logging.getLogger("unskit.southbound.instance")

SIGNAL_UPDATE_NAME = "SouthboundSignalUpdate"
#: Signal updates built and not yet published, at most; a full queue holds the instance
#: thread back, as publishing on it did.
_OUTBOX_LIMIT = 1000


class _Publishing(_Connection):
    """The publish layer of `InstanceRunner`: signal updates built and published."""

    def _publish(self, now: float, *, flush: bool) -> None:
        """Builds the due signal updates and hands them to the publisher thread."""
        for state in self._table.due(now, flush=flush):
            samples = self._table.take(state)
            message = self._signal_update(state.spec, samples)
            if state.topic is None:
                state.topic = self._context.topics.topic(
                    "data", state.channel, instance=self.spec.id
                )
            self._outbox.put((state.topic, message, len(samples)))

    def _signal_update(self, spec: SignalSpec, samples: list[dict[str, Any]]) -> Message:
        """The update of one signal. A sample whose value the envelope cannot carry goes
        out BAD, without its value, with a status saying why: one value never holds back
        the signal's other samples, nor any other signal."""
        try:
            message = self._build_update(spec, samples)
        except (EnvelopeError, TypeError, ValueError):
            samples = [self._encodable(spec, sample) for sample in samples]
            message = self._build_update(spec, samples)
        else:
            self._unencodable.discard(spec.id)
        return message

    def _build_update(self, spec: SignalSpec, samples: list[dict[str, Any]]) -> Message:
        return (
            MessageBuilder(SIGNAL_UPDATE_NAME, "1.0", self._context.stamp)
            .instance(self.spec.id)
            .signal_update(spec.id, samples, name=spec.name)
            .build()
        )

    def _encodable(self, spec: SignalSpec, sample: dict[str, Any]) -> dict[str, Any]:
        try:
            self._build_update(spec, [sample])
        except (EnvelopeError, TypeError, ValueError) as error:
            self._context.counter(self.spec.id, "encodeErrors", None).inc()
            status = not_encodable(sample.get("value")) or bounded_status(f"not encodable: {error}")
            if spec.id not in self._unencodable:
                self._unencodable.add(spec.id)
                _log.warning(
                    "instance %s: a sample of %s cannot be encoded, published BAD: %s",
                    self.spec.id,
                    spec.id,
                    status,
                )
            return {
                "value": None,
                "quality": "BAD",
                "source_timestamp_ms": sample.get("source_timestamp_ms", 0),
                "server_timestamp_ms": sample.get("server_timestamp_ms", 0),
                "status": status,
            }
        return sample

    def _publish_loop(self) -> None:
        while True:
            updates = [self._outbox.get()]
            # What else is waiting goes out in the same pass, counted once (a pass takes at
            # most a queue's worth, so a producer never keeps it from publishing).
            while (
                updates[-1] is not None
                and len(updates) < _OUTBOX_LIMIT
                and not self._outbox.empty()
            ):
                updates.append(self._outbox.get_nowait())
            published = 0
            for update in updates:
                if update is None:
                    break
                topic, message, count = update
                try:
                    self._context.messaging.publish(topic, message)
                except UnskitError as error:
                    self._context.counter(self.spec.id, "publishErrors", None).inc()
                    _log.debug(
                        "instance %s: update of %s not published: %s", self.spec.id, topic, error
                    )
                    continue
                except Exception:
                    self._context.counter(self.spec.id, "publishErrors", None).inc()
                    _log.exception("instance %s: update of %s not published", self.spec.id, topic)
                    continue
                published += count
            if published:
                self._context.counter(self.spec.id, "samplesPublished", None).inc(published)
            if updates[-1] is None:
                return
