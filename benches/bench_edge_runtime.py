"""The edge runtime (issue 37): ours over the real nucleus's IPC bus beside a bare
`GreengrassCoreIPCClientV2` on the same nucleus, same run.

- publish throughput: 200-byte envelopes at QoS 1 until the nucleus has answered every one
  (ours: `MessagingClient.publish` until the publish backlog is 0; anchor:
  `publish_to_topic_async` of the same bytes as a BinaryMessage, every future awaited);
- request/reply p50 and p99: sequential round trips to a responder acting as another
  component (ours: `MessagingClient.request` and `reply`; anchor: publish, subscribe and a
  reply topic by hand);
- startup: from the nucleus's Popen (and from the nucleus setting the service STARTING) to
  the component's RUNNING in the nucleus's log, `unskit run echo` beside a bare script that
  reports RUNNING with UpdateState (benches/bare_component.py).
"""

from __future__ import annotations

import compileall
import json
import re
import shlex
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.support.greengrass import ALLOW_ALL, Harness, Nucleus
from tests.support.servers import wait_until

from benches.interleaved import compare
from unskit import Message, MessageBuilder
from unskit.config.messaging import IpcConfig
from unskit.config.model import MessagingConfig
from unskit.messaging import MessagingClient, QoS

PROJECT = Path(__file__).resolve().parents[1]
REQUESTER, RESPONDER = "BenchRequester", "BenchResponder"
TARGETS = {"throughput": 0.9, "request_reply": 0.8}
#: Publishes per throughput round (a round is about 0.1-0.4 s on this machine).
BATCH = 1_000
ENVELOPE_BYTES = 200
#: Round trips per interleaved block, and blocks per side: 3,000 samples a side, so the p99
#: is the 30th slowest, not a handful of the machine's stalls.
BLOCK, BLOCKS = 100, 30
#: Nucleus starts per side for the startup rows (each is 4-8 s).
STARTS = 3
_STATE = re.compile(
    r"^(?P<at>\S+) .*service-set-state\. \{serviceName=(?P<name>[^,]+), "
    r"currentState=\S+, newState=(?P<state>[A-Z]+)\}"
)


def envelope(size: int = ENVELOPE_BYTES) -> Message:
    """An envelope whose encoding is `size` bytes (padded in the body)."""

    def build(pad: int) -> Message:
        return MessageBuilder("reading", "1").body({"value": 21.5, "pad": "x" * pad}).build()

    pad = max(0, size - len(build(0).to_bytes()))
    message = build(pad)
    assert abs(len(message.to_bytes()) - size) <= 2, len(message.to_bytes())
    return message


# -- the nucleus and the two clients ------------------------------------------------------


@pytest.fixture(scope="module")
def bus() -> Iterator[Nucleus]:
    """A nucleus with two harness components: the requester (and publisher), the responder."""
    runtime = Nucleus([Harness(REQUESTER), Harness(RESPONDER)]).start()
    yield runtime
    runtime.remove()


def ours(nucleus: Nucleus, component: str) -> MessagingClient:
    config = MessagingConfig(
        local=None,
        local_ipc=IpcConfig(client_id=f"bench-{uuid.uuid4().hex[:8]}"),
        request_timeout_seconds=5,
    )
    client = MessagingClient(config, environ=nucleus.component_env(component)).start()
    assert client.wait_connected(15), "our IPC link did not come up"
    return client


def bare(nucleus: Nucleus, component: str) -> Any:
    """The SDK's V2 client as a component would make it (its default executor), connected
    with the variables the nucleus hands `component`."""
    from awsiot import greengrasscoreipc
    from awsiot.greengrasscoreipc.clientv2 import GreengrassCoreIPCClientV2

    env = nucleus.component_env(component)
    v1 = greengrasscoreipc.connect(
        ipc_socket=env["AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT"],
        authtoken=env["SVCUID"],
    )
    return GreengrassCoreIPCClientV2(client=v1)


