"""Consumer groups: `$share` where the broker delivers through it (Mosquitto), a static
partition by device where it does not (the NATS cluster), duplicates dropped either way."""

from __future__ import annotations

import threading
import uuid

import pytest

from tests.messaging.conftest import broker_config
from tests.support.servers import wait_until
from unskit.envelope import Message, MessageBuilder
from unskit.errors import ConfigError, MessagingError
from unskit.messaging.groups import (
    ConsumerGroup,
    ConsumerGroupConfig,
    GroupMode,
    _RecentIds,
    consumer_group_from_section,
    device_filter,
)

DEVICES = ("gw-1", "gw-2", "gw-3", "gw-4")
PARTITIONS = {"a": ("gw-1", "gw-3"), "b": ("gw-2", "gw-4")}


@pytest.mark.parametrize(
    ("topic_filter", "device", "narrowed"),
    [
        ("uns/+/+/data/#", "gw-1", "uns/gw-1/+/data/#"),
        ("uns/#", "gw-1", "uns/gw-1/#"),
        ("#", "gw-1", "+/gw-1/#"),
        ("uns/gw-1/+/data/#", "gw-1", "uns/gw-1/+/data/#"),
        ("uns/gw-2/+/data/#", "gw-1", None),
        ("uns", "gw-1", None),
    ],
)
def test_device_filter(topic_filter: str, device: str, narrowed: str | None) -> None:
    assert device_filter(topic_filter, 1, device) == narrowed


def _section(**overrides: object) -> dict[str, object]:
    section: dict[str, object] = {
        "name": "recorders",
        "member": "a",
        "devices": list(DEVICES),
        "partitions": {k: list(v) for k, v in PARTITIONS.items()},
    }
    section.update(overrides)
    return section


def test_a_partition_covering_every_device_once_is_accepted() -> None:
    config = consumer_group_from_section(_section(), "$.component.consumerGroup")
    assert config.devices == ("gw-1", "gw-3")
    assert config.mode is GroupMode.AUTO


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        (
            {"partitions": {"a": ["gw-1", "gw-3"], "b": ["gw-2"]}},
            "$.g.partitions",
            "no member takes 'gw-4'",
        ),
        (
            {"partitions": {"a": ["gw-1", "gw-3", "gw-2"], "b": ["gw-2", "gw-4"]}},
            "$.g.partitions.b",
            "also in 'a'",
        ),
        (
            {"partitions": {"a": ["gw-1", "gw-3", "gw-9"], "b": ["gw-2", "gw-4"]}},
            "$.g.partitions",
            "'gw-9' not in",
        ),
        ({"member": "c"}, "$.g.member", "'c' has no partition"),
        (
            {"partitions": {}, "mode": "partitioned"},
            "$.g.partitions",
            "is required with mode 'partitioned'",
        ),
        ({"devices": None}, "$.g.devices", "is required with partitions"),
    ],
    ids=["uncovered", "overlap", "unknown-device", "member-missing", "no-partition", "no-devices"],
)
def test_a_bad_partition_is_refused_with_its_path(overrides, path: str, words: str) -> None:
    section = _section(**overrides)
    if section.get("devices") is None:
        del section["devices"]
    with pytest.raises(ConfigError) as refused:
        consumer_group_from_section(section, "$.g")
    found = [(i.path, i.message) for i in refused.value.issues]
    assert any(p == path and words in m for p, m in found), found


@pytest.mark.parametrize("mode", ["shared", "auto"])
def test_shared_and_auto_modes_need_no_partition(mode: str) -> None:
    config = consumer_group_from_section({"name": "g", "member": "a", "mode": mode}, "$.g")
    assert config.mode is GroupMode(mode)
    assert config.partitions == {}


def test_the_recent_ids_window_is_bounded() -> None:
    recent = _RecentIds(3)
    assert [recent.seen(i) for i in "abca"] == [False, False, False, True]
    assert not recent.seen("d")  # evicts b (a was refreshed)
    assert not recent.seen("b")
    assert recent.seen("a")


# -- real brokers ---------------------------------------------------------------------------


