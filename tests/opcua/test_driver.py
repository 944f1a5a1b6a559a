"""The OPC UA driver against the asyncua simulator: subscriptions, matching, values."""

from __future__ import annotations

import pytest

from tests.support.opcua import CollectingSink, good, instance, matcher, subscription

pytestmark = pytest.mark.integration


def test_smoke(opcua_server, make_driver):
    sim = opcua_server("--namespaces", "urn:a,urn:unskit:sim")
    driver = make_driver(instance(sim.endpoint, [subscription(matcher("Counter|Double|Range"))]))
    driver.connect(10)
    sink = CollectingSink()
    driver.subscribe(sink)
    print(sorted(s.id for s in driver.signals()))
    sink.wait_for(lambda: len(good(sink, "ns=3;s=Counter")) >= 3, 10, "counter")
    print(sink.readings[:6])
    print(driver.describe())