def binary(payload: bytes) -> Any:
    from awsiot.greengrasscoreipc import model

    return model.PublishMessage(binary_message=model.BinaryMessage(message=payload))


def record(
    ratio: Callable[..., dict[str, Any]],
    key: str,
    ours_ops: float,
    anchor: str,
    anchor_ops: float,
    target: float | None,
    **extra: Any,
) -> None:
    row = ratio(f"edge.{key}", ours_ops, anchor, anchor_ops, target=target, **extra)
    print(f"\n{row['name']}: ours/anchor = {row['ratio']}x (target {target})")


# -- publish throughput -------------------------------------------------------------------


def test_publish_throughput(
    benchmark: Any, ratio: Callable[..., dict[str, Any]], bus: Nucleus
) -> None:
    benchmark.group = f"edge publish {BATCH} x {ENVELOPE_BYTES} B QoS 1, all answered"
    message = envelope()
    payload = message.to_bytes()
    topic = f"bench/{uuid.uuid4().hex[:8]}/throughput"
    client, anchor = ours(bus, REQUESTER), bare(bus, REQUESTER)
    try:

        def ours_batch() -> None:
            for _ in range(BATCH):
                client.publish(topic + "/ours", message, QoS.AT_LEAST_ONCE)
            # Every publish answered by the nucleus (the backlog counts unanswered QoS 1).
            wait_until(lambda: client.publish_status().backlog == 0, 60, "ours", interval=0.0005)

        def anchor_batch() -> None:
            futures = [
                anchor.publish_to_topic_async(
                    topic=topic + "/anchor", publish_message=binary(payload)
                )
                for _ in range(BATCH)
            ]
            for future in futures:
                future.result(60)

        # The nucleus's JIT warms on both before anything is timed.
        for _ in range(3):
            ours_batch()
            anchor_batch()
        failures_before = client.publish_status().failures
        # A round varies 2-4x with the nucleus and the load (0.09-0.4 s): 0.05 s asks for 30 of
        # each (the best of 15 still moved 0.89-1.31x under a load average of 6).
        ops = compare(benchmark, ours_batch, anchor_batch, 0.05)
        assert client.publish_status().failures == failures_before, "a publish was refused"
    finally:
        client.close()
        anchor.close()
    record(
        ratio,
        "throughput.qos1_200B",
        ops[0] * BATCH,
        "GreengrassCoreIPCClientV2",
        ops[1] * BATCH,
        TARGETS["throughput"],
        envelope_bytes=len(payload),
    )


# -- request/reply ------------------------------------------------------------------------


class BareRoundTrips:
    """The anchor's request/reply: a responder component republishing each request on the
    reply topic, a requester waiting for it."""

    def __init__(self, nucleus: Nucleus, topic: str, payload: bytes) -> None:
        self.topic, self.payload = topic, payload
        self.reply_topic = f"bare/reply-{uuid.uuid4().hex[:8]}"
        self.got = threading.Event()
        self.responder = bare(nucleus, RESPONDER)
        self.requester = bare(nucleus, REQUESTER)
        reply = binary(payload)

        def respond(_event: Any) -> None:
            self.responder.publish_to_topic_async(topic=self.reply_topic, publish_message=reply)

        self.responder.subscribe_to_topic(topic=topic, on_stream_event=respond)
        self.requester.subscribe_to_topic(
            topic=self.reply_topic, on_stream_event=lambda _e: self.got.set()
        )
        wait_until(lambda: self.once(0.2) is not None, 10, "the bare responder", interval=0)

    def once(self, timeout: float = 5.0) -> float | None:
        self.got.clear()
        started = time.perf_counter()
        self.requester.publish_to_topic_async(
            topic=self.topic, publish_message=binary(self.payload)
        )
        if not self.got.wait(timeout):
            return None
        return time.perf_counter() - started

    def close(self) -> None:
        self.requester.close()
        self.responder.close()


