"""The southbound runtime over a real Mosquitto with sim and switchable test devices:
publication, the verbs, pause and resume, the unreachable alarm and every reload rule."""

from __future__ import annotations

import copy
import itertools
import random
import types

import pytest

from tests.southbound.conftest import Adapter, instance, real_signal
from tests.southbound.sim_component import SimComponent, SwitchedDriver
from tests.support.servers import readyz, wait_until
from unskit.errors import CommandError, ConfigError
from unskit.southbound.sim import sim_value


def updates(adapter: Adapter, instance_id: str, channel: str):
    return adapter.seen.on(adapter.data_topic(instance_id, channel))


def test_signal_updates_are_published_on_the_data_class(start_adapter) -> None:
    adapter = start_adapter([instance("press-1", real_signal("speed", publishMode="always"))])
    wait_until(lambda: len(updates(adapter, "press-1", "speed")) >= 3, 10, "three updates")
    message = updates(adapter, "press-1", "speed")[0]
    assert message.header.name == "SouthboundSignalUpdate"
    assert message.identity is not None
    assert message.identity.instance == "press-1"
    body = message.body
    assert body["signal"] == {"id": "Program:Main.speed", "name": "speed"}
    (sample,) = body["samples"]
    assert sample["quality"] == "GOOD"
    assert isinstance(sample["value"], float)
    assert 0 <= sample["value"] <= 100


def test_on_change_publishes_only_changes(start_adapter) -> None:
    adapter = start_adapter(
        [instance("press-1", real_signal("setpoint"), writes=["Program:Main.setpoint"])]
    )
    adapter.client.call(
        "write",
        {"requestId": "w1", "signal": "Program:Main.setpoint", "value": 42.0},
        instance="press-1",
    )
    wait_until(
        lambda: any(
            m.body["samples"][-1]["value"] == 42.0 for m in updates(adapter, "press-1", "setpoint")
        ),
        10,
        "the written value",
    )
    count = len(updates(adapter, "press-1", "setpoint"))
    reads = adapter.client.call("status", instance="press-1")["counters"]["reads"]
    wait_until(
        lambda: (
            adapter.client.call("status", instance="press-1")["counters"]["reads"] >= reads + 10
        ),
        10,
        "ten more polls",
    )
    assert len(updates(adapter, "press-1", "setpoint")) == count, "a constant is not republished"


def test_batch_windows_put_several_samples_in_one_update(start_adapter) -> None:
    signal = real_signal("vibration", publishMode="always", batchMs=300)
    adapter = start_adapter([instance("press-1", signal)])
    wait_until(lambda: len(updates(adapter, "press-1", "vibration")) >= 2, 10, "two batches")
    sizes = [len(m.body["samples"]) for m in updates(adapter, "press-1", "vibration")]
    assert max(sizes) >= 5, sizes
    stamps = [
        s["server_timestamp_ms"]
        for s in updates(adapter, "press-1", "vibration")[1].body["samples"]
    ]
    assert stamps == sorted(stamps)


def test_status_signals_and_read(start_adapter) -> None:
    adapter = start_adapter(
        [
            instance("press-1", real_signal("speed", scale=2.0, offset=1.0)),
            instance("press-2", {"id": "Count", "name": "count", "type": "DINT"}),
        ]
    )
    wait_until(
        lambda: adapter.client.call("status", instance="press-1")["connected"], 10, "connected"
    )
    whole = adapter.client.call("status")
    assert [entry["instance"] for entry in whole["instances"]] == ["press-1", "press-2"]
    # The link's broker is in it, for a failover list to be followed.
    assert whole["messaging"]["local"]["connected"] is True
    assert whole["messaging"]["local"]["endpoint"].startswith("127.0.0.1:")
    assert whole["messaging"]["local"]["failovers"] == 0
    one = adapter.client.call("status", instance="press-2")
    assert one["adapter"] == "sim"
    assert one["endpoint"] == "sim://press-2"
    assert one["security"]["est"] == {"enabled": False}
    signals = adapter.client.call("signals", {"limit": 1})
    assert signals["total"] == 2
    assert signals["items"][0]["instance"] == "press-1"
    rest = adapter.client.call("signals", {"limit": 1, "cursor": signals["nextCursor"]})
    assert rest["items"][0]["id"] == "Count"
    assert rest["nextCursor"] is None
    read = adapter.client.call("read", {"signals": ["Program:Main.speed"]}, instance="press-1")
    (reading,) = read["readings"]
    assert reading["quality"] == "GOOD"
    assert 1.0 <= reading["value"] <= 201.0, "scaled: raw * 2 + 1"
    with pytest.raises(CommandError, match="unknown signal ids") as raised:
        adapter.client.call("read", {"signals": ["Nope"]}, instance="press-1")
    assert raised.value.code == "BAD_ARGS"


