"""Topic filters, UNS topics and the reserved classes."""

from __future__ import annotations

import pytest

from unskit.errors import ReservedTopicError
from unskit.messaging import MessagingClient, TopicScope, topic_matches_filter
from unskit.topics import check_not_reserved, topic_class


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


def test_topic_scope_builds_component_topics():
    topics = TopicScope("uns", "gw-01", "camera-adapter")
    assert topics.topic("data", "temperature") == "uns/gw-01/camera-adapter/data/temperature"
    assert topics.topic("cmd", "sb", "capture", instance="cam-1") == (
        "uns/gw-01/camera-adapter/cam-1/cmd/sb/capture"
    )
    site = TopicScope("uns", "gw-01", "cip", root_level="plant-1")
    assert site.topic("evt") == "uns/plant-1/gw-01/cip/evt"