class OurRoundTrips:
    def __init__(self, nucleus: Nucleus, topic: str, message: Message) -> None:
        self.topic, self.message = topic, message
        self.requester, self.responder = ours(nucleus, REQUESTER), ours(nucleus, RESPONDER)
        responder = self.responder

        def respond(_topic: str, request: Message) -> None:
            responder.reply(request, message)

        responder.subscribe(topic, respond, max_concurrency=1)
        assert responder.wait_subscribed(10)
        wait_until(lambda: self.answered(), 10, "our responder", interval=0)

    def answered(self) -> bool:
        try:
            self.requester.request(self.topic, self.message, timeout_secs=0.2).get()
        except TimeoutError:
            return False
        return True

    def once(self) -> float:
        started = time.perf_counter()
        self.requester.request(self.topic, self.message, timeout_secs=5).get()
        return time.perf_counter() - started

    def close(self) -> None:
        self.requester.close()
        self.responder.close()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def test_request_reply_latency(
    benchmark: Any, ratio: Callable[..., dict[str, Any]], bus: Nucleus
) -> None:
    benchmark.group = f"edge request/reply {ENVELOPE_BYTES} B"
    message = envelope()
    topic = f"bench/{uuid.uuid4().hex[:8]}/cmd/sb/echo"
    mine, theirs = (
        OurRoundTrips(bus, topic, message),
        BareRoundTrips(bus, topic + "-bare", message.to_bytes()),
    )
    samples: dict[str, list[float]] = {"ours": [], "anchor": []}

    def anchor_once() -> float:
        took = theirs.once()
        assert took is not None, "the bare responder did not answer"
        return took

    try:
        for _ in range(BLOCK):  # warm both paths before anything counts
            mine.once()
            anchor_once()
        # Blocks alternate, so load on this shared machine falls on both sides alike.
        for _ in range(BLOCKS):
            samples["ours"] += [mine.once() for _ in range(BLOCK)]
            samples["anchor"] += [anchor_once() for _ in range(BLOCK)]
        benchmark.pedantic(mine.once, rounds=20, iterations=1, warmup_rounds=1)
    finally:
        mine.close()
        theirs.close()
    ours_p50, ours_p99 = _percentiles(samples["ours"])
    anchor_p50, anchor_p99 = _percentiles(samples["anchor"])
    ms = {
        "ours_p50_ms": round(ours_p50 * 1e3, 3),
        "ours_p99_ms": round(ours_p99 * 1e3, 3),
        "anchor_p50_ms": round(anchor_p50 * 1e3, 3),
        "anchor_p99_ms": round(anchor_p99 * 1e3, 3),
    }
    anchor = "GreengrassCoreIPCClientV2 pub+sub"
    target = TARGETS["request_reply"]
    record(ratio, "request_reply.p50", 1 / ours_p50, anchor, 1 / anchor_p50, target, **ms)
    record(ratio, "request_reply.p99", 1 / ours_p99, anchor, 1 / anchor_p99, target, **ms)
    print(
        f"request/reply: ours p50 {ms['ours_p50_ms']} ms p99 {ms['ours_p99_ms']} ms; "
        f"anchor p50 {ms['anchor_p50_ms']} ms p99 {ms['anchor_p99_ms']} ms"
    )


# -- startup to RUNNING -------------------------------------------------------------------

COMPONENT = "BenchStarted"


def _startup_service(command: str) -> dict[str, Any]:
    path = shlex.quote(f"{PROJECT / 'python'}:{PROJECT}")
    return {
        "version": "1.0.0",
        # The startup step: the nucleus holds the service STARTING until it reports RUNNING.
        "lifecycle": {"startup": f"PYTHONPATH={path} exec {command}"},
        "configuration": {"accessControl": ALLOW_ALL},
    }