@pytest.mark.parametrize(
    ("writes", "signal", "value", "code", "written"),
    [
        (["Count"], "Count", 12.6, "OK", 13),
        (["Count"], "Count", 2**40, "BAD_ARGS", None),
        (["Count"], "Count", "high", "BAD_ARGS", None),
        (["Count"], "Other", 1, "BAD_ARGS", None),
        ([], "Count", 1, "BAD_ARGS", None),
        (["Scaled"], "Scaled", 21.0, "OK", 10.0),
        (["Flag"], "Flag", 1, "BAD_ARGS", None),
        (["Flag"], "Flag", True, "OK", True),
    ],
)
def test_writes(start_adapter, writes, signal, value, code, written) -> None:
    signals = [
        {"id": "Count", "name": "count", "type": "DINT"},
        {"id": "Scaled", "name": "scaled", "type": "REAL", "scale": 2.0, "offset": 1.0},
        {"id": "Flag", "name": "flag", "type": "BOOL"},
    ]
    adapter = start_adapter([instance("press-1", *signals, writes=writes)])
    wait_until(
        lambda: adapter.client.call("status", instance="press-1")["connected"], 10, "connected"
    )
    body = {"requestId": "w", "signal": signal, "value": value}
    if code == "OK":
        reply = adapter.client.call("write", body, instance="press-1")
        assert reply["written"] == written
        read = adapter.client.call("read", {"signals": [signal]}, instance="press-1")
        assert read["readings"][0]["value"] == pytest.approx(value if signal != "Count" else 13)
    else:
        with pytest.raises(CommandError) as raised:
            adapter.client.call("write", body, instance="press-1")
        assert raised.value.code == code


def test_pause_holds_polling_and_probes_instead(start_adapter) -> None:
    adapter = start_adapter([instance("press-1", real_signal("speed"), adapter="test")])
    switch = SwitchedDriver.switch
    wait_until(lambda: switch.reads >= 3, 10, "polling")
    assert adapter.client.call("pause", instance="press-1") == {
        "instance": "press-1",
        "paused": True,
        "changed": True,
    }
    assert adapter.client.call("pause", instance="press-1")["changed"] is False
    reads = switch.reads
    probes = switch.probes
    wait_until(lambda: switch.probes >= probes + 3, 10, "keepalive probes while paused")
    assert switch.reads <= reads + 1, "at most the poll in progress"
    status = adapter.client.call("status", instance="press-1")
    assert status["paused"] is True
    assert status["staleSignals"] == 0, "staleness is suspended while paused"
    assert adapter.client.call("resume", instance="press-1")["changed"] is True
    wait_until(lambda: switch.reads >= reads + 3, 10, "polling again")


def test_unreachable_device_raises_and_clears_the_alarm(start_adapter) -> None:
    adapter = start_adapter(
        [
            instance("press-1", real_signal("speed"), adapter="test"),
            instance("press-2", real_signal("speed", publishMode="always")),
        ]
    )
    alarm_topic = adapter.runtime.topics.topic(
        "evt", "error", "device-unreachable", instance="press-1"
    )
    wait_until(lambda: adapter.client.call("status", instance="press-1")["connected"], 10, "up")
    SwitchedDriver.switch.up.clear()
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) == 1, 10, "the alarm")
    raised = adapter.seen.on(alarm_topic)[0].body
    assert raised["state"] == "raised"
    assert "test switch off" in raised["context"]["error"]
    status = adapter.client.call("status", instance="press-1")
    assert status["connected"] is False
    assert "test switch off" in status["lastError"]
    with pytest.raises(CommandError) as refused:
        adapter.client.call("read", instance="press-1")
    assert refused.value.code == "DEVICE_UNAVAILABLE"
    # The other instance keeps publishing.
    before = len(updates(adapter, "press-2", "speed"))
    wait_until(lambda: len(updates(adapter, "press-2", "speed")) > before + 3, 10, "press-2")
    SwitchedDriver.switch.up.set()
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) == 2, 10, "the clear")
    assert adapter.seen.on(alarm_topic)[1].body["state"] == "cleared"
    assert adapter.client.call("status", instance="press-1")["counters"]["reconnects"] >= 1


