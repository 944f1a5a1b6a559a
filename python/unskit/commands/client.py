"""The client side of the inbox: `CommandClient` for Python callers and `unskit call`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import uuid
from collections.abc import Mapping
from typing import Any, TextIO

from unskit.commands.codes import failure_code
from unskit.config.loader import ConfigLoader, add_config_arguments, client_broker
from unskit.config.model import DEFAULT_TOPIC_ROOT
from unskit.envelope import Message, MessageBuilder
from unskit.errors import (
    CommandError,
    ConfigError,
    ConfigIssue,
    MessagingError,
    RequestTimeoutError,
)
from unskit.messaging.client import MessagingClient
from unskit.messaging.requests import RequestFuture
from unskit.topics import TopicScope

__all__ = ["REQUEST_NAME", "CommandClient", "add_call_parser", "call_main", "reply_body"]

#: header.name of the request envelopes the client sends.
REQUEST_NAME = "CommandRequest"

_log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
CONNECT_TIMEOUT_S = 10.0


def reply_body(reply: Message) -> dict[str, Any]:
    """A reply's body as a dict; raises `CommandError` when it is a failure reply."""
    body = reply.body
    if not isinstance(body, dict):
        raise CommandError("BAD_REPLY", f"the reply body is not an object: {body!r}")
    code = failure_code(body)
    if code is not None:
        raise CommandError(code, str(body.get("errorMessage", "")))
    return body


class CommandClient:
    """Sends cmd/sb requests to one component and returns the reply bodies."""

    def __init__(
        self,
        messaging: MessagingClient,
        component: str,
        device: str,
        *,
        root: str = DEFAULT_TOPIC_ROOT,
        root_level: str | None = None,
    ) -> None:
        self.messaging = messaging
        self.scope = TopicScope(root, device, component, root_level=root_level)

    @classmethod
    def for_scope(cls, messaging: MessagingClient, scope: TopicScope) -> CommandClient:
        """A client for the component whose topics `scope` builds."""
        return cls(
            messaging, scope.component, scope.device, root=scope.root, root_level=scope.root_level
        )

    def topic(self, verb: str, instance: str | None = None) -> str:
        """The command topic of `verb` (``capture`` or ``sb/capture``)."""
        name = verb.removeprefix("sb/")
        return self.scope.topic("cmd", "sb", name, instance=instance)

    def send(
        self,
        verb: str,
        body: Mapping[str, Any] | None = None,
        instance: str | None = None,
        timeout: float | None = None,
    ) -> RequestFuture:
        """Sends the request; the future's reply is the raw reply envelope."""
        request = MessageBuilder(REQUEST_NAME, "1.0").body(dict(body or {})).build()
        return self.messaging.request(self.topic(verb, instance), request, timeout_secs=timeout)

    def call(
        self,
        verb: str,
        body: Mapping[str, Any] | None = None,
        instance: str | None = None,
        timeout: float | None = None,
        retries: int = 0,
    ) -> dict[str, Any]:
        """The reply body; `CommandError` on a failure reply, `RequestTimeoutError` when no
        reply comes in time to the first request nor to any of its `retries` re-sends."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number, 0 or more, not {retries!r}")
        for attempt in range(retries + 1):
            try:
                # The same body each time, so the same requestId: the inbox's idempotency
                # record answers a re-sent mutating verb with the first run's outcome.
                return reply_body(self.send(verb, body, instance, timeout).get())
            except RequestTimeoutError as error:
                if attempt == retries:
                    raise
                _log.warning(
                    "sb/%s: %s; re-sending (retry %d of %d)",
                    verb.removeprefix("sb/"),
                    error,
                    attempt + 1,
                    retries,
                )
        raise AssertionError("unreachable")  # pragma: no cover


def call_main(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """`unskit call`: 0 success, 1 an errorCode reply, 2 usage, 3 timeout."""
    try:
        body = json.loads(args.body) if args.body is not None else {}
    except ValueError as error:
        print(f"unskit call: BODY is not JSON: {error}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(body, dict):
        print("unskit call: BODY must be a JSON object", file=sys.stderr)
        return EXIT_USAGE
    try:
        client = _connect(args)
    except (ConfigError, MessagingError) as error:
        print(f"unskit call: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        reply = client.call(
            args.verb, body, instance=args.instance, timeout=args.timeout, retries=args.retries
        )
    except RequestTimeoutError as error:
        print(f"unskit call: {error}", file=sys.stderr)
        return EXIT_TIMEOUT
    except CommandError as error:
        print(f"{error.code}: {error.message}", file=sys.stderr)
        return EXIT_FAILED
    except (MessagingError, ValueError) as error:
        print(f"unskit call: {error}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.messaging.close(1)
    out.write(json.dumps(reply, indent=2 if args.pretty else None) + "\n")
    return EXIT_OK


def _connect(args: argparse.Namespace) -> CommandClient:
    loader = ConfigLoader(
        args.config,
        thing=args.thing,
        platform=args.platform,
        config_source=args.config_source,
        default_component=args.component,
        broker=args.broker,
    )
    document = loader.read()
    if args.component:
        # The topic names this component even when the file names another token.
        document = {
            **document,
            "component": {**document.get("component", {}), "token": args.component},
        }
    elif not isinstance(document.get("component"), Mapping) or not isinstance(
        document["component"].get("token"), str
    ):
        # Unlike `unskit run NAME`, a client has no built-in token to fall back to.
        raise ConfigError(
            [
                ConfigIssue(
                    "--component",
                    "is required: the configuration's component.token names no component, "
                    "so give the component's topic token with --component TOKEN",
                )
            ],
            source=loader.source.location,
        )
    config = loader.resolve(document)
    local = client_broker(config)
    secrets = config.secrets() if config.credentials is not None else None
    # Its own client id: the component's would take the component's session over.
    link = dataclasses.replace(
        config.messaging,
        local=dataclasses.replace(local, client_id=f"unskit-call-{uuid.uuid4().hex[:12]}"),
        northbound=None,
    )
    messaging = MessagingClient(link, secrets=secrets, persistent_session=False)
    messaging.start()
    if not messaging.wait_connected(args.connect_timeout):
        messaging.close(0)
        raise MessagingError(f"cannot connect to the broker of {loader.source.location}")
    return CommandClient.for_scope(messaging, config.topics)


def _retries(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--retries takes a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--retries must be 0 or more, not {value}")
    return value


def add_call_parser(commands: Any) -> None:
    """Adds `call` to the `unskit` command line."""
    parser = commands.add_parser(
        "call",
        help="send a command verb to a component and print the reply body",
        description="Exit codes: 0 success, 1 an errorCode reply (code and message on "
        "stderr), 2 usage or configuration error, 3 no reply before the timeout.",
    )
    parser.add_argument("verb", metavar="VERB", help="e.g. describe, status or sb/capture")
    parser.add_argument("body", metavar="BODY_JSON", nargs="?", help="the body, a JSON object")
    add_config_arguments(parser)
    parser.add_argument("--component", metavar="TOKEN", help="the component's topic token")
    parser.add_argument("--instance", metavar="ID", help="address this instance")
    parser.add_argument("--broker", metavar="HOST:PORT", help="use this broker")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds")
    parser.add_argument(
        "--retries",
        type=_retries,
        default=0,
        metavar="N",
        help="re-send a request that timed out up to N times, with the same body (so the "
        "same requestId); safe for read-only verbs and for mutating verbs given a requestId",
    )
    parser.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S, metavar="S")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    parser.set_defaults(run=call_main)
