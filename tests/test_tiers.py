"""The tier of a test is decided by the fixture definitions it runs, never by their names."""

from __future__ import annotations

import pytest

from tests.support.tiers import uses_server

CONFTEST = """
import pytest
from tests.support.tiers import server_fixture

@server_fixture(scope="module")
def broker():
    return "a real broker"

@pytest.fixture
def server():
    return "a plain value that happens to share a server fixture's old name"

@pytest.fixture
def client(broker):
    return broker
"""

TESTS = """
import pytest

def test_plain(server):
    assert server

def test_direct(broker):
    assert broker

def test_through_another_fixture(client):
    assert client

class TestOverride:
    @pytest.fixture
    def broker(self):
        return "a local broker fixture, not a server"

    def test_overridden(self, broker):
        assert broker

class TestExtension:
    @pytest.fixture
    def broker(self, broker):
        return broker + ", extended"

    def test_extended(self, broker):
        assert broker
"""


def test_a_server_fixture_makes_a_test_integration_wherever_it_is_used(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sample=TESTS)
    # pytest-benchmark asks git for the project name at start-up: a process, not for this tier.
    items, _ = pytester.inline_genitems("-p", "no:benchmark")
    tiers = {item.name: uses_server(item) for item in items}
    assert tiers == {
        "test_plain": False,
        "test_direct": True,
        "test_through_another_fixture": True,
        "test_overridden": False,
        "test_extended": True,
    }
