"""Fixtures every test folder shares: the test PKI and a real Mosquitto broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki, make_pki
from tests.support.servers import root_logging_restored


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Mosquitto]:
    mosquitto = Mosquitto(tmp_path_factory.mktemp("mosquitto"), pki).start()
    yield mosquitto
    mosquitto.stop()


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    """For tests that run a Runtime in-process: it configures the root logger."""
    with root_logging_restored():
        yield