class _CeilingJitter(random.Random):
    """Jitter pinned to the top of each window, so the schedule is exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.fixture
def ceiling_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    import unskit.southbound.instance as instance_module

    monkeypatch.setattr(instance_module, "random", types.SimpleNamespace(Random=_CeilingJitter))


#: Reads a device answers on a session before it ends it: none, or one (cpppo ending an
#: unconnected session after a read of a tag it does not know, answered with a broken reply).
ANSWERS = pytest.mark.parametrize("answers", [0, 1], ids=["at-once", "after-one-read"])


@ANSWERS
def test_a_device_that_drops_every_session_gets_a_growing_reconnect_window(
    start_adapter, ceiling_jitter, answers
) -> None:
    adapter = start_adapter(
        [instance("press-1", real_signal("speed"), adapter="test")],
        timing={"reconnect_backoff_min_ms": 20, "reconnect_backoff_max_ms": 640},
    )
    switch = SwitchedDriver.switch
    switch.answers = answers
    wait_until(lambda: switch.reads >= 3, 10, "polling")
    first = len(switch.connect_times)
    switch.drop.set()
    wait_until(lambda: len(switch.connect_times) >= first + 7, 10, "seven reconnects")
    times = switch.connect_times[first : first + 7]
    intervals = [later - earlier for earlier, later in itertools.pairwise(times)]
    # The loss of the proven connection opens the 20 ms window; each accepted-then-dropped
    # session is one more failure: 40, 80, 160, 320, 640 (the ceiling), 640.
    windows = [min(640, 20 * 2 ** (n + 1)) / 1000 for n in range(len(intervals))]
    assert all(got >= want for got, want in zip(intervals, windows, strict=True)), intervals
    reads = switch.reads
    switch.drop.clear()
    wait_until(lambda: switch.reads >= reads + 3, 10, "polling again")
    assert adapter.client.call("status", instance="press-1")["connected"] is True


@ANSWERS
def test_the_unreachable_alarm_holds_while_sessions_are_dropped(start_adapter, answers) -> None:
    adapter = start_adapter(
        [instance("press-1", real_signal("speed"), adapter="test")],
        timing={"reconnect_backoff_min_ms": 10, "reconnect_backoff_max_ms": 40},
    )
    alarm_topic = adapter.runtime.topics.topic(
        "evt", "error", "device-unreachable", instance="press-1"
    )
    switch = SwitchedDriver.switch
    switch.answers = answers
    wait_until(lambda: switch.reads >= 3, 10, "polling")
    first = switch.connects
    switch.drop.set()
    wait_until(lambda: switch.connects >= first + 10, 10, "ten accepted-then-dropped sessions")
    assert [m.body["state"] for m in adapter.seen.on(alarm_topic)] == ["raised"]
    reads = switch.reads
    switch.drop.clear()
    wait_until(lambda: switch.reads >= reads + 5, 10, "good polls")
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) >= 2, 10, "the clear")
    assert [m.body["state"] for m in adapter.seen.on(alarm_topic)] == ["raised", "cleared"]


# -- reload: one row per rule --------------------------------------------------------------------


@pytest.fixture
def three(start_adapter) -> Adapter:
    adapter = start_adapter(
        [
            instance("a", real_signal("speed")),
            instance("b", real_signal("speed")),
            instance("c", real_signal("speed")),
        ]
    )
    adapter.client.call("pause", instance="c")
    return adapter


def instances_of(adapter: Adapter) -> list:
    return copy.deepcopy(adapter.document["component"]["instances"])


def with_instances(adapter: Adapter, instances: list) -> dict:
    document = copy.deepcopy(adapter.document)
    document["component"]["instances"] = instances
    return document


def test_reload_one_instance_changed(three) -> None:
    changed = instances_of(three)
    changed[0]["groups"][0]["intervalMs"] = 30
    reply = three.reload(with_instances(three, changed))
    assert reply == {"started": ["a"], "stopped": [], "kept": ["b", "c"], "skipped": []}
    assert three.client.call("status", instance="c")["paused"] is True, "untouched keeps pause"


def test_reload_instance_added_and_removed(three) -> None:
    entries = [*instances_of(three)[1:], instance("d", real_signal("speed"))]
    reply = three.reload(with_instances(three, entries))
    assert reply == {"started": ["d"], "stopped": ["a"], "kept": ["b", "c"], "skipped": []}
    assert three.client.call("status")["instances"][-1]["instance"] == "d"
    with pytest.raises(CommandError) as raised:
        three.client.call("status", instance="a")
    assert raised.value.code == "NO_SUCH_INSTANCE"


def test_reload_shared_section_restarts_every_instance(three) -> None:
    document = with_instances(three, instances_of(three))
    document["component"]["timing"]["keepalive_probe_interval_ms"] = 40
    reply = three.reload(document)
    assert reply == {"started": ["a", "b", "c"], "stopped": [], "kept": [], "skipped": []}
    assert three.client.call("status", instance="c")["paused"] is False, "restarted: running"


def test_reload_formatting_only_restarts_nothing(three) -> None:
    reordered = [dict(reversed(list(entry.items()))) for entry in instances_of(three)]
    reply = three.reload(with_instances(three, reordered))
    assert reply == {"started": [], "stopped": [], "kept": ["a", "b", "c"], "skipped": []}


def test_reload_skips_malformed_duplicate_and_unknown_adapter(three) -> None:
    entries = [
        *instances_of(three),
        {"id": "broken"},
        instance("a", real_signal("other")),
        instance("e", real_signal("speed"), adapter="profinet"),
    ]
    reply = three.reload(with_instances(three, entries))
    assert reply["kept"] == ["a", "b", "c"]
    assert sorted(reply["skipped"]) == ["a", "broken", "e"]


def test_reload_without_a_valid_instance_is_rejected(three) -> None:
    with pytest.raises(CommandError, match="no valid instance") as raised:
        three.reload(with_instances(three, [{"id": "broken"}]))
    assert raised.value.code == "BAD_ARGS"
    assert len(three.client.call("status")["instances"]) == 3


def test_reload_with_an_unstartable_instance_is_rejected_whole(three) -> None:
    SimComponent.unstartable.add("x")
    entries = instances_of(three)
    entries[1]["groups"][0]["intervalMs"] = 25
    entries.append(instance("x", real_signal("speed"), adapter="test"))
    with pytest.raises(CommandError, match="broken certificate"):
        three.reload(with_instances(three, entries[:1] + entries[1:]))
    statuses = three.client.call("status")["instances"]
    assert [s["instance"] for s in statuses] == ["a", "b", "c"]
    assert statuses[2]["paused"] is True, "nothing was touched"


def test_reload_publishes_config_applied(three) -> None:
    topic = three.runtime.topics.topic("evt", "info", "config-applied")
    reply = three.reload(with_instances(three, instances_of(three)[:2]))
    wait_until(lambda: len(three.seen.on(topic)) == 1, 10, "the event")
    assert three.seen.on(topic)[0].body["context"] == reply


def test_start_with_no_valid_instance_is_refused(start_adapter) -> None:
    with pytest.raises(ConfigError, match="no valid instance"):
        start_adapter([{"id": "broken"}])


def test_sim_values_are_deterministic() -> None:
    from unskit.southbound.driver import SignalSpec

    real = SignalSpec("Tag", "tag", "REAL", array_count=2)
    assert sim_value(real, 1234.5) == sim_value(real, 1234.5)
    assert sim_value(SignalSpec("C", "c", "DINT"), 100.0) + 1 == sim_value(
        SignalSpec("C", "c", "DINT"), 101.0
    )
    assert isinstance(sim_value(SignalSpec("F", "f", "BOOL"), 3.0), bool)


def test_health_metrics_use_the_spec_family_and_dimensions(start_adapter) -> None:
    adapter = start_adapter(
        [instance("press-1", real_signal("speed"), adapter="test")],
        metricEmission={"enabled": True, "target": "messaging", "intervalSeconds": 1},
        timing={"metrics_interval_secs": 1, "stale_signal_secs": 1},
    )
    topic = adapter.runtime.topics.topic("metric", "southbound_health", instance="press-1")

    def latest() -> dict:
        messages = adapter.seen.on(topic)
        if not messages:
            return {}
        assert messages[-1].body["family"] == "southbound_health"
        return {
            (m["name"], m["dimensions"].get("pollGroup")): m for m in messages[-1].body["metrics"]
        }

    def value(name: str, group: str | None = None, key: str = "value") -> float | None:
        return latest().get((name, group), {}).get(key)

    wait_until(lambda: (value("reads", "fast", "total") or 0) > 0, 10, "reads of group fast")
    assert (value("connected"), value("staleSignals")) == (1, 0)
    SwitchedDriver.switch.up.clear()
    wait_until(
        lambda: (value("connected"), value("staleSignals")) == (0, 1),
        15,
        "the unreachable device's signal counted stale",
    )


def test_metrics_interval_follows_the_component(start_adapter) -> None:
    adapter = start_adapter(
        [instance("press-1", real_signal("speed"))],
        metricEmission={"enabled": True, "target": "log", "intervalSeconds": 60},
        timing={"metrics_interval_secs": 7},
    )
    reporter = adapter.runtime._reporter
    assert reporter is not None
    assert reporter.interval == 7.0


def ready(adapter: Adapter) -> int | None:
    """The status /readyz answers on the component's probe port."""
    assert adapter.runtime.health is not None
    return readyz(adapter.runtime.health.port)


