"""The command inbox end to end: immediate requests/s through validation, the verb table and
(for a mutating verb) the durable idempotency store, beside raw request/reply of the
messaging client to a bare responder with the same number of requests in flight. Both
responders run in their own process, as a deployed component does, both started before the
first round; the rounds alternate raw, sb/ping and sb/set-point, and each row is the ratio
of the medians, so a spell of load on the shared machine falls on all three sides rather
than on one (single rounds swing 2-3x here)."""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.commands.conftest import sample_document
from tests.support.servers import wait_until

from benches.conftest import connected_client
from unskit.commands import CommandClient
from unskit.envelope import Message, MessageBuilder
from unskit.errors import RequestTimeoutError
from unskit.messaging import RequestFuture

REQUESTS = 3000  # per round and side
ROUNDS = 3
IN_FLIGHT = 64
TARGET_PER_S = 2000
#: Issue 19's target for the idempotent verb against the bare responder.
SET_POINT_TARGET = 0.6
REPO = Path(__file__).resolve().parents[1]


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


@contextlib.contextmanager
def process(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO)
    try:
        yield child
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def test_inbox_immediate_requests_per_second(benchmark, ratio, broker, tmp_path) -> None:
    document = sample_document(broker.plain_port, tmp_path / "state", ["cam-1", "cam-2"])
    document["logging"] = {"level": "WARNING"}
    config = tmp_path / "bench.json"
    config.write_text(json.dumps(document))
    raw_topic = f"bench/{uuid.uuid4().hex[:8]}/cmd/sb/ping"
    client = connected_client(broker.plain_port)
    commands = CommandClient(client, "sample", "gw", root=document["topic"]["root"])
    request = MessageBuilder("CommandRequest", "1.0").body({}).build()

    def answers(send: Callable[[], RequestFuture]) -> bool:
        try:
            return send().get(1) is not None
        except RequestTimeoutError:
            return False

    def expect_ok(reply: Message) -> None:
        assert "errorCode" not in reply.body, reply.body

    rounds: dict[str, list[float]] = {"raw": [], "ping": [], "set-point": []}

    def set_point(round_: int) -> Callable[[int], RequestFuture]:
        return lambda i: commands.send(
            "set-point", {"requestId": f"r{round_}-{i}", "value": i % 1000}, "cam-1"
        )

    def run() -> None:
        with (
            process("benches.raw_responder", str(broker.plain_port), raw_topic),
            process("tests.commands.sample_component", "-c", str(config), "-t", "gw"),
        ):
            wait_until(lambda: answers(lambda: client.request(raw_topic, request, 1)), 20, "raw")
            wait_until(lambda: answers(lambda: commands.send("ping", timeout=1)), 20, "inbox")
            for round_ in range(ROUNDS):
                rounds["raw"].append(
                    drive(lambda _i: client.request(raw_topic, request), expect_ok)
                )
                rounds["ping"].append(drive(lambda _i: commands.send("ping"), expect_ok))
                rounds["set-point"].append(drive(set_point(round_), expect_ok))

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        client.close(1)
    results = {side: statistics.median(rates) for side, rates in rounds.items()}
    for verb in ("ping", "set-point"):
        target = {"target": SET_POINT_TARGET} if verb == "set-point" else {}
        row = ratio(
            f"commands.inbox.{verb}",
            results[verb],
            "raw request/reply (bare responder process)",
            results["raw"],
            **target,
            target_ops_per_s=TARGET_PER_S,
            in_flight=IN_FLIGHT,
            rounds={side: [round(r) for r in rates] for side, rates in rounds.items()},
        )
        print(
            f"\ninbox sb/{verb}: {results[verb]:.0f} req/s (target >= {TARGET_PER_S}); raw "
            f"request/reply {results['raw']:.0f} req/s; ratio {row['ratio']}x"
        )
        assert results[verb] > 0
