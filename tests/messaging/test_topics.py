"""Topic filters, UNS topics and the reserved classes."""

from __future__ import annotations

import pytest

from unskit.errors import ReservedTopicError
from unskit.messaging import MessagingClient, TopicScope, topic_matches_filter
from unskit.topics import RESERVED_CLASSES, UnsTopic, check_not_reserved, topic_class, uns_topic


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("a/b/c", "a/b/c", True),
        ("a/b/c", "a/b/d", False),
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/x/c", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("#", "a/b", True),
        ("+", "a", True),
        ("+", "a/b", False),
        ("+/+", "/x", True),
        ("a/+", "a/", True),
        ("#", "$SYS/broker", False),
        ("+/broker", "$SYS/broker", False),
        ("$SYS/#", "$SYS/broker", True),
        ("a/b", "a/b/c", False),
        ("a/b/c/d", "a/b/c", False),
    ],
)
def test_topic_matches_filter(topic_filter, topic, matches):
    assert topic_matches_filter(topic_filter, topic) is matches
    assert MessagingClient.topic_matches_filter(topic_filter, topic) is matches


@pytest.mark.parametrize("cls", ["state", "metric", "cfg", "log"])
@pytest.mark.parametrize(
    "shape",
    ["uns/gw-01/cam/{cls}", "uns/gw-01/cam/cam-1/{cls}/x", "uns/site-a/gw-01/cam/{cls}"],
)
def test_reserved_classes_are_refused(cls, shape):
    topic = shape.format(cls=cls)
    assert topic_class(topic) == cls
    with pytest.raises(ReservedTopicError, match=f"reserved class '{cls}'"):
        check_not_reserved(topic)


@pytest.mark.parametrize(
    "topic", ["uns/gw-01/cam/data/t", "uns/gw-01/cam/cam-1/evt/info/x", "lib/reply-abc", "x"]
)
def test_other_topics_pass(topic):
    check_not_reserved(topic)


RESERVED = sorted(RESERVED_CLASSES)
OPEN_CLASSES = ["data", "evt", "cmd", "app"]
#: The layouts a component's topics take: a one-level root, a site level (includeRoot), a root
#: of two levels, and both.
LAYOUTS = {
    "root": {"root": "uns"},
    "site": {"root": "uns", "root_level": "plant-1"},
    "deep-root": {"root": "acme/uns"},
    "deep-root-and-site": {"root": "acme/uns", "root_level": "plant-1"},
}


def scope_for(layout: str, *, device: str = "gw-01", component: str = "cip") -> TopicScope:
    return TopicScope(device=device, component=component, **LAYOUTS[layout])


def plain_forms(scope: TopicScope, topic: str) -> list[tuple[str, int | None]]:
    """The topic as a plain string, with the scope's head and (one-level layouts) without."""
    forms: list[tuple[str, int | None]] = [(str(topic), scope.head_levels)]
    if scope.head_levels == 3:
        forms.append((str(topic), None))
    return forms


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("word", RESERVED)
@pytest.mark.parametrize("cls", OPEN_CLASSES)
def test_an_instance_named_like_a_reserved_class_publishes(layout, word, cls):
    scope = scope_for(layout)
    topic = scope.topic(cls, "x", instance=word)
    assert isinstance(topic, UnsTopic)
    assert topic_class(topic) == cls
    check_not_reserved(topic)
    for plain, head in plain_forms(scope, topic):
        assert type(plain) is str
        assert topic_class(plain, head) == cls, (plain, head)
        check_not_reserved(plain, head)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("word", RESERVED)
@pytest.mark.parametrize("cls", RESERVED)
@pytest.mark.parametrize("instance", [None, "plc-1", "data", "state"])
def test_a_reserved_class_is_refused_wherever_the_instance_is(layout, word, cls, instance):
    # `word` names the device: a class word outside the class position is just a name.
    scope = scope_for(layout, device=word)
    topic = scope.topic(cls, "heartbeat", instance=instance)
    for candidate, head in [(topic, None), *plain_forms(scope, topic)]:
        assert topic_class(candidate, head) == cls, (candidate, head)
        with pytest.raises(ReservedTopicError, match=f"reserved class '{cls}'"):
            check_not_reserved(candidate, head)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("word", RESERVED)
def test_a_component_token_named_like_a_reserved_class(layout, word):
    scope = scope_for(layout, component=word)
    for instance in (None, "plc-1"):
        data = scope.topic("data", "speed", instance=instance)
        state = scope.topic("state", "heartbeat", instance=instance)
        for plain, head in plain_forms(scope, data):
            assert topic_class(plain, head) == "data"
            check_not_reserved(plain, head)
        for plain, head in plain_forms(scope, state):
            with pytest.raises(ReservedTopicError):
                check_not_reserved(plain, head)


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("uns/gw/cip/plc-1/data/state", "data"),  # a signal named like a class
        ("uns/gw/cip/data/log", "log"),  # a class word after a class word is the class
        ("uns/gw/cip/state/heartbeat", "state"),
        ("uns/gw/cip/plc-1/custom/state", None),  # only the class position counts
        ("uns/gw/cip", None),
        ("uns/gw/cip/plc-1", None),
        ("lib/reply-abc", None),
    ],
)
def test_plain_topics_are_read_at_the_class_position(topic, expected):
    assert topic_class(topic) == expected


def test_a_built_topic_is_a_str_that_keeps_its_class_through_pickling():
    import pickle

    topic = uns_topic("uns", "gw", "cip", "data", "x", instance="state")
    assert topic == "uns/gw/cip/state/data/x"
    copy = pickle.loads(pickle.dumps(topic))
    assert isinstance(copy, UnsTopic)
    assert copy.topic_class == "data"
    assert topic_class(topic + "/more") == "data", "a changed string is read by position"


def test_topic_scope_builds_component_topics():
    topics = TopicScope("uns", "gw-01", "camera-adapter")
    assert topics.topic("data", "temperature") == "uns/gw-01/camera-adapter/data/temperature"
    assert topics.topic("cmd", "sb", "capture", instance="cam-1") == (
        "uns/gw-01/camera-adapter/cam-1/cmd/sb/capture"
    )
    site = TopicScope("uns", "gw-01", "cip", root_level="plant-1")
    assert site.topic("evt") == "uns/plant-1/gw-01/cip/evt"
