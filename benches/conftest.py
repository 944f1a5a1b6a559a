"""Shared benchmark plumbing: every bench records ours beside its anchor as one row.

Rows go to benches/results.json (name, ours_ops_per_s, anchor, anchor_ops_per_s, ratio);
`benches/report.py` prints them as a table after `make bench`.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.mosquitto import Mosquitto
from tests.support.pki import make_pki

from unskit.config.model import BrokerConfig, MessagingConfig
from unskit.messaging import MessagingClient

# `make bench-check` points this elsewhere so a gate run never overwrites `make bench`'s table.
RESULTS = Path(os.environ.get("UNSKIT_BENCH_RESULTS") or Path(__file__).with_name("results.json"))


def record_ratio(
    name: str,
    ours_ops_per_s: float,
    anchor: str,
    anchor_ops_per_s: float,
    **extra: Any,
) -> dict[str, Any]:
    """Adds (or replaces) the row `name` in results.json and returns it."""
    row: dict[str, Any] = {
        "name": name,
        "ours_ops_per_s": round(ours_ops_per_s, 1),
        "anchor": anchor,
        "anchor_ops_per_s": round(anchor_ops_per_s, 1),
        "ratio": round(ours_ops_per_s / anchor_ops_per_s, 2),
        **extra,
    }
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    rows = [r for r in rows if r["name"] != name] + [row]
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=2) + "\n")
    os.replace(tmp, RESULTS)
    return row


@pytest.fixture
def ratio() -> Callable[..., dict[str, Any]]:
    """The `record_ratio` function, for benches that measure outside pytest-benchmark."""
    return record_ratio


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A real Mosquitto on free loopback ports (TCP_NODELAY on), one per bench module."""
    folder = tmp_path_factory.mktemp("bench-mqtt")
    mosquitto = Mosquitto(folder / "broker", make_pki(folder / "pki")).start()
    yield mosquitto
    mosquitto.stop()


def connected_client(port: int) -> MessagingClient:
    """Our messaging client on 127.0.0.1:`port`, connected."""
    config = BrokerConfig(host="127.0.0.1", port=port, client_id=f"bench-{uuid.uuid4().hex[:8]}")
    client = MessagingClient(MessagingConfig(local=config)).start()
    assert client.wait_connected(10), "our client did not connect"
    return client
