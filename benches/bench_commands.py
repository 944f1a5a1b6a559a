"""The command inbox end to end: immediate requests/s through validation, the verb table and
(for a mutating verb) the durable idempotency store, beside raw request/reply of the
messaging client to a bare responder with the same number of requests in flight."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.commands.conftest import sample_document
from tests.commands.sample_component import SampleComponent
from tests.support.servers import wait_until

from benches.conftest import connected_client
from unskit.commands import CommandClient
from unskit.config import ConfigLoader
from unskit.envelope import Message, MessageBuilder
from unskit.messaging import RequestFuture
from unskit.runtime.component import Runtime

REQUESTS = 6000
IN_FLIGHT = 64
TARGET_PER_S = 2000


def drive(send: Callable[[int], RequestFuture], check: Callable[[Message], None]) -> float:
    """Requests/s with IN_FLIGHT requests outstanding at any time."""
    window: list[RequestFuture] = []
    started = time.perf_counter()
    for i in range(REQUESTS):
        if len(window) >= IN_FLIGHT:
            check(window.pop(0).get(30))
        window.append(send(i))
    for future in window:
        check(future.get(30))
    return REQUESTS / (time.perf_counter() - started)


def start_inbox(port: int, state_dir: Path) -> Runtime:
    path = state_dir / "bench.json"
    document = sample_document(port, state_dir / "state", ["cam-1", "cam-2"])
    document["logging"] = {"level": "WARNING"}
    path.write_text(json.dumps(document))
    loader = ConfigLoader(
        path, thing="gw", component_schema=SampleComponent.schema, default_component="sample"
    )
    runtime = Runtime(loader.load()).start(SampleComponent(), loader)
    assert runtime.get_messaging().wait_connected(10)
    return runtime


def test_inbox_immediate_requests_per_second(benchmark, ratio, broker, tmp_path) -> None:
    runtime = start_inbox(broker.plain_port, tmp_path)
    client = connected_client(broker.plain_port)
    commands = CommandClient.for_scope(client, runtime.topics)
    wait_until(lambda: commands.send("ping").get(1) is not None, 10, "the inbox")

    responder = connected_client(broker.plain_port)
    raw_topic = f"bench/{uuid.uuid4().hex[:8]}/cmd/sb/ping"
    pong = MessageBuilder("CommandReply", "1.0").body({"pong": True}).build()
    responder.subscribe(raw_topic, lambda _t, request: responder.reply(request, pong))
    request = MessageBuilder("CommandRequest", "1.0").body({}).build()
    wait_until(lambda: client.request(raw_topic, request).get(1) is not None, 10, "responder")

    def expect_ok(reply: Message) -> None:
        assert "errorCode" not in reply.body, reply.body

    results: dict[str, float] = {}

    def run() -> None:
        results["raw"] = drive(lambda _i: client.request(raw_topic, request), expect_ok)
        results["ping"] = drive(lambda _i: commands.send("ping"), expect_ok)
        results["set-point"] = drive(
            lambda i: commands.send(
                "set-point", {"requestId": f"r{i}", "value": i % 1000}, "cam-1"
            ),
            expect_ok,
        )

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        for messaging in (client, responder):
            messaging.close(1)
        runtime.shutdown()
    for verb in ("ping", "set-point"):
        row = ratio(
            f"commands.inbox.{verb}",
            results[verb],
            "raw request/reply (bare responder)",
            results["raw"],
            target_ops_per_s=TARGET_PER_S,
            in_flight=IN_FLIGHT,
        )
        print(
            f"\ninbox sb/{verb}: {results[verb]:.0f} req/s (target >= {TARGET_PER_S}); raw "
            f"request/reply {results['raw']:.0f} req/s; ratio {row['ratio']}x"
        )
        assert results[verb] > 0