PROBES = {"health": {"enabled": True, "port": 0}}


def test_a_failed_instance_thread_restarts_with_backoff_an_alarm_and_a_count(
    start_adapter,
) -> None:
    adapter = start_adapter(
        [instance("press-1", real_signal("speed", publishMode="always"), adapter="test")],
        **PROBES,
    )
    switch = SwitchedDriver.switch
    alarm_topic = adapter.runtime.topics.topic(
        "evt", "error", "device-unreachable", instance="press-1"
    )
    wait_until(lambda: adapter.client.call("status", instance="press-1")["connected"], 10, "up")
    wait_until(lambda: ready(adapter) == 200, 10, "ready")
    connects = switch.connects
    switch.explode.set()
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) == 1, 10, "the alarm")
    raised = adapter.seen.on(alarm_topic)[0].body
    assert raised["state"] == "raised"
    assert "RuntimeError: driver bug (test explode)" in raised["context"]["error"]
    wait_until(lambda: ready(adapter) == 503, 10, "not ready: its only instance failed")
    # Restarted, again and again, each time after the instance's reconnect backoff.
    wait_until(lambda: switch.connects >= connects + 3, 10, "restarts")
    times = switch.connect_times[connects:]
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.019  # reconnectBackoffMinMs
    status = adapter.client.call("status", instance="press-1")
    assert status["state"] != "stopped"
    assert status["counters"]["threadFailures"] >= 2
    switch.explode.clear()
    before = len(updates(adapter, "press-1", "speed"))
    wait_until(lambda: len(updates(adapter, "press-1", "speed")) > before + 2, 10, "publishing")
    wait_until(lambda: ready(adapter) == 200, 10, "ready again")
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) == 2, 10, "the clear")
    assert adapter.seen.on(alarm_topic)[1].body["state"] == "cleared"
    assert adapter.client.call("status", instance="press-1")["state"] == "connected"


