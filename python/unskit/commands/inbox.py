"""The command inbox: cmd/sb requests on the component's topics, checked (addressing, scope,
strict body, requestId, idempotency) before a verb's handler runs, and always answered."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from unskit.commands.codes import RETRYABLE_CODES, ErrorCode, failure_code
from unskit.commands.fields import (
    CURSOR,
    DEFAULT_LIMIT,
    INSTANCE,
    LIMIT,
    MAX_BODY_BYTES,
    MAX_BODY_DEPTH,
    REQUEST_ID,
    Param,
    bad_args,
    json_depth,
    json_size,
)
from unskit.commands.idempotency import ClaimKind, IdempotencyKey, IdempotencyStore, arguments_hash
from unskit.commands.paging import CursorBook
from unskit.commands.verbs import CommandContext, Kind, Page, RequestIdRule, Scope, Verb
from unskit.envelope import EnvelopeStamp, Message, MessageBuilder
from unskit.errors import CommandError, EnvelopeError, UnskitError
from unskit.messaging.client import MessagingClient
from unskit.messaging.reply_to import ReplyRefusal
from unskit.messaging.requests import request_deadline_ms
from unskit.topics import TopicScope

__all__ = ["REPLY_NAME", "CommandInbox", "InboxStats", "single_instance"]

_log = logging.getLogger(__name__)

#: header.name of every reply the inbox sends.
REPLY_NAME = "CommandReply"
# Fields the inbox consumes itself; they never reach the idempotency hash or paging owner.
_ROUTING_FIELDS = ("requestId", "instance", "limit", "cursor")


def single_instance(configured: Collection[str]) -> str:
    """The one configured instance, for a request that names none; BAD_ARGS otherwise."""
    if len(configured) == 1:
        return next(iter(configured))
    if not configured:
        raise CommandError(ErrorCode.NO_SUCH_INSTANCE, "no instance is configured")
    raise bad_args(f"instance is required: {len(configured)} instances are configured")


@dataclass
class InboxStats:
    """Counters of what the inbox received and answered."""

    requests: int = 0
    succeeded: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    #: Requests without a reply_to (run when immediate) or with a refused one (not run):
    #: nobody can be answered.
    unanswerable: int = 0
    #: Requests the full queue could not take, answered RESOURCE_LIMIT at once (not run).
    busy: int = 0


class _Held:
    """A request whose reply is not sent yet (a deferred verb, or a duplicate waiting on
    the original); the first answer wins."""

    __slots__ = ("answered", "request", "verb")

    def __init__(self, request: Message, verb: str) -> None:
        self.request = request
        self.verb = verb
        self.answered = False


class CommandInbox:
    """Serves ``{base}/cmd/sb/+`` and ``{base}/+/cmd/sb/+`` for one component."""

    def __init__(
        self,
        messaging: MessagingClient,
        topics: TopicScope,
        *,
        store: IdempotencyStore,
        instances: Callable[[], Collection[str]] = tuple,
        stamp: EnvelopeStamp | None = None,
        max_concurrency: int = 8,
        max_queued: int = 1000,
        cursor_ttl_seconds: float = 300.0,
        on_outcome: Callable[[str, str], None] | None = None,
        deadline_seconds: float = 0.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_body_depth: int = MAX_BODY_DEPTH,
    ) -> None:
        self._messaging = messaging
        self._topics = topics
        self._base = topics.base + "/"
        self._store = store
        self._instances = instances
        self._stamp = stamp
        self._max_concurrency = max_concurrency
        self._max_queued = max_queued
        self._max_body_bytes = max_body_bytes
        self._max_body_depth = max_body_depth
        self._busy = CommandError(
            ErrorCode.RESOURCE_LIMIT,
            f"the command inbox is full ({max_queued} requests wait for a worker); not run, "
            "retry later",
        ).to_body()
        self._cursors = CursorBook(ttl_seconds=cursor_ttl_seconds)
        self._on_outcome = on_outcome
        # A request older than this (by its header timestamp) is refused unrun; 0: never.
        self._deadline_ms = deadline_seconds * 1000
        self._verbs: dict[str, Verb] = {}
        self._lock = threading.Lock()
        self._held: set[_Held] = set()
        self._draining = 0
        self._stopping = False
        self.stats = InboxStats()
        self.register(
            Verb(
                "describe",
                self._describe,
                scope=Scope.BOTH,
                summary="every verb with its scope, kind, requestId rule and fields",
            )
        )

    # -- registration ---------------------------------------------------------------------

    @property
    def filters(self) -> tuple[str, str]:
        """The two topic filters the inbox subscribes to."""
        return (f"{self._topics.base}/cmd/sb/+", f"{self._topics.base}/+/cmd/sb/+")

    def register(self, verb: Verb) -> None:
        """Adds a verb; the inbox adds the instance, requestId, limit and cursor fields."""
        extra: dict[str, Param] = {}
        if verb.scope is not Scope.COMPONENT:
            extra["instance"] = Param(INSTANCE)
        if verb.request_id is not RequestIdRule.NONE:
            extra["requestId"] = Param(
                REQUEST_ID, required=verb.request_id is RequestIdRule.REQUIRED
            )
        if verb.paged:
            extra["limit"] = Param(LIMIT, default=DEFAULT_LIMIT)
            extra["cursor"] = Param(CURSOR)
        clash = set(extra) & set(verb.body.names)
        if clash:
            raise ValueError(f"verb {verb.name!r} declares {sorted(clash)}; the inbox owns them")
        with self._lock:
            if verb.name in self._verbs and verb.name == "describe":
                raise ValueError("describe is built in")
            self._verbs[verb.name] = dataclasses.replace(verb, body=verb.body.with_fields(extra))

    def verbs(self) -> list[Verb]:
        """The registered verbs, in registration order."""
        with self._lock:
            return list(self._verbs.values())

    def start(self) -> CommandInbox:
        """Subscribes to the inbox topics; registered verbs are served from then on."""
        for topic_filter in self.filters:
            self._messaging.subscribe(
                topic_filter,
                self._on_request,
                max_concurrency=self._max_concurrency,
                max_messages=self._max_queued,
                on_overflow=self._on_overflow,
            )
        _log.info("command inbox on %s and %s", *self.filters)
        return self

    @contextlib.contextmanager
    def draining(self) -> Iterator[None]:
        """While a configuration reload drains, every verb answers DEVICE_UNAVAILABLE."""
        with self._lock:
            self._draining += 1
        try:
            yield
        finally:
            with self._lock:
                self._draining -= 1

    def stop_accepting(self) -> None:
        """From now on every verb answers COMPONENT_STOPPING; held requests still finish."""
        with self._lock:
            self._stopping = True

    def close(self) -> None:
        """Stops accepting and answers COMPONENT_STOPPING to requests still held."""
        self.stop_accepting()
        with self._lock:
            held = list(self._held)
        stopping = CommandError(ErrorCode.COMPONENT_STOPPING, "the component is stopping")
        for entry in held:
            self._answer(entry, stopping.to_body())
        # No UNSUBSCRIBE: the broker's session keeps the filters, so requests sent while
        # the component is down wait there for its next start (until messaging closes,
        # requests still arriving are answered COMPONENT_STOPPING).

    def close_store(self) -> None:
        """Closes the idempotency store (its journal, and the lock on it); once the
        broker link is closed, since a request served after it would find no store."""
        self._store.close()

    @property
    def held_requests(self) -> int:
        """Requests whose reply is still held (deferred verbs and waiting duplicates)."""
        with self._lock:
            return len(self._held)

    # -- serving --------------------------------------------------------------------------

    def _on_request(self, topic: str, request: Message) -> None:
        held = _Held(request, topic.rpartition("/")[2])
        with self._lock:
            self.stats.requests += 1
        try:
            outcome = self._serve(topic, request, held)
        except CommandError as error:
            outcome = error.to_body()
        except Exception:
            _log.exception("command %s failed in its handler", held.verb)
            outcome = CommandError(ErrorCode.BACKEND_ERROR, "internal error; see the log").to_body()
        if outcome is not None:
            self._answer(held, outcome)

    def _on_overflow(self, topic: str, request: Message) -> None:
        # On the network thread, for a request the full queue refuses: no check, no handler,
        # no store; only a reply built and queued without blocking. A reply that cannot be
        # queued raises, and the subscription counts it in its rate-limited drop line.
        held = _Held(request, topic.rpartition("/")[2])
        with self._lock:
            self.stats.requests += 1
            self.stats.busy += 1
        self._answer(held, self._busy, raise_unsent=True)

    def _serve(self, topic: str, request: Message, held: _Held) -> Mapping[str, Any] | None:
        """The reply body, or None when the reply is held for later."""
        refusal = self._messaging.reply_refusal(request)
        if refusal is not None and refusal is not ReplyRefusal.MISSING:
            # Not run: its sender named a topic no reply goes to, so this is a malformed
            # request (and the answer below is refused, counted and logged by messaging).
            raise bad_args(f"not answered: {refusal.explanation}")
        topic_instance, verb_name = self._address(topic)
        with self._lock:
            if self._stopping:
                raise CommandError(ErrorCode.COMPONENT_STOPPING, "the component is stopping")
            if self._draining:
                raise CommandError(
                    ErrorCode.DEVICE_UNAVAILABLE, "a configuration reload is being applied"
                )
            verb = self._verbs.get(verb_name)
        self._check_deadline(request)
        body = _body_object(request, self._max_body_bytes, self._max_body_depth)
        if verb is None:
            raise bad_args(f"unknown verb sb/{verb_name}; sb/describe lists the verbs")
        if not verb.enabled:
            raise CommandError(
                ErrorCode.UNSUPPORTED_CAPABILITY,
                f"{verb.full_name} is disabled: {verb.disabled_reason}",
            )
        instance = self._instance(verb, topic_instance, body)
        checked = verb.body.check(body)
        request_id = checked.get("requestId")
        if request_id is None and verb.needs_request_id(checked):
            raise bad_args("missing required field requestId")
        context = CommandContext(verb.full_name, instance, checked, request_id, request, topic)
        if verb.kind is Kind.DEFERRED and request.reply_to is None:
            raise CommandError(
                ErrorCode.REPLY_REQUIRED, f"{verb.full_name} holds its reply: send a reply_to"
            )
        # A read-only verb may look things up by requestId (sb/capture-status): that field
        # is an argument there, not an idempotency key.
        if request_id is None or verb.request_id is RequestIdRule.NONE:
            return self._run(verb, context, held, key=None)
        # One namespace per component and scope for every verb: the verb is part of the
        # hashed arguments, so a requestId reused for another verb conflicts.
        key = IdempotencyKey(self._topics.component, instance or "", request_id)
        claim = self._store.claim(key, arguments_hash(verb.name, _arguments(checked)))
        if claim.kind is ClaimKind.NEW:
            return self._run(verb, context, held, key=key)
        if claim.kind is ClaimKind.REPLAY:
            assert claim.outcome is not None
            return claim.outcome
        if claim.kind is ClaimKind.CONFLICT:
            raise CommandError(
                ErrorCode.IDEMPOTENCY_CONFLICT,
                f"requestId {request_id!r} was used with other arguments",
            )
        if claim.kind is ClaimKind.UNKNOWN:
            raise CommandError(
                ErrorCode.PREVIOUS_OUTCOME_UNKNOWN,
                f"requestId {request_id!r} was in progress when the component last stopped",
            )
        assert claim.waiter is not None
        self._hold(held, claim.waiter, key=None)
        return None

    def _check_deadline(self, request: Message) -> None:
        now_ms = time.time() * 1000
        sender_deadline_ms = request_deadline_ms(request)
        if sender_deadline_ms is not None:
            # The sender's own deadline wins, as a per-call value does on its side.
            if now_ms > sender_deadline_ms:
                late_s = (now_ms - sender_deadline_ms) / 1000
                raise CommandError(
                    ErrorCode.DEVICE_UNAVAILABLE,
                    f"the request arrived {late_s:.1f} s after its sender's deadline; not run",
                )
            return
        if not self._deadline_ms:
            return
        waited_ms = now_ms - request.header.timestamp_ms
        if waited_ms > self._deadline_ms:
            # Its sender has given up: running it now would act for nobody.
            raise CommandError(
                ErrorCode.DEVICE_UNAVAILABLE,
                f"the request waited {waited_ms / 1000:.1f} s, past its deadline of "
                f"{self._deadline_ms / 1000:g} s (messaging.requestTimeoutSeconds); not run",
            )

    def _address(self, topic: str) -> tuple[str | None, str]:
        levels = topic[len(self._base) :].split("/") if topic.startswith(self._base) else []
        if len(levels) == 3:
            return None, levels[2]
        if len(levels) == 4:
            return INSTANCE.check(levels[0], "topic instance"), levels[3]
        raise bad_args(f"topic {topic!r} is not a command topic of this component")

    def _instance(
        self, verb: Verb, topic_instance: str | None, body: Mapping[str, Any]
    ) -> str | None:
        body_instance = body.get("instance")
        # Checked first, in every scope.
        if (
            topic_instance is not None
            and body_instance is not None
            and body_instance != topic_instance
        ):
            raise bad_args(
                f"instance {body_instance!r} in the body differs from the topic's "
                f"{topic_instance!r}"
            )
        if verb.scope is Scope.COMPONENT:
            if topic_instance is not None or "instance" in body:
                raise bad_args(f"{verb.full_name} is component-scope: address no instance")
            return None
        instance = topic_instance
        if instance is None and body_instance is not None:
            instance = INSTANCE.check(body_instance, "instance")
        configured = self._instances()
        if instance is not None:
            if instance not in configured:
                raise CommandError(ErrorCode.NO_SUCH_INSTANCE, f"no instance named {instance!r}")
            return instance
        if verb.scope is Scope.INSTANCE:
            return single_instance(configured)
        return None

    def _run(
        self, verb: Verb, context: CommandContext, held: _Held, key: IdempotencyKey | None
    ) -> Mapping[str, Any] | None:
        if verb.paged and "cursor" in context.body:
            # A continuation comes from the first page's snapshot; the handler is not asked.
            return self._settle(key, self._page(verb, context, None))
        try:
            result = verb.handler(context)
        except CommandError as error:
            return self._settle(key, error.to_body())
        except Exception:
            if key is not None:
                # Whether it took effect is unknown: a retry must not run it a second time.
                self._store.complete(key, _INTERNAL_ERROR)
            raise
        if isinstance(result, Future):
            self._hold(held, result, key=key)
            return None
        if isinstance(result, Page):
            result = self._page(verb, context, result)
        elif verb.paged:
            raise TypeError(f"paged verb {verb.full_name} must return a Page")
        return self._settle(key, result)

    def _page(self, verb: Verb, context: CommandContext, page: Page | None) -> dict[str, Any]:
        owner = arguments_hash(f"{verb.name}|{context.instance or ''}", _arguments(context.body))
        limit = int(context.body.get("limit", DEFAULT_LIMIT))
        if page is None:
            sliced = self._cursors.next(owner, str(context.body["cursor"]), limit)
        else:
            sliced = self._cursors.first(owner, page.items, limit, page.extra)
        return {**sliced.extra, "items": sliced.items, "nextCursor": sliced.next_cursor}

    def _settle(self, key: IdempotencyKey | None, outcome: Mapping[str, Any]) -> Mapping[str, Any]:
        if key is not None:
            if failure_code(outcome) in RETRYABLE_CODES:
                self._store.forget(key, outcome)
            else:
                self._store.complete(key, outcome)
        return outcome

    def _hold(
        self, held: _Held, future: Future[Mapping[str, Any]], key: IdempotencyKey | None
    ) -> None:
        with self._lock:
            self._held.add(held)

        def done(finished: Future[Mapping[str, Any]]) -> None:
            error = finished.exception()
            if error is None:
                outcome = finished.result()
            elif isinstance(error, CommandError):
                outcome = error.to_body()
            else:
                _log.error("deferred %s failed", held.verb, exc_info=error)
                outcome = _INTERNAL_ERROR
            self._answer(held, self._settle(key, outcome))

        future.add_done_callback(done)

    def _answer(
        self, held: _Held, outcome: Mapping[str, Any], *, raise_unsent: bool = False
    ) -> None:
        try:
            reply = MessageBuilder(REPLY_NAME, "1.0", self._stamp).body(dict(outcome)).build()
        except EnvelopeError as error:
            # An outcome beyond the envelope's limits (nesting, size) is answered as an
            # internal error, rather than not at all.
            _log.warning("sb/%s: the outcome does not fit an envelope: %s", held.verb, error)
            outcome = _INTERNAL_ERROR
            reply = MessageBuilder(REPLY_NAME, "1.0", self._stamp).body(dict(outcome)).build()
        with self._lock:
            if held.answered:
                return
            held.answered = True
            self._held.discard(held)
            code = failure_code(outcome)
            if code is None:
                self.stats.succeeded += 1
            else:
                self.stats.failed[code] = self.stats.failed.get(code, 0) + 1
        if self._on_outcome is not None:
            # The verb is the topic's last level, chosen by the sender: a label per unknown
            # name would let a client grow the metric series without bound.
            label = held.verb if held.verb in self._verbs else UNKNOWN_VERB_LABEL
            self._on_outcome(label, code or "OK")
        try:
            # False when the request has no reply_to or a refused one; messaging logs it.
            sent = self._messaging.reply(held.request, reply)
        except UnskitError as error:
            if raise_unsent:
                raise
            _log.warning("sb/%s: reply not sent: %s", held.verb, error)
            return
        if not sent:
            with self._lock:
                self.stats.unanswerable += 1

    # -- built-in verbs -------------------------------------------------------------------

    def _describe(self, context: CommandContext) -> Mapping[str, Any]:
        described: dict[str, Any] = {
            "component": self._topics.component,
            "instances": sorted(self._instances()),
            "verbs": [verb.describe() for verb in self.verbs()],
        }
        if context.instance is not None:
            described["instance"] = context.instance
        return described


#: The `verb` label of `commands.replies` for a request naming no registered verb.
UNKNOWN_VERB_LABEL = "(unknown)"

_INTERNAL_ERROR = CommandError(ErrorCode.BACKEND_ERROR, "internal error; see the log").to_body()


def _body_object(request: Message, max_bytes: int, max_depth: int) -> Mapping[str, Any]:
    content_type = request.content_type
    if content_type is not None and not _is_json(content_type):
        # A body declared as something else is not the command its sender meant to send.
        raise bad_args(
            f"the body's content type {content_type[:80]!r} is not JSON; "
            "a command body is a JSON object"
        )
    body = request.body
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_args("the body must be a JSON object")
    # Binary values (which no field accepts) are measured as their JSON marker, not refused
    # here: the field checks name them.
    size = json_size(body)
    if size > max_bytes:
        raise bad_args(
            f"the body is {size} bytes; the bound is {max_bytes} (commands.maxBodyBytes)"
        )
    depths = {name: json_depth(value) for name, value in body.items()}
    deepest = max(depths, key=depths.__getitem__, default=None)
    if deepest is not None and depths[deepest] + 1 > max_depth:
        raise bad_args(
            f"{deepest} nests {depths[deepest]} levels, so the body {depths[deepest] + 1}; "
            f"the bound is {max_depth} (commands.maxBodyDepth)"
        )
    return body


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _arguments(body: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in body.items() if name not in _ROUTING_FIELDS}