def _members(make_client, port: int, mode: GroupMode) -> list[tuple[ConsumerGroup, list]]:
    name = f"g{uuid.uuid4().hex[:8]}"
    members = []
    for member in ("a", "b"):
        client = make_client(broker_config(port))
        config = ConsumerGroupConfig(
            name=name, member=member, mode=mode, partitions=PARTITIONS, probe_timeout_s=2.0
        )
        members.append((ConsumerGroup(client, config, device_level=1), []))
    return members


def _run_group(make_client, port: int, topic_root: str, expected_mode: GroupMode) -> list:
    members = _members(make_client, port, GroupMode.AUTO)
    lock = threading.Lock()
    for group, got in members:

        def record(topic: str, message: Message, got: list = got) -> None:
            with lock:
                got.append((topic.split("/")[1], message.body["n"]))

        assert group.open([f"{topic_root}/+/c/data/#"], record) is expected_mode
    publisher = make_client(broker_config(port))
    # Wait until every member's subscription is live: a marker per device reaches someone.
    markers = 0

    def live() -> bool:
        nonlocal markers
        for device in DEVICES:
            message = MessageBuilder("m", "1").body({"n": -1 - markers}).build()
            publisher.publish(f"{topic_root}/{device}/c/data/x", message)
            markers += 1
        with lock:
            seen = {d for _, got in members for d, n in got if n < 0}
        return seen == set(DEVICES)

    wait_until(live, 30, "every device's messages to reach the group", interval=0.3)
    sent = []
    for n in range(200):
        device = DEVICES[n % len(DEVICES)]
        message = MessageBuilder("reading", "1").body({"n": n}).build()
        publisher.publish(f"{topic_root}/{device}/c/data/x", message)
        if n % 50 == 0:
            publisher.publish(f"{topic_root}/{device}/c/data/x", message)  # a redelivery
        sent.append((device, n))

    def all_in() -> bool:
        with lock:
            # Distinct samples: a redelivery the other member took counts once.
            return len({n for _, got in members for _, n in got if n >= 0}) >= len(sent)

    wait_until(all_in, 30, "all 200 samples")
    return members


@pytest.mark.integration
def test_two_members_share_the_load_through_share_on_mosquitto(
    broker, make_client, topic_root
) -> None:
    members = _run_group(make_client, broker.plain_port, topic_root, GroupMode.SHARED)
    handled = [n for _, got in members for _, n in got if n >= 0]
    assert set(handled) == set(range(200)), "every sample handled"
    assert all(any(n >= 0 for _, n in got) for _, got in members), "both members took a share"
    # The 4 redeliveries (n = 0, 50, 100, 150): a member drops one it handled itself; the
    # broker may hand one to the other member, which cannot know (the window is per member).
    dropped = sum(group.duplicates for group, _ in members)
    assert dropped + (len(handled) - 200) == 4
    assert all(group.filters[0].startswith("$share/") for group, _ in members)


@pytest.mark.integration
@pytest.mark.slow
def test_a_broker_that_accepts_share_and_delivers_nothing_gets_the_partition(
    nats, make_client, topic_root, caplog
) -> None:
    port = nats.nodes[0].mqtt_port
    members = _run_group(make_client, port, topic_root, GroupMode.PARTITIONED)
    for (group, got), member in zip(members, ("a", "b"), strict=True):
        devices = {d for d, n in got if n >= 0}
        assert devices == set(PARTITIONS[member]), f"member {member} took only its devices"
        assert not any(f.startswith("$share/") for f in group.filters)
    handled = [n for _, got in members for _, n in got if n >= 0]
    assert sorted(handled) == list(range(200))
    assert sum(group.duplicates for group, _ in members) == 4
    assert "delivered nothing through it" in caplog.text


@pytest.mark.integration
def test_auto_without_a_partition_refuses_a_broker_that_ignores_share(
    nats, make_client, topic_root
) -> None:
    client = make_client(broker_config(nats.nodes[1].mqtt_port))
    config = ConsumerGroupConfig(name="lonely", member="a", probe_timeout_s=1.0)
    group = ConsumerGroup(client, config, device_level=1)
    with pytest.raises(MessagingError, match="no partition to fall back to"):
        group.open([f"{topic_root}/+/c/data/#"], lambda _t, _m: None)
    assert group.filters == ()