@pytest.mark.parametrize(
    ("instances", "pause", "expected"),
    [
        (["test"], False, 503),
        (["test", "sim"], False, 200),
        (["test", "test"], False, 503),
        (["test"], True, 200),
    ],
    ids=["the-only-instance-failed", "one-of-two-failed", "both-failed", "paused-not-failed"],
)
def test_the_component_is_not_ready_only_while_every_instance_failed(
    start_adapter, instances: list[str], pause: bool, expected: int
) -> None:
    adapter = start_adapter(
        [
            instance(f"press-{n}", real_signal("speed"), adapter=kind)
            for n, kind in enumerate(instances, 1)
        ],
        **PROBES,
    )
    ids = [f"press-{n}" for n in range(1, len(instances) + 1)]
    for instance_id in ids:
        wait_until(
            lambda i=instance_id: adapter.client.call("status", instance=i)["connected"], 10, "up"
        )
    if pause:
        for instance_id in ids:
            adapter.client.call("pause", instance=instance_id)
    SwitchedDriver.switch.explode.set()
    failing = [i for i, kind in zip(ids, instances, strict=True) if kind == "test" and not pause]

    def failures(instance_id: str) -> float:
        return adapter.client.call("status", instance=instance_id)["counters"]["threadFailures"]

    reads = SwitchedDriver.switch.reads
    wait_until(lambda: all(failures(i) >= 1 for i in failing), 10, "the failures")
    if pause:  # a paused instance does not read, so nothing fails: probes prove it is alive
        probes = SwitchedDriver.switch.probes
        wait_until(lambda: SwitchedDriver.switch.probes > probes + 2, 10, "probes")
        assert SwitchedDriver.switch.reads == reads
    wait_until(lambda: ready(adapter) == expected, 10, f"/readyz {expected}")


