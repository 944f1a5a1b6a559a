"""`unskit watch`, `unskit request` and `unskit session forget`: look at UNS traffic, send a
request by hand, and clear a decommissioned gateway's broker session."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import uuid
from typing import Any, TextIO

from unskit.config.model import BrokerConfig, BrokerCredentials, MessagingConfig
from unskit.envelope import Message, MessageBuilder
from unskit.errors import MessagingError, RequestTimeoutError
from unskit.messaging.client import MessagingClient

__all__ = ["add_tool_parsers", "forget_session", "request", "watch"]

CONNECT_TIMEOUT_S = 10.0


def _client(args: argparse.Namespace, role: str, client_id: str | None = None) -> MessagingClient:
    host, _, port = args.broker.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"unskit {role}: --broker expects HOST:PORT, not {args.broker!r}")
    credentials = BrokerCredentials(ca_path=args.ca, cert_path=args.cert, key_path=args.key)
    config = BrokerConfig(
        host=host,
        port=int(port),
        client_id=client_id or f"unskit-{role}-{uuid.uuid4().hex[:8]}",
        credentials=credentials,
    )
    # A throwaway tool leaves no session behind on the broker.
    client = MessagingClient(MessagingConfig(local=config), persistent_session=False).start()
    if not client.wait_connected(args.connect_timeout):
        client.close(0)
        raise SystemExit(f"unskit {role}: cannot connect to {args.broker}")
    return client


def _print(topic: str, message: Message, pretty: bool, out: TextIO) -> None:
    record = {"topic": topic, **message.to_dict()}
    out.write(json.dumps(record, indent=2 if pretty else None) + "\n")
    out.flush()


def watch(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Prints every envelope under FILTER as its JSON projection, one per line (or pretty)."""
    client = _client(args, "watch")
    seen = 0
    done = threading.Event()
    lock = threading.Lock()

    def show(topic: str, message: Message) -> None:
        nonlocal seen
        with lock:
            if done.is_set():
                return
            _print(topic, message, args.pretty, out)
            seen += 1
            if args.count and seen >= args.count:
                done.set()

    try:
        # One worker keeps the printed order the broker's order.
        client.subscribe(args.filter, show, max_concurrency=1)
        done.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        client.close(1)
    rejected = client.stats().rejected
    if rejected:
        print(f"unskit watch: {rejected} payloads were not envelopes", file=sys.stderr)
    return 0


def request(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Sends BODY (JSON text, else a string) as a request to TOPIC and prints the reply."""
    client = _client(args, "request")
    try:
        message = MessageBuilder(args.name, args.version).body(args.body).build()
        reply = client.request(args.topic, message, timeout_secs=args.timeout).get()
    except RequestTimeoutError as error:
        print(f"unskit request: {error}", file=sys.stderr)
        return 1
    except (MessagingError, ValueError, TypeError) as error:
        print(f"unskit request: {error}", file=sys.stderr)
        return 2
    finally:
        client.close(1)
    _print(args.topic, reply, args.pretty, out)
    return 0


def forget_session(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Connects once as CLIENT_ID with a clean session and leaves, so the broker drops the
    persistent session (subscriptions and queued messages) a decommissioned gateway left:
    MQTT 3.1.1 sessions never expire on their own."""
    client = _client(args, "session", client_id=args.client_id)
    client.close(1)
    out.write(f"forgot the session of {args.client_id} on {args.broker}\n")
    return 0


def add_tool_parsers(commands: Any) -> None:
    """Adds `watch`, `request` and `session forget` to the `unskit` command line."""

    def broker_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--broker", default="127.0.0.1:1883", metavar="HOST:PORT")
        parser.add_argument("--ca", metavar="PEM", help="CA file: connect over TLS")
        parser.add_argument("--cert", metavar="PEM", help="client certificate (mutual TLS)")
        parser.add_argument("--key", metavar="PEM", help="client key (mutual TLS)")
        parser.add_argument(
            "--connect-timeout",
            type=float,
            default=CONNECT_TIMEOUT_S,
            metavar="S",
            help=f"give up connecting after S seconds (default {CONNECT_TIMEOUT_S:g})",
        )

    watch_parser = commands.add_parser("watch", help="print decoded envelopes under a filter")
    watch_parser.add_argument("filter", metavar="FILTER", help="topic filter, e.g. 'uns/#'")
    watch_parser.add_argument("--count", type=int, default=0, help="stop after N messages")
    watch_parser.add_argument(
        "--duration", type=float, default=None, help="stop after S seconds (default: Ctrl-C)"
    )
    watch_parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    broker_options(watch_parser)
    watch_parser.set_defaults(run=watch)

    request_parser = commands.add_parser("request", help="send a request, print the reply")
    request_parser.add_argument("topic", metavar="TOPIC")
    request_parser.add_argument("body", metavar="BODY", help="JSON text (else sent as a string)")
    request_parser.add_argument("--timeout", type=float, default=10.0, help="seconds (0 = none)")
    request_parser.add_argument("--name", default="Request", help="the envelope's header.name")
    request_parser.add_argument("--version", default="1.0", help="the envelope's header.version")
    request_parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    broker_options(request_parser)
    request_parser.set_defaults(run=request)

    session_parser = commands.add_parser("session", help="manage broker sessions")
    session_verbs = session_parser.add_subparsers(dest="session_command", required=True)
    forget_parser = session_verbs.add_parser(
        "forget",
        help="drop the persistent session of a decommissioned client (disconnects that "
        "client if it is still connected)",
    )
    forget_parser.add_argument("--client-id", required=True, metavar="ID")
    broker_options(forget_parser)
    forget_parser.set_defaults(run=forget_session)
