"""The push-source shape of the southbound runtime over a real Mosquitto, with a driver that
delivers from its own thread: publication, per-signal failure and recovery, signals found
later, loss and reconnect, pause, and the verbs on signals the source addresses."""

from __future__ import annotations

import threading

import pytest

from tests.southbound.conftest import Adapter, instance, real_signal
from tests.southbound.sim_component import Pushed, SwitchedDriver
from tests.support.servers import wait_until
from unskit.errors import CommandError
from unskit.southbound.driver import DeviceError, PublishMode, Reading, SignalSpec
from unskit.southbound.push import PushInbox


def updates(adapter: Adapter, instance_id: str, channel: str) -> list:
    return adapter.seen.on(adapter.data_topic(instance_id, channel))


def pushed(*signals: dict, **settings) -> dict:
    return instance("line-1", *signals, adapter="push", **settings)


def test_pushed_readings_are_published(start_adapter) -> None:
    adapter = start_adapter([pushed(real_signal("speed", publishMode="always"))])
    wait_until(lambda: len(updates(adapter, "line-1", "speed")) >= 3, 10, "three updates")
    sample = updates(adapter, "line-1", "speed")[-1].body["samples"][0]
    assert sample["quality"] == "GOOD"
    assert 0 <= sample["value"] <= 100
    status = adapter.client.call("status", instance="line-1")
    assert status["connected"] is True
    assert status["counters"]["samplesPublished"] >= 3
    assert Pushed.subscribes == 1


def test_a_failed_signal_never_stops_the_others_and_recovers_on_its_own(start_adapter) -> None:
    adapter = start_adapter(
        [pushed(real_signal("speed", publishMode="always"), real_signal("broken"))]
    )
    wait_until(lambda: len(updates(adapter, "line-1", "speed")) >= 3, 10, "the good signal")
    (bad,) = [s for s in adapter.client.call("signals")["items"] if s["name"] == "broken"]
    assert bad["quality"] == "BAD"
    assert bad["status"] == "BadNodeIdUnknown"
    first = updates(adapter, "line-1", "broken")[0].body["samples"][0]
    assert (first["quality"], first["status"]) == ("BAD", "BadNodeIdUnknown")
    maintains = Pushed.maintains
    wait_until(lambda: Pushed.maintains >= maintains + 3, 10, "retries on the signal's schedule")
    Pushed.healed.set()
    wait_until(
        lambda: any(
            m.body["samples"][-1]["quality"] == "GOOD" for m in updates(adapter, "line-1", "broken")
        ),
        10,
        "the recovered signal",
    )
    (good,) = [s for s in adapter.client.call("signals")["items"] if s["name"] == "broken"]
    assert good["quality"] == "GOOD"
    assert good["status"] is None
    assert Pushed.subscribes == 1, "the session was never restarted for one signal"


def test_signals_found_later_are_published(start_adapter) -> None:
    adapter = start_adapter([pushed(real_signal("speed"))])
    wait_until(lambda: adapter.client.call("status", instance="line-1")["connected"], 10, "up")
    Pushed.extra.append(
        SignalSpec("Program:Main.found", "found", "REAL", publish_mode=PublishMode.ALWAYS)
    )
    Pushed.drivers[-1].announce()
    wait_until(lambda: len(updates(adapter, "line-1", "found")) >= 2, 10, "the new signal")
    ids = {s["id"] for s in adapter.client.call("signals")["items"]}
    assert ids == {"Program:Main.speed", "Program:Main.found"}


def test_a_lost_session_raises_the_alarm_and_reconnects(start_adapter) -> None:
    adapter = start_adapter([pushed(real_signal("speed", publishMode="always"))])
    alarm_topic = adapter.runtime.topics.topic(
        "evt", "error", "device-unreachable", instance="line-1"
    )
    wait_until(lambda: len(updates(adapter, "line-1", "speed")) >= 2, 10, "updates")
    SwitchedDriver.switch.up.clear()
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) == 1, 10, "the alarm")
    assert "test switch off" in adapter.seen.on(alarm_topic)[0].body["context"]["error"]
    assert adapter.client.call("status", instance="line-1")["connected"] is False
    SwitchedDriver.switch.up.set()
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) == 2, 10, "the clear")
    assert adapter.seen.on(alarm_topic)[1].body["state"] == "cleared"
    count = len(updates(adapter, "line-1", "speed"))
    wait_until(lambda: len(updates(adapter, "line-1", "speed")) >= count + 2, 10, "updates again")
    assert Pushed.subscribes >= 2, "subscribed again on the new session"
    assert adapter.client.call("status", instance="line-1")["counters"]["reconnects"] >= 1