def test_a_value_the_envelope_cannot_carry_goes_out_bad_and_the_rest_goes_on(
    start_adapter,
) -> None:
    big = {"id": "Program:Main.big", "name": "big", "type": "ULINT", "publishMode": "always"}
    switch = SwitchedDriver.switch
    switch.values[big["id"]] = 2**64  # beyond every 64-bit integer, from the first read on
    adapter = start_adapter(
        [instance("press-1", real_signal("speed", publishMode="always"), big, adapter="test")]
    )
    wait_until(lambda: len(updates(adapter, "press-1", "big")) >= 2, 10, "updates of big")
    (sample,) = updates(adapter, "press-1", "big")[-1].body["samples"]
    assert sample["quality"] == "BAD"
    assert sample["value"] is None
    assert sample["status"].startswith("not encodable: value is an integer outside the 64-bit")
    assert sample["source_timestamp_ms"] > 0
    before = len(updates(adapter, "press-1", "speed"))
    wait_until(lambda: len(updates(adapter, "press-1", "speed")) > before + 2, 10, "speed")
    status = adapter.client.call("status", instance="press-1")
    assert status["state"] == "connected"
    assert status["counters"]["threadFailures"] == 0
    assert status["counters"]["encodeErrors"] >= 2
    # The verbs show it the same way, and answer for the other signals.
    views = {v["name"]: v for v in adapter.client.call("signals", instance="press-1")["items"]}
    assert (views["big"]["value"], views["big"]["quality"]) == (None, "BAD")
    assert views["big"]["status"].startswith("not encodable: value is an integer outside")
    assert views["speed"]["quality"] == "GOOD"
    read = adapter.client.call("read", {"signals": [big["id"], "Program:Main.speed"]}, "press-1")
    by_id = {r["id"]: r for r in read["readings"]}
    assert (by_id[big["id"]]["value"], by_id[big["id"]]["quality"]) == (None, "BAD")
    assert by_id[big["id"]]["detail"].startswith("not encodable: value is an integer outside")
    assert by_id["Program:Main.speed"]["quality"] == "GOOD"
    # The unsigned 64-bit range is carried exactly.
    switch.values[big["id"]] = 2**64 - 1

    def good() -> list:
        return [
            s
            for m in updates(adapter, "press-1", "big")
            for s in m.body["samples"]
            if s["quality"] == "GOOD"
        ]

    assert good() == []
    wait_until(lambda: len(good()) >= 1, 10, "a GOOD sample of big")
    assert good()[0]["value"] == 2**64 - 1
    assert type(good()[0]["value"]) is int
    assert "status" not in good()[0]