def _echo_service(folder: Path) -> dict[str, Any]:
    config = folder / "echo.json"
    config.write_text(
        json.dumps(
            {
                "component": {},
                "hierarchy": {"levels": ["site", "device"]},
                "identity": {"site": "plant-1"},
                # No messaging.local: on the edge runtime the local link is its IPC bus.
                "messaging": {},
                "logging": {"level": "INFO"},
            }
        )
    )
    python = shlex.quote(sys.executable)
    return _startup_service(f"{python} -m unskit.cli run echo -c {shlex.quote(str(config))}")


def _bare_service() -> dict[str, Any]:
    return _startup_service(f"{shlex.quote(sys.executable)} -m benches.bare_component")


def _states(nucleus: Nucleus) -> dict[str, datetime]:
    """When the nucleus first set `COMPONENT` to each state."""
    found: dict[str, datetime] = {}
    for line in nucleus.log().splitlines():
        match = _STATE.match(line)
        if match and match["name"] == COMPONENT:
            at = datetime.fromisoformat(match["at"].replace("Z", "+00:00"))
            found.setdefault(match["state"], at)
    return found


def start_to_running(service: dict[str, Any]) -> tuple[float, float]:
    """Seconds from the nucleus's Popen, and from the service's STARTING, to RUNNING."""
    nucleus = Nucleus([], services={COMPONENT: service})
    try:
        popen = time.time()  # the log's clock: wall time
        nucleus.start()
        wait_until(lambda: "RUNNING" in _states(nucleus), 60, f"{COMPONENT} RUNNING")
        states = _states(nucleus)
        running = states["RUNNING"].timestamp()
        return running - popen, running - states["STARTING"].timestamp()
    except AssertionError:
        print(nucleus.log(COMPONENT)[-3000:])
        raise
    finally:
        # Killed, not stopped: nothing of the run is measured after RUNNING.
        nucleus.kill()
        shutil.rmtree(nucleus.root, ignore_errors=True)


def test_startup_to_running(
    benchmark: Any, ratio: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    benchmark.group = "edge nucleus start to component RUNNING"
    # Bytecode as an installed wheel has it: this machine sets PYTHONDONTWRITEBYTECODE, so
    # the sources on PYTHONPATH would be compiled at every start (about 0.1 s of ours) while
    # the anchor's SDK in site-packages is compiled already. __pycache__ is ignored by git.
    for source in (PROJECT / "python" / "unskit", PROJECT / "benches"):
        assert compileall.compile_dir(source, quiet=1), f"compiling {source}"
    services = {"ours": _echo_service(tmp_path), "anchor": _bare_service()}
    best = {side: (float("inf"), float("inf")) for side in services}
    runs: dict[str, list[list[float]]] = {side: [] for side in services}
    for start in range(STARTS):
        for side, service in services.items():
            if side == "ours" and start == STARTS - 1:
                # pytest-benchmark's table shows ours too: its last start.
                took = benchmark.pedantic(start_to_running, (service,), rounds=1, iterations=1)
            else:
                took = start_to_running(service)
            runs[side].append([round(t, 3) for t in took])
            best[side] = (min(best[side][0], took[0]), min(best[side][1], took[1]))
    anchor = "bare UpdateState(RUNNING)"
    extra = {"ours_runs_s": runs["ours"], "anchor_runs_s": runs["anchor"]}
    record(
        ratio, "startup.popen_to_running", 1 / best["ours"][0], anchor, 1 / best["anchor"][0],
        None, ours_s=round(best["ours"][0], 3), anchor_s=round(best["anchor"][0], 3), **extra,
    )  # fmt: skip
    record(
        ratio, "startup.starting_to_running", 1 / best["ours"][1], anchor, 1 / best["anchor"][1],
        None, ours_s=round(best["ours"][1], 3), anchor_s=round(best["anchor"][1], 3), **extra,
    )  # fmt: skip
    print(f"startup (s, [popen->RUNNING, STARTING->RUNNING]): {runs}")
