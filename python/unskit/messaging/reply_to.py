"""Replies go only to reply topics (spec 1, envelope rule 4): the check a request's reply_to
passes before a responder publishes anything there, and the warning when it does not.

A reply_to is chosen by whoever sent the request, so a responder that published wherever it
says could be made to publish onto any topic (another component's command topic, a UNS data
topic). A reply is published only to a topic under ``lib/reply-`` or under one of the
prefixes of ``messaging.replyTopicPrefixes``; anything else is refused, counted and logged
at most once per sender per minute.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from unskit.envelope import Message
from unskit.topics import MAX_TOPIC_BYTES, REPLY_TOPIC_PREFIX, RESERVED_CLASSES, topic_class

__all__ = ["REFUSAL_LOG_WINDOW_SECS", "RefusalLog", "ReplyRefusal", "reply_refusal"]

#: One warning per sender per this many seconds.
REFUSAL_LOG_WINDOW_SECS = 60.0
# Senders remembered by the warning's rate limit; beyond this, new senders share one entry.
MAX_TRACKED_SENDERS = 1024
# How much of a sender-chosen string a log line shows.
_SHOWN_CHARS = 120

# What MQTT brokers refuse in a topic name, and Mosquitto answers by dropping the connection:
# NUL, control characters, surrogates and non-characters (MQTT 5 section 1.5.4).
_NON_CHARACTERS = "".join(
    f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}" for plane in range(17)
)
_INVALID = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef{_NON_CHARACTERS}]")


class ReplyRefusal(str, enum.Enum):
    """Why a request is not answered; the value is the metric's ``reason`` dimension."""

    MISSING = "missing"
    EMPTY = "empty"
    TOO_LONG = "too-long"
    INVALID = "invalid"
    WILDCARD = "wildcard"
    RESERVED = "reserved"
    NOT_A_REPLY_TOPIC = "not-a-reply-topic"

    @property
    def explanation(self) -> str:
        """Why, in the words of a log line."""
        return _EXPLANATIONS[self]


_EXPLANATIONS = {
    ReplyRefusal.MISSING: "the request carries no reply_to",
    ReplyRefusal.EMPTY: "its reply_to is empty",
    ReplyRefusal.TOO_LONG: f"its reply_to is longer than the {MAX_TOPIC_BYTES} bytes of a topic",
    ReplyRefusal.INVALID: "its reply_to holds NUL, a control character or a non-character",
    ReplyRefusal.WILDCARD: "its reply_to holds a wildcard ('+' or '#')",
    ReplyRefusal.RESERVED: "its reply_to has a reserved class (state, metric, cfg, log)",
    ReplyRefusal.NOT_A_REPLY_TOPIC: "its reply_to is not a reply topic",
}


def reply_refusal(reply_to: str | None, prefixes: Iterable[str] = ()) -> ReplyRefusal | None:
    """Why a reply to `reply_to` is refused, or None when it is a reply topic: one under
    ``lib/reply-`` or another of `prefixes`, with at least one character after it."""
    if reply_to is None:
        return ReplyRefusal.MISSING
    if not reply_to:
        return ReplyRefusal.EMPTY
    # Every character is at least one byte: most topics never need encoding to be measured.
    if len(reply_to) > MAX_TOPIC_BYTES or (
        len(reply_to) * 4 > MAX_TOPIC_BYTES
        and len(reply_to.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES
    ):
        return ReplyRefusal.TOO_LONG
    # For ASCII (every topic the library mints) printable means exactly "no control
    # character", and is much quicker than the regular expression.
    invalid = (
        not reply_to.isprintable() if reply_to.isascii() else _INVALID.search(reply_to) is not None
    )
    if invalid:
        return ReplyRefusal.INVALID
    if "+" in reply_to or "#" in reply_to:
        return ReplyRefusal.WILDCARD
    if reply_to.startswith(REPLY_TOPIC_PREFIX) and len(reply_to) > len(REPLY_TOPIC_PREFIX):
        # Not a UNS topic, so it has no class to be reserved.
        return None
    if topic_class(reply_to) in RESERVED_CLASSES:
        return ReplyRefusal.RESERVED
    if any(reply_to.startswith(p) and len(reply_to) > len(p) for p in prefixes):
        return None
    return ReplyRefusal.NOT_A_REPLY_TOPIC


def sender(request: Message) -> str:
    """Who sent a request, as far as its envelope tells: the identity it carries."""
    identity = request.identity
    if identity is None:
        return "an anonymous sender"
    levels = [identity.path, identity.component]
    if identity.instance is not None:
        levels.append(identity.instance)
    return _shown("/".join(levels))


class RefusalLog:
    """Logs a refused reply at most once per sender per window, with how many refusals of
    that sender the window before held; a bounded table, so forged identities cannot grow
    it."""

    _OTHERS = "other senders"

    def __init__(
        self,
        logger: logging.Logger,
        *,
        window_secs: float = REFUSAL_LOG_WINDOW_SECS,
        max_senders: int = MAX_TRACKED_SENDERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._window = window_secs
        self._max = max_senders
        self._clock = clock
        self._lock = threading.Lock()
        # sender -> [when its last line was logged, refusals not logged since]; oldest first.
        self._senders: OrderedDict[str, list[float]] = OrderedDict()

    def refused(self, link: str, request: Message, refusal: ReplyRefusal) -> None:
        """Logs this refusal unless its sender was logged within the window."""
        who = sender(request)
        if refusal is ReplyRefusal.MISSING:
            # A legitimate fire-and-forget: debug only, and it must not use up the sender's
            # warning for a hostile reply_to.
            self._log(logging.DEBUG, link, request, refusal, who, "")
            return
        now = self._clock()
        with self._lock:
            key = self._key(who, now)
            entry = self._senders.get(key)
            if entry is not None and now - entry[0] < self._window:
                entry[1] += 1
                return
            quiet = 0 if entry is None else int(entry[1])
            self._senders[key] = [now, 0]
            self._senders.move_to_end(key)
        quieted = f"; {quiet} more from {key} in the last minute not logged" if quiet else ""
        self._log(logging.WARNING, link, request, refusal, who, quieted)

    def _log(
        self, level: int, link: str, request: Message, refusal: ReplyRefusal, who: str, tail: str
    ) -> None:
        self._logger.log(
            level,
            "messaging %s: not answering %s %s from %s: %s (reply_to %s)%s",
            link,
            _shown(request.header.name),
            _shown(request.header.uuid),
            who,
            refusal.explanation,
            _shown(request.reply_to),
            tail,
        )

    def _key(self, who: str, now: float) -> str:
        # Called with the lock held.
        if who in self._senders or len(self._senders) < self._max:
            return who
        oldest, (logged, _) = next(iter(self._senders.items()))
        if now - logged >= self._window:
            del self._senders[oldest]
            return who
        return self._OTHERS


def _shown(value: str | None) -> str:
    """A sender-chosen string as a log line shows it: quoted, escaped and cut short."""
    if value is None:
        return "none"
    if len(value) <= _SHOWN_CHARS:
        return repr(value)
    return f"{value[:_SHOWN_CHARS]!r}... ({len(value)} characters)"
