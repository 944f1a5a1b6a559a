"""Probe latency while the component's messaging publishes flat out.

A MessagingClient publishes QoS 0 envelopes to a real Mosquitto as fast as it can (and a
second client consumes them) while wrk drives `/readyz` of a HealthServer in the same
process with a probe-like load. The anchor is the same probe load with messaging idle.
Target: p99 under 100 ms, far inside a Kubernetes probe timeout."""

from __future__ import annotations

import threading

from benches.bench_health import run_wrk
from benches.conftest import connected_client
from unskit import MessageBuilder
from unskit.config.model import HealthConfig
from unskit.messaging import QoS
from unskit.runtime.health import HealthServer, ReadinessState

P99_TARGET_MS = 100.0


def _probe(port: int) -> tuple[float, float]:
    run = run_wrk(port, threads=1, connections=4, seconds=5)
    return run.requests_per_s, run.p99_ms


def test_probe_p99_while_messaging_runs_flat_out(benchmark, ratio, broker) -> None:
    publisher, consumer = connected_client(broker.plain_port), connected_client(broker.plain_port)
    received = 0

    def count(_topic: str, _message: object) -> None:
        nonlocal received
        received += 1

    consumer.subscribe("load/#", count, max_concurrency=1)
    readiness = ReadinessState(publisher.connected)
    server = HealthServer(HealthConfig(port=0), readiness, bind_host="127.0.0.1")
    server.start()
    assert server.port is not None
    results: dict[str, tuple[float, float]] = {}
    published = 0
    stop = threading.Event()

    def flood() -> None:
        nonlocal published
        while not stop.is_set():
            message = MessageBuilder("reading", "1").body({"n": published}).build()
            publisher.publish("load/gw/c/data/x", message, QoS.AT_MOST_ONCE)
            published += 1

    def run() -> None:
        results["idle"] = _probe(server.port or 0)
        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        try:
            results["loaded"] = _probe(server.port or 0)
        finally:
            stop.set()
            flooder.join(10)

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        server.stop()
        publisher.close(2)
        consumer.close(2)
    (idle_rps, idle_p99), (loaded_rps, loaded_p99) = results["idle"], results["loaded"]
    row = ratio(
        "health.readyz.p99_under_messaging_load",
        loaded_rps,
        "same probe, messaging idle",
        idle_rps,
        loaded_p99_ms=loaded_p99,
        idle_p99_ms=idle_p99,
        p99_target_ms=P99_TARGET_MS,
        published_during_probe=published,
    )
    print(
        f"\nprobe under load: p99 {loaded_p99:.2f} ms (idle {idle_p99:.2f} ms), "
        f"{loaded_rps:,.0f} req/s, {published:,} messages published meanwhile; "
        f"ratio {row['ratio']}x"
    )
    assert loaded_p99 < P99_TARGET_MS