def test_pause_holds_publication_and_resume_restores_it(start_adapter) -> None:
    adapter = start_adapter([pushed(real_signal("speed", publishMode="always"))])
    wait_until(lambda: len(updates(adapter, "line-1", "speed")) >= 2, 10, "updates")
    adapter.client.call("pause", instance="line-1")
    held = len(updates(adapter, "line-1", "speed"))
    probes = SwitchedDriver.switch.probes
    wait_until(lambda: SwitchedDriver.switch.probes >= probes + 3, 10, "probes while paused")
    assert len(updates(adapter, "line-1", "speed")) <= held + 1, "at most one in flight"
    wait_until(lambda: Pushed.drivers[-1].held, 10, "the driver told to hold")
    adapter.client.call("resume", instance="line-1")
    wait_until(lambda: len(updates(adapter, "line-1", "speed")) >= held + 3, 10, "again")
    wait_until(lambda: not Pushed.drivers[-1].held, 10, "the driver told to send again")


def test_verbs_reach_signals_the_source_addresses_and_star_writes(start_adapter) -> None:
    adapter = start_adapter([pushed(real_signal("speed"), writes=["*"])])
    wait_until(lambda: adapter.client.call("status", instance="line-1")["connected"], 10, "up")
    read = adapter.client.call("read", {"signals": ["Program:Other.level"]}, instance="line-1")
    assert read["readings"][0]["id"] == "Program:Other.level"
    with pytest.raises(CommandError, match="not a tag path") as refused:
        adapter.client.call("read", {"signals": ["nowhere"]}, instance="line-1")
    assert refused.value.code == "BAD_ARGS"
    reply = adapter.client.call(
        "write", {"requestId": "w1", "signal": "Program:Other.level", "value": 7.5}, "line-1"
    )
    assert reply["written"] == 7.5


def test_a_refused_write_publishes_write_rejected(start_adapter) -> None:
    adapter = start_adapter([pushed(real_signal("speed"), writes=["Program:Main.speed"])])
    topic = adapter.runtime.topics.topic("evt", "warning", "write-rejected", instance="line-1")
    wait_until(lambda: adapter.client.call("status", instance="line-1")["connected"], 10, "up")
    with pytest.raises(CommandError) as refused:
        adapter.client.call(
            "write", {"requestId": "w2", "signal": "Program:Main.other", "value": 1.0}, "line-1"
        )
    assert refused.value.code == "BAD_ARGS"
    wait_until(lambda: len(adapter.seen.on(topic)) == 1, 10, "the event")
    context = adapter.seen.on(topic)[0].body["context"]
    assert context == {"signal": "Program:Main.other", "allow": ["Program:Main.speed"]}


def test_a_paused_poll_instance_survives_a_failed_probe(start_adapter) -> None:
    adapter = start_adapter([instance("press-1", real_signal("speed"), adapter="test")])
    switch = SwitchedDriver.switch
    wait_until(lambda: switch.reads >= 2, 10, "polling")
    adapter.client.call("pause", instance="press-1")
    switch.up.clear()
    wait_until(
        lambda: adapter.client.call("status", instance="press-1")["connected"] is False,
        10,
        "the failed probe noticed",
    )
    switch.up.set()
    adapter.client.call("resume", instance="press-1")
    reads = switch.reads
    wait_until(lambda: switch.reads >= reads + 3, 10, "polling after the reconnect")
    assert adapter.client.call("status", instance="press-1")["lastError"] is None


# -- the inbox alone ----------------------------------------------------------------------------


def reading(n: int) -> Reading:
    return Reading(f"s{n}", float(n))


def test_the_inbox_is_bounded_and_counts_what_it_drops(caplog) -> None:
    wakes = threading.Semaphore(0)
    inbox = PushInbox("line-1", wakes.release, capacity=3)
    inbox.deliver([reading(1), reading(2)])
    inbox.deliver([reading(3), reading(4), reading(5)])
    assert [r.signal_id for r in inbox.take()] == ["s1", "s2", "s3"]
    assert inbox.take_dropped() == 2
    assert inbox.take_dropped() == 0
    assert "2 readings dropped" in caplog.text
    assert wakes.acquire(timeout=0)


