"""Metrics: registry semantics, the log/scrape/cloudmon/messaging targets and the emit loop."""

from __future__ import annotations

import http.client
import io
import json
import logging
import math
import re
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.openmetrics import parser as om_parser
from prometheus_client.parser import text_string_to_metric_families as text_parser
from tests.support.tiers import server_fixture

from unskit import Identity, Message
from unskit.runtime.metrics import (
    CLOUDMON_MAX_METRICS_PER_LINE,
    PROMETHEUS_CONTENT_TYPE,
    CloudmonEmitter,
    LogEmitter,
    MessagingEmitter,
    MetricEmissionConfig,
    MetricKind,
    MetricsRegistry,
    MetricsReporter,
    MetricTarget,
    ScrapeEmitter,
    create_emitter,
    render_prometheus,
)
from unskit.topics import TopicScope

FAMILY = "southbound_health"
T0 = 1_700_000_000_000
WAIT = 5.0


class RecordingPublisher:
    """Collects what was published, as the bytes a broker would carry."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()

    def publish(self, topic: str, message: Message) -> None:
        with self._lock:
            self.published.append((topic, message.to_bytes()))

    def decoded(self) -> list[tuple[str, Message]]:
        with self._lock:
            return [(topic, Message.from_bytes(raw)) for topic, raw in self.published]


class RecordingEmitter:
    """An emitter that keeps every emit and signals each one."""

    def __init__(self, fail_first: int = 0) -> None:
        self.emits: list[tuple[list, int]] = []
        self.closed = 0
        self.fail_first = fail_first
        self.calls = 0
        self.changed = threading.Condition()

    def emit(self, samples, timestamp_ms):
        with self.changed:
            self.calls += 1
            self.changed.notify_all()
            if self.calls <= self.fail_first:
                raise RuntimeError("broker away")
            self.emits.append((list(samples), timestamp_ms))
            self.changed.notify_all()

    def close(self):
        self.closed += 1

    def wait_for_calls(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.calls >= count, timeout=WAIT)


@pytest.fixture
def stamp():
    return SimpleNamespace(
        identity=Identity("site/device", "plant-1/dev-1", "cip"), tags={"line": "A"}
    )


def by_name(samples):
    return {(s.name, s.dimensions.get("instance")): s for s in samples}


def test_counter_interval_resets_at_emit_and_total_never(tmp_path):
    registry = MetricsRegistry()
    reads = registry.counter(FAMILY, "reads", {"instance": "plc-1"})
    emitter = RecordingEmitter()
    reporter = MetricsReporter(registry, emitter, 3600, clock_ms=lambda: T0)
    reads.inc(3)
    first = by_name(reporter.emit_now())[("reads", "plc-1")]
    reads.inc(2)
    second = by_name(reporter.emit_now())[("reads", "plc-1")]
    third = by_name(reporter.emit_now())[("reads", "plc-1")]
    assert (first.value, first.total) == (3, 3)
    assert (second.value, second.total) == (2, 5)
    assert (third.value, third.total) == (0, 5)
    assert reads.interval == 0
    assert reads.total == 5
    assert [e[0][0].value for e in emitter.emits] == [3, 2, 0]


def test_gauge_keeps_its_value_across_emits():
    registry = MetricsRegistry()
    connected = registry.gauge(FAMILY, "connected", {"instance": "plc-1"})
    connected.set(1)
    connected.inc(2)
    connected.dec(0.5)
    first = registry.collect(reset_interval=True)
    second = registry.collect(reset_interval=True)
    assert first[0].value == 2.5
    assert second[0].value == 2.5
    assert second[0].kind is MetricKind.GAUGE
    assert second[0].total is None


@pytest.mark.parametrize("amount", [-1, float("nan"), True, "1"])
def test_counter_only_grows(amount):
    counter = MetricsRegistry().counter(FAMILY, "reads")
    with pytest.raises(ValueError, match="only grows"):
        counter.inc(amount)
    assert counter.total == 0


def test_same_coordinates_give_the_same_metric():
    registry = MetricsRegistry()
    a = registry.counter(FAMILY, "reads", {"instance": "plc-1", "pollGroup": "fast"})
    b = registry.counter(FAMILY, "reads", {"pollGroup": "fast", "instance": "plc-1"})
    c = registry.counter(FAMILY, "reads", {"instance": "plc-2", "pollGroup": "fast"})
    assert a is b
    assert a is not c


def test_a_name_keeps_its_kind():
    registry = MetricsRegistry()
    registry.counter(FAMILY, "reads")
    with pytest.raises(ValueError, match="another kind"):
        registry.gauge(FAMILY, "reads")


def test_an_observed_gauge_is_read_at_each_collect(caplog):
    registry = MetricsRegistry({"component": "cam"})
    depth = [3]
    registry.observe("queues", "depth", lambda: depth[0], {"queue": "inbox"})

    def broken() -> int:
        raise RuntimeError("the queue is gone")

    registry.observe("queues", "depth", broken, {"queue": "broken"})

    def read() -> dict[str, object]:
        return {
            m.dimensions["queue"]: (m.kind, m.value, m.total)
            for m in registry.collect(reset_interval=True)
        }

    with caplog.at_level(logging.ERROR):
        assert read() == {"inbox": (MetricKind.GAUGE, 3, None)}
    assert "queues/depth: reading it failed" in caplog.text
    depth[0] = 7
    assert read()["inbox"] == (MetricKind.GAUGE, 7, None)
    with pytest.raises(ValueError, match="another kind"):
        registry.counter("queues", "depth", {"queue": "inbox"})
    registry.counter("queues", "drops", {"queue": "inbox"})
    with pytest.raises(ValueError, match="another kind"):
        registry.observe("queues", "drops", lambda: 1, {"queue": "inbox"})
    assert registry.remove({"queue": "inbox"}) == 2
    assert read() == {}


@pytest.mark.parametrize(
    ("family", "name", "dimensions"),
    [
        ("", "reads", None),
        (FAMILY, "", None),
        ("a/b", "reads", None),
        (FAMILY, "re#ads", None),
        (FAMILY, "reads", {"instance": ""}),
        (FAMILY, "reads", {"": "x"}),
        (FAMILY, "reads", {"instance": 3}),
    ],
)
def test_invalid_coordinates_are_refused(family, name, dimensions):
    with pytest.raises(ValueError):  # noqa: PT011 - several messages, one rule
        MetricsRegistry().counter(family, name, dimensions)


def test_common_dimensions_are_added_to_every_metric():
    registry = MetricsRegistry({"component": "ethernet-ip-adapter"})
    registry.counter(FAMILY, "reads", {"instance": "plc-1"}).inc()
    [sample] = registry.collect(reset_interval=False)
    assert dict(sample.dimensions) == {"component": "ethernet-ip-adapter", "instance": "plc-1"}


def test_remove_forgets_an_instances_metrics():
    registry = MetricsRegistry()
    registry.counter(FAMILY, "reads", {"instance": "plc-1"}).inc()
    registry.gauge(FAMILY, "connected", {"instance": "plc-1"}).set(1)
    registry.counter(FAMILY, "reads", {"instance": "plc-2"}).inc()
    assert registry.remove({"instance": "plc-1"}) == 2
    assert [s.dimensions["instance"] for s in registry.collect(reset_interval=False)] == ["plc-2"]


def test_concurrent_increments_and_resets_lose_nothing():
    registry = MetricsRegistry()
    counter = registry.counter(FAMILY, "reads")
    threads_n, per_thread = 8, 5000
    start = threading.Barrier(threads_n + 1)
    collected = []

    def work():
        start.wait()
        for _ in range(per_thread):
            counter.inc()

    workers = [threading.Thread(target=work) for _ in range(threads_n)]
    for worker in workers:
        worker.start()
    start.wait()
    while any(w.is_alive() for w in workers):
        collected.append(registry.collect(reset_interval=True)[0].value)
    for worker in workers:
        worker.join()
    collected.append(registry.collect(reset_interval=True)[0].value)
    assert counter.total == threads_n * per_thread
    assert sum(collected) == threads_n * per_thread


# --- log -------------------------------------------------------------------------------


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_log_target_writes_one_structured_line_per_emit():
    logger = logging.getLogger("unskit.test.metrics.log")
    handler = ListHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        registry = MetricsRegistry()
        reads = registry.counter(FAMILY, "reads", {"instance": "plc-1"})
        registry.gauge(FAMILY, "connected", {"instance": "plc-1"}).set(1)
        reporter = MetricsReporter(registry, LogEmitter(logger), 3600, clock_ms=lambda: T0)
        reads.inc(4)
        reporter.emit_now()
        reads.inc(1)
        reporter.emit_now()
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert len(handler.records) == 2
    documents = [json.loads(record.getMessage()) for record in handler.records]
    assert documents[0]["timestamp"] == "2023-11-14T22:13:20.000Z"
    first = {m["name"]: m for m in documents[0]["metrics"]}
    second = {m["name"]: m for m in documents[1]["metrics"]}
    assert first["reads"] == {
        "family": FAMILY,
        "name": "reads",
        "kind": "counter",
        "unit": "Count",
        "dimensions": {"instance": "plc-1"},
        "value": 4,
        "total": 4,
    }
    assert (second["reads"]["value"], second["reads"]["total"]) == (1, 5)
    assert second["connected"]["value"] == 1
    assert "total" not in second["connected"]


# --- scrape ----------------------------------------------------------------------------


def parse_exposition(text: str, openmetrics: bool = False):
    """Parses an exposition with prometheus_client's own parser.

    Returns ({exposed family name: type}, {(sample name, labels): value}); the parser
    rejects anything that is not the format, so a malformed line fails the test."""
    parse = om_parser.text_string_to_metric_families if openmetrics else text_parser
    types, values = {}, {}
    for family in parse(text):
        exposed = family.name + "_total" if family.type == "counter" else family.name
        types[exposed] = family.type
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return types, values


@server_fixture
def scrape_registry():
    registry = MetricsRegistry({"component": "cip"})
    emitter = ScrapeEmitter(registry, "127.0.0.1", 0)
    emitter.start()
    yield registry, emitter
    emitter.close()


def test_scrape_endpoint_serves_the_exposition_format(scrape_registry):
    registry, emitter = scrape_registry
    reads = registry.counter(FAMILY, "reads", {"instance": "plc-1"})
    registry.gauge(FAMILY, "connected", {"instance": "plc-1"}).set(1)
    registry.counter("OpcUaCommand", "estEnrollments").inc(2)
    reads.inc(3)
    MetricsReporter(registry, emitter, 3600).emit_now()  # resets intervals, not totals
    reads.inc(4)
    url = f"http://127.0.0.1:{emitter.port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == PROMETHEUS_CONTENT_TYPE
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode("utf-8")
    types, values = parse_exposition(text)
    assert types == {
        "southbound_health_reads_total": "counter",
        "southbound_health_connected": "gauge",
        "OpcUaCommand_estEnrollments_total": "counter",
    }
    labels = frozenset({("component", "cip"), ("instance", "plc-1")})
    assert values[("southbound_health_reads_total", labels)] == 7
    assert values[("southbound_health_connected", labels)] == 1
    assert values[("OpcUaCommand_estEnrollments_total", frozenset({("component", "cip")}))] == 2


def test_scrape_unknown_path_is_404(scrape_registry):
    _, emitter = scrape_registry
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"http://127.0.0.1:{emitter.port}/other", timeout=WAIT)
    assert caught.value.code == 404
    caught.value.close()


def test_scrape_query_string_is_ignored(scrape_registry):
    registry, emitter = scrape_registry
    registry.gauge(FAMILY, "connected").set(1)
    url = f"http://127.0.0.1:{emitter.port}/metrics?name[]=x"
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        assert "southbound_health_connected" in response.read().decode()


def test_scrape_non_get_is_501(scrape_registry):
    _, emitter = scrape_registry
    connection = http.client.HTTPConnection("127.0.0.1", emitter.port, timeout=WAIT)
    try:
        connection.request("POST", "/metrics", body=b"")
        assert connection.getresponse().status == 501
    finally:
        connection.close()


@pytest.mark.integration
def test_scrape_close_releases_the_port():
    emitter = ScrapeEmitter(MetricsRegistry(), "127.0.0.1", 0)
    emitter.start()
    port = emitter.port
    emitter.close()
    emitter.close()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT).connect()


def test_prometheus_names_and_labels_are_escaped():
    registry = MetricsRegistry()
    registry.gauge("opc.ua-2", "9lives", {"node id": 'ns=2;s="a\\b"\nc'}).set(1.5)
    registry.counter(FAMILY, "bytes_total").inc(2)
    text = render_prometheus(registry.collect(reset_interval=False))
    assert 'opc_ua_2_9lives{node_id="ns=2;s=\\"a\\\\b\\"\\nc"} 1.5\n' in text
    # A counter already named ..._total is not suffixed twice (the library writes values
    # as floats: 2.0 where the hand-written exposition wrote 2).
    assert "southbound_health_bytes_total 2.0\n" in text
    types, _ = parse_exposition(text)
    assert types == {"opc_ua_2_9lives": "gauge", "southbound_health_bytes_total": "counter"}


def test_prometheus_non_finite_values():
    registry = MetricsRegistry()
    registry.gauge(FAMILY, "a").set(float("nan"))
    registry.gauge(FAMILY, "b").set(float("inf"))
    registry.gauge(FAMILY, "c").set(float("-inf"))
    text = render_prometheus(registry.collect(reset_interval=False))
    assert "southbound_health_a NaN\n" in text
    assert "southbound_health_b +Inf\n" in text
    assert "southbound_health_c -Inf\n" in text


def _scrape(port: int, accept: str | None) -> tuple[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=WAIT) as response:
        assert response.status == 200
        return response.headers["Content-Type"], response.read().decode("utf-8")


def _fill(registry: MetricsRegistry) -> None:
    registry.counter(FAMILY, "reads", {"instance": "plc-1"}).inc(3)
    registry.counter(FAMILY, "reads", {"instance": "plc-2", "slot": "4"}).inc(5)
    registry.gauge(FAMILY, "connected", {"instance": "plc-1"}).set(1)
    registry.gauge(FAMILY, "lag").set(float("nan"))
    registry.gauge(FAMILY, "ceiling").set(float("inf"))


EXPECTED_TYPES = {
    "southbound_health_reads_total": "counter",
    "southbound_health_connected": "gauge",
    "southbound_health_lag": "gauge",
    "southbound_health_ceiling": "gauge",
}


def _check_values(values: dict) -> None:
    cip = ("component", "cip")
    assert values[("southbound_health_reads_total", frozenset({cip, ("instance", "plc-1")}))] == 3
    plc2 = frozenset({cip, ("instance", "plc-2"), ("slot", "4")})
    assert values[("southbound_health_reads_total", plc2)] == 5
    assert values[("southbound_health_connected", frozenset({cip, ("instance", "plc-1")}))] == 1
    assert math.isnan(values[("southbound_health_lag", frozenset({cip}))])
    assert values[("southbound_health_ceiling", frozenset({cip}))] == math.inf


@pytest.mark.parametrize(
    ("accept", "content_type", "openmetrics"),
    [
        (None, "text/plain; version=0.0.4; charset=utf-8", False),
        ("text/plain", "text/plain; version=0.0.4; charset=utf-8", False),
        ("*/*", "text/plain; version=0.0.4; charset=utf-8", False),
        ("text/plain; version=1.0.0", "text/plain; version=1.0.0; charset=utf-8", False),
        (
            "application/openmetrics-text; version=1.0.0; q=0.9, text/plain; q=0.5",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            True,
        ),
        ("application/openmetrics-text", "application/openmetrics-text; version=1.0.0", True),
    ],
)
def test_scrape_negotiates_the_format_by_accept(scrape_registry, accept, content_type, openmetrics):
    """Text 0.0.4 unless OpenMetrics (or text 1.0.0) is asked for; each parses as its format."""
    registry, emitter = scrape_registry
    _fill(registry)
    served_type, text = _scrape(emitter.port, accept)
    assert served_type.startswith(content_type), served_type
    assert text.endswith("# EOF\n") == openmetrics
    types, values = parse_exposition(text, openmetrics=openmetrics)
    assert types == EXPECTED_TYPES
    _check_values(values)


def test_openmetrics_parser_rejects_the_text_format(scrape_registry):
    """The negotiation matters: a text-format body is not valid OpenMetrics (no # EOF)."""
    registry, emitter = scrape_registry
    _fill(registry)
    _, text = _scrape(emitter.port, None)
    # Which fault the parser meets first depends on the families' order: the text format's
    # `# TYPE x_total counter` (a clash in OpenMetrics) or the missing `# EOF`.
    with pytest.raises(ValueError, match=r"Clashing name|Missing # EOF"):
        parse_exposition(text, openmetrics=True)


# --- cloudmon --------------------------------------------------------------------------


def assert_emf_line(document: dict) -> None:
    """The structural rules of the embedded metric format."""
    aws = document["_aws"]
    assert isinstance(aws["Timestamp"], int)
    [directive] = aws["CloudWatchMetrics"]
    assert isinstance(directive["Namespace"], str)
    assert directive["Namespace"]
    for dimension_set in directive["Dimensions"]:
        assert 1 <= len(dimension_set) <= 30
        for dimension in dimension_set:
            assert isinstance(document[dimension], str)
    assert 1 <= len(directive["Metrics"]) <= CLOUDMON_MAX_METRICS_PER_LINE
    for metric in directive["Metrics"]:
        assert set(metric) <= {"Name", "Unit", "StorageResolution"}
        value = document[metric["Name"]]
        assert isinstance(value, (int, float))
        assert not isinstance(value, bool)


def test_cloudmon_lines_are_embedded_metric_format():
    registry = MetricsRegistry({"component": "cip"})
    reads = registry.counter(FAMILY, "reads", {"instance": "plc-1"})
    registry.gauge(FAMILY, "connected", {"instance": "plc-1"}).set(1)
    registry.counter(FAMILY, "reads", {"instance": "plc-2"}).inc(9)
    stream = io.StringIO()
    reporter = MetricsReporter(
        registry, CloudmonEmitter("factory/edge", stream), 3600, clock_ms=lambda: T0
    )
    reads.inc(3)
    reporter.emit_now()
    reads.inc(2)
    reporter.emit_now()
    lines = stream.getvalue().splitlines()
    documents = [json.loads(line) for line in lines]
    assert len(documents) == 4  # two dimension sets, two emits
    for document in documents:
        assert_emf_line(document)
        assert document["_aws"]["Timestamp"] == T0
        assert document["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "factory/edge"
        assert document["family"] == FAMILY
    plc1 = [d for d in documents if d["instance"] == "plc-1"]
    assert [d["reads"] for d in plc1] == [3, 2]  # interval values
    assert plc1[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        ["family", "component", "instance"]
    ]
    units = {m["Name"]: m["Unit"] for m in plc1[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert units == {"reads": "Count", "connected": "None"}


def test_cloudmon_splits_more_than_100_metrics():
    registry = MetricsRegistry()
    for i in range(CLOUDMON_MAX_METRICS_PER_LINE + 5):
        registry.gauge(FAMILY, f"m{i}").set(i)
    lines = CloudmonEmitter().render(registry.collect(reset_interval=True), T0)
    documents = [json.loads(line) for line in lines]
    for document in documents:
        assert_emf_line(document)
    counts = [len(d["_aws"]["CloudWatchMetrics"][0]["Metrics"]) for d in documents]
    assert counts == [CLOUDMON_MAX_METRICS_PER_LINE, 5]


def test_cloudmon_leaves_out_non_finite_values():
    registry = MetricsRegistry()
    registry.gauge(FAMILY, "latency").set(float("nan"))
    registry.gauge(FAMILY, "connected").set(1)
    [line] = CloudmonEmitter().render(registry.collect(reset_interval=True), T0)
    document = json.loads(line)
    assert_emf_line(document)
    assert "latency" not in document
    assert document["connected"] == 1


def test_cloudmon_writes_to_stdout_by_default(capsys):
    registry = MetricsRegistry()
    registry.gauge(FAMILY, "connected").set(1)
    CloudmonEmitter().emit(registry.collect(reset_interval=True), T0)
    [line] = capsys.readouterr().out.splitlines()
    assert_emf_line(json.loads(line))


# --- messaging -------------------------------------------------------------------------


def test_messaging_target_publishes_on_the_minted_metric_topic(stamp):
    publisher = RecordingPublisher()
    scope = TopicScope("uns", "dev-1", "ethernet-ip-adapter")
    registry = MetricsRegistry()
    registry.counter(FAMILY, "reads", {"instance": "plc-1", "pollGroup": "fast"}).inc(3)
    registry.gauge("process", "threads").set(7)
    emitter = MessagingEmitter(publisher, scope, stamp=stamp)
    MetricsReporter(registry, emitter, 3600, clock_ms=lambda: T0).emit_now()
    published = dict(publisher.decoded())
    assert set(published) == {
        "uns/dev-1/ethernet-ip-adapter/plc-1/metric/southbound_health",
        "uns/dev-1/ethernet-ip-adapter/metric/process",
    }
    instance_message = published["uns/dev-1/ethernet-ip-adapter/plc-1/metric/southbound_health"]
    assert instance_message.header.name == "Metrics"
    assert instance_message.header.version == "1.0"
    assert instance_message.header.timestamp_ms == T0
    assert instance_message.identity.instance == "plc-1"
    assert instance_message.tags == {"line": "A"}
    assert instance_message.body == {
        "family": FAMILY,
        "instance": "plc-1",
        "metrics": [
            {
                "name": "reads",
                "kind": "counter",
                "unit": "Count",
                "dimensions": {"pollGroup": "fast"},
                "value": 3,
                "total": 3,
            }
        ],
    }
    component_message = published["uns/dev-1/ethernet-ip-adapter/metric/process"]
    assert component_message.identity.instance is None
    assert component_message.body["metrics"][0]["value"] == 7


def test_messaging_without_a_stamp_still_names_the_instance():
    publisher = RecordingPublisher()
    registry = MetricsRegistry()
    registry.counter(FAMILY, "reads", {"instance": "plc-1"}).inc()
    MessagingEmitter(publisher, TopicScope("uns", "dev-1", "cip")).emit(
        registry.collect(reset_interval=True), T0
    )
    [(topic, message)] = publisher.decoded()
    assert topic == "uns/dev-1/cip/plc-1/metric/southbound_health"
    assert message.identity is None
    assert message.body["instance"] == "plc-1"


def test_messaging_publish_failure_does_not_stop_other_families(caplog):
    class Flaky(RecordingPublisher):
        def publish(self, topic, message):
            if topic.endswith("/first"):
                raise ConnectionError("broker away")
            super().publish(topic, message)

    publisher = Flaky()
    registry = MetricsRegistry()
    registry.gauge("first", "a").set(1)
    registry.gauge("second", "b").set(2)
    with caplog.at_level(logging.ERROR, logger="unskit.runtime.metrics"):
        MessagingEmitter(publisher, TopicScope("uns", "dev-1", "cip")).emit(
            registry.collect(reset_interval=True), T0
        )
    assert [topic for topic, _ in publisher.decoded()] == ["uns/dev-1/cip/metric/second"]
    assert "first" in caplog.text


@pytest.mark.parametrize(("destination", "chosen"), [("local", 0), ("cloud", 1), (None, 0)])
def test_destination_selects_the_publisher(destination, chosen):
    publishers = [RecordingPublisher(), RecordingPublisher()]
    target_config = {} if destination is None else {"destination": destination}
    config = MetricEmissionConfig.from_section(
        {"target": "messaging", "targetConfig": target_config}
    )
    registry = MetricsRegistry()
    registry.gauge(FAMILY, "connected").set(1)
    emitter = create_emitter(
        config,
        registry,
        scope=TopicScope("uns", "dev-1", "cip"),
        local=publishers[0],
        cloud=publishers[1],
    )
    emitter.emit(registry.collect(reset_interval=True), T0)
    assert len(publishers[chosen].published) == 1
    assert publishers[1 - chosen].published == []


def test_missing_destination_publisher_is_refused():
    config = MetricEmissionConfig.from_section(
        {"target": "messaging", "targetConfig": {"destination": "cloud"}}
    )
    with pytest.raises(ValueError, match=r"metricEmission\.targetConfig\.destination"):
        create_emitter(
            config,
            MetricsRegistry(),
            scope=TopicScope("uns", "dev-1", "cip"),
            local=RecordingPublisher(),
        )


# --- configuration ---------------------------------------------------------------------


def test_metric_emission_defaults():
    assert MetricEmissionConfig.from_section(None) == MetricEmissionConfig()
    config = MetricEmissionConfig.from_section({})
    assert config.target is MetricTarget.LOG
    assert config.destination == "local"
    assert (config.host, config.port, config.path) == ("0.0.0.0", 9464, "/metrics")
    assert config.namespace == "unskit"


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"target": "statsd"}, "metricEmission.target"),
        ({"targetConfig": {"topic": "x/y"}}, "metricEmission.targetConfig.topic"),
        (
            {"targetConfig": {"destination": "northbound"}},
            "metricEmission.targetConfig.destination",
        ),
        ({"targetConfig": {"port": 70000}}, "metricEmission.targetConfig.port"),
        ({"targetConfig": {"port": "9464"}}, "metricEmission.targetConfig.port"),
        ({"targetConfig": {"path": "metrics"}}, "metricEmission.targetConfig.path"),
        ({"targetConfig": {"host": ""}}, "metricEmission.targetConfig.host"),
        ({"targetConfig": {"namespace": ""}}, "metricEmission.targetConfig.namespace"),
        ({"targetConfig": []}, "metricEmission.targetConfig"),
        ([], "metricEmission"),
    ],
)
def test_metric_emission_invalid_values_name_the_key(section, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        MetricEmissionConfig.from_section(section)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"enabled": "yes"}, "metricEmission.enabled"),
        ({"intervalSeconds": 0}, "metricEmission.intervalSeconds"),
        ({"intervalSeconds": True}, "metricEmission.intervalSeconds"),
    ],
)
def test_metric_emission_enabled_and_interval_are_checked(section, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        MetricEmissionConfig.from_section(section)


def test_metric_emission_built_directly_takes_a_target_name():
    config = MetricEmissionConfig(target="scrape", interval_seconds=5)  # type: ignore[arg-type]
    assert config.target is MetricTarget.SCRAPE
    assert config.interval_seconds == 5.0
    assert config == MetricEmissionConfig.from_section({"target": "scrape", "intervalSeconds": 5})


@pytest.mark.integration
def test_create_emitter_per_target(capsys):
    registry = MetricsRegistry()
    registry.gauge(FAMILY, "connected").set(1)
    log_emitter = create_emitter(MetricEmissionConfig.from_section({"target": "log"}), registry)
    assert isinstance(log_emitter, LogEmitter)
    cloudmon = create_emitter(
        MetricEmissionConfig.from_section(
            {"target": "cloudmon", "targetConfig": {"namespace": "ns"}}
        ),
        registry,
    )
    cloudmon.emit(registry.collect(reset_interval=True), T0)
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "ns"
    scrape = create_emitter(
        MetricEmissionConfig.from_section(
            {"target": "scrape", "targetConfig": {"host": "127.0.0.1", "port": 0}}
        ),
        registry,
    )
    try:
        assert isinstance(scrape, ScrapeEmitter)
        with urllib.request.urlopen(f"http://127.0.0.1:{scrape.port}/metrics", timeout=WAIT) as r:
            assert "southbound_health_connected 1" in r.read().decode()
    finally:
        scrape.close()


# --- emit loop -------------------------------------------------------------------------


def test_reporter_emits_every_interval():
    registry = MetricsRegistry()
    registry.counter(FAMILY, "reads").inc()
    emitter = RecordingEmitter()
    reporter = MetricsReporter(registry, emitter, 0.02)
    reporter.start()
    try:
        assert emitter.wait_for_calls(3)
    finally:
        reporter.stop(flush=False)
    assert emitter.emits[0][0][0].value == 1
    assert emitter.emits[1][0][0].value == 0


def test_reporter_stops_promptly_in_a_long_interval():
    emitter = RecordingEmitter()
    reporter = MetricsReporter(MetricsRegistry(), emitter, 3600)
    reporter.start()
    assert reporter.running
    began = time.monotonic()
    reporter.stop()
    assert time.monotonic() - began < 1.0
    assert not reporter.running
    assert emitter.closed == 1


def test_reporter_stop_flushes_the_partial_interval():
    registry = MetricsRegistry()
    emitter = RecordingEmitter()
    reporter = MetricsReporter(registry, emitter, 3600)
    reporter.start()
    registry.counter(FAMILY, "reads").inc(5)
    reporter.stop()
    [(samples, _)] = emitter.emits
    assert samples[0].value == 5
    reporter.stop()  # idempotent: no second flush or close
    assert len(emitter.emits) == 1
    assert emitter.closed == 1


def test_reporter_stop_without_flush_emits_nothing():
    registry = MetricsRegistry()
    registry.counter(FAMILY, "reads").inc(5)
    emitter = RecordingEmitter()
    reporter = MetricsReporter(registry, emitter, 3600)
    reporter.start()
    reporter.stop(flush=False)
    assert emitter.calls == 0


def test_reporter_survives_a_failing_emit(caplog):
    registry = MetricsRegistry()
    registry.counter(FAMILY, "reads").inc()
    emitter = RecordingEmitter(fail_first=1)
    reporter = MetricsReporter(registry, emitter, 0.02)
    with caplog.at_level(logging.ERROR, logger="unskit.runtime.metrics"):
        reporter.start()
        try:
            assert emitter.wait_for_calls(2)
        finally:
            reporter.stop(flush=False)
    assert len(emitter.emits) >= 1
    assert "metric emission failed" in caplog.text


@pytest.mark.parametrize("interval", [0, -1, float("nan"), "60"])
def test_reporter_interval_must_be_positive(interval):
    with pytest.raises(ValueError, match="interval"):
        MetricsReporter(MetricsRegistry(), RecordingEmitter(), interval)


def test_a_shorter_interval_applies_at_once():
    emitter = RecordingEmitter()
    reporter = MetricsReporter(MetricsRegistry(), emitter, 3600)
    reporter.start()
    try:
        reporter.set_interval(0.05)
        # Not after the hour already being waited: two emits at the new cadence.
        assert emitter.wait_for_calls(2)
    finally:
        reporter.stop(flush=False)
    assert reporter.interval == 0.05