def test_the_inbox_flags_reset_when_read_and_a_closed_inbox_ignores_everything() -> None:
    inbox = PushInbox("line-1", lambda: None)
    inbox.lost(DeviceError("first", connection_lost=True))
    inbox.lost(DeviceError("second", connection_lost=True))
    inbox.signals_changed()
    lost, changed, maintain = inbox.take_flags()
    assert str(lost) == "first"
    assert (changed, maintain) == (True, False)
    assert inbox.take_flags() == (None, False, False)
    inbox.close()
    inbox.deliver([reading(1)])
    inbox.lost(DeviceError("late", connection_lost=True))
    inbox.wake()
    assert inbox.take() == []
    assert inbox.take_flags() == (None, False, False)


def test_the_inbox_hands_over_signals_reported_alive_once() -> None:
    inbox = PushInbox("line-1", lambda: None)
    inbox.alive(["a", "b"])
    inbox.alive(["b", "c"])
    assert inbox.take_alive() == {"a", "b", "c"}
    assert inbox.take_alive() == set()
    inbox.close()
    inbox.alive(["a"])
    assert inbox.take_alive() == set(), "a closed inbox ignores the driver"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "signal: required"),
        ({"signal": "Program:Main.speed"}, "value: required"),
        ({"values": {"Program:Main.speed": 1.0}, "signal": "Program:Main.speed"}, "either"),
        ({"values": {}}, "values: 1 to 64"),
        ({"values": {"Program:Main.speed": None}}, "values.Program:Main.speed"),
    ],
    ids=["empty", "no-value", "both-forms", "no-values", "null-value"],
)
def test_write_bodies_are_parsed_strictly(start_adapter, body, message) -> None:
    adapter = start_adapter([pushed(real_signal("speed"), writes=["Program:Main.speed"])])
    wait_until(lambda: adapter.client.call("status", instance="line-1")["connected"], 10, "up")
    with pytest.raises(CommandError, match=message) as refused:
        adapter.client.call("write", {"requestId": "b1", **body}, "line-1")
    assert refused.value.code == "BAD_ARGS"


def test_several_values_need_a_driver_that_writes_them_together(start_adapter) -> None:
    adapter = start_adapter([pushed(real_signal("speed"), writes=["*"])])
    wait_until(lambda: adapter.client.call("status", instance="line-1")["connected"], 10, "up")
    body = {"requestId": "m1", "values": {"Program:Main.speed": 1.0, "Program:Other.x": 2.0}}
    with pytest.raises(CommandError, match="writes one signal per request") as refused:
        adapter.client.call("write", body, "line-1")
    assert refused.value.code == "BAD_ARGS"


@pytest.mark.parametrize("answers", [0, 1], ids=["at-once", "after-one-delivery"])
def test_the_unreachable_alarm_holds_until_a_session_stays_up(start_adapter, answers) -> None:
    # A session proves itself by delivering and then staying up one 100 ms window; these
    # end 20 or 40 ms after they open.
    adapter = start_adapter(
        [pushed(real_signal("speed"))],
        timing={"reconnect_backoff_min_ms": 100, "reconnect_backoff_max_ms": 200},
    )
    alarm_topic = adapter.runtime.topics.topic(
        "evt", "error", "device-unreachable", instance="line-1"
    )
    wait_until(lambda: len(updates(adapter, "line-1", "speed")) >= 1, 10, "data")
    switch = SwitchedDriver.switch
    switch.answers = answers
    first = Pushed.subscribes
    switch.drop.set()
    wait_until(lambda: Pushed.subscribes >= first + 6, 10, "six subscribed-then-lost sessions")
    assert [m.body["state"] for m in adapter.seen.on(alarm_topic)] == ["raised"]
    switch.drop.clear()
    wait_until(lambda: len(adapter.seen.on(alarm_topic)) >= 2, 10, "the clear")
    assert [m.body["state"] for m in adapter.seen.on(alarm_topic)] == ["raised", "cleared"]
    assert adapter.client.call("status", instance="line-1")["connected"] is True
