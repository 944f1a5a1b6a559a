"""The signal-recorder run in-process (or as `unskit run signal-recorder`) on a real
Mosquitto, fed by the ethernet-ip-adapter on its sim backend, and its files read back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from tests.support.adapter import (
    Adapter,
    AdapterHarness,
    Inbox,
    connected_client,
    framework_sections,
    inbox_answers,
)
from tests.support.mosquitto import Mosquitto
from tests.support.servers import root_logging_restored, wait_until
from tests.support.tiers import server_fixture
from unskit.cip.component import EthernetIpAdapter
from unskit.commands import CommandClient
from unskit.config import ConfigLoader
from unskit.envelope import Identity, Message, MessageBuilder
from unskit.messaging import MessagingClient
from unskit.messaging.groups import PROBE_NAME
from unskit.recorder.component import SignalRecorder
from unskit.runtime.component import Runtime

#: The sim PLC's signals: a sine (REAL), a counter (DINT), a square wave (BOOL), an array.
SIM_SIGNALS = (
    {"name": "temp", "tagPath": "Temp", "type": "REAL"},
    {"name": "count", "tagPath": "Count", "type": "DINT"},
    {"name": "flag", "tagPath": "Flag", "type": "BOOL"},
    {"name": "counts", "tagPath": "Counts", "type": "DINT", "arrayCount": 4},
)


def sim_plc(instance: str = "plc-1", poll_ms: int = 20) -> dict[str, Any]:
    """A sim instance publishing every poll (publishMode always)."""
    return {
        "global": {"defaults": {"publishMode": "always"}},
        "instances": [
            {
                "id": instance,
                "adapter": "sim",
                "connection": {"endpoint": "sim.local"},
                "pollGroups": [
                    {"id": "fast", "pollIntervalMs": poll_ms, "signals": list(SIM_SIGNALS)}
                ],
            }
        ],
    }


@dataclass
class Running:
    runtime: Runtime
    app: Any
    client: CommandClient
    output: Path
    config_path: Path
    document: dict[str, Any]

    def reload(self, section: Mapping[str, Any]) -> dict[str, Any]:
        self.document["component"] = dict(section)
        self.config_path.write_text(json.dumps(self.document))
        return self.call("reload-config", {"requestId": uuid.uuid4().hex})

    def call(self, verb: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        reply: dict[str, Any] = self.client.call(verb, dict(body or {}), timeout=20)
        return reply

    def status(self) -> dict[str, Any]:
        return self.call("status")


class Rig:
    """One topic root shared by a sim PLC, recorders and a listener of every data topic."""

    def __init__(self, broker: Mosquitto, tmp_path: Path) -> None:
        self.broker = broker
        self.tmp_path = tmp_path
        self.root = f"t{uuid.uuid4().hex[:8]}"
        self.adapters = AdapterHarness(broker, tmp_path)
        self.runtimes: list[Runtime] = []
        self.clients: list[MessagingClient] = []
        self.data = Inbox()
        self._logging = root_logging_restored()
        self._logging.__enter__()
        self.listener = connected_client(broker.plain_port)
        self.clients.append(self.listener)
        self.listener.subscribe(f"{self.root}/+/+/+/data/#", self.data.add, max_concurrency=1)
        wait_until(self.listener.subscriptions_acknowledged, 10, "the listener's SUBACK")

    def document(self, component: Mapping[str, Any], **sections: Any) -> dict[str, Any]:
        doc = {
            "component": dict(component),
            **framework_sections(self.broker.plain_port, self.tmp_path),
        }
        doc["topic"] = {"root": self.root}
        doc.update(sections)
        return doc

    def recorder_section(self, output: Path, **settings: Any) -> dict[str, Any]:
        return {"output": {"path": str(output)}, **settings}

    def start_recorder(self, output: Path, thing: str = "rec", **settings: Any) -> Running:
        return self.start_component(SignalRecorder, self.recorder_section(output, **settings),
                                    thing, output)  # fmt: skip

    def start_component(
        self, app_class: Any, section: Mapping[str, Any], thing: str, output: Path
    ) -> Running:
        document = self.document(section)
        path = self.tmp_path / f"{app_class.token}-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(document))
        loader = ConfigLoader(
            path, thing=thing, component_schema=app_class.schema, default_component=app_class.token
        )
        runtime = Runtime(loader.load())
        app = app_class()
        self.runtimes.append(runtime)
        runtime.start(app, loader)
        messaging = connected_client(self.broker.plain_port)
        self.clients.append(messaging)
        client = CommandClient.for_scope(messaging, runtime.topics)
        wait_until(lambda: inbox_answers(client), 10, f"the {app_class.token} inbox")
        wait_until(runtime.get_messaging().subscriptions_acknowledged, 10, "the SUBACK")
        return Running(runtime, app, client, output, path, document)

    def start_plc(self, component: Mapping[str, Any] | None = None, thing: str = "gw") -> Adapter:
        document = self.document(component or sim_plc())
        return self.adapters.start(EthernetIpAdapter, document, thing)

    def close(self) -> None:
        self.adapters.close()
        for messaging in self.clients:
            messaging.close(1)
        for runtime in self.runtimes:
            runtime.shutdown()
        self._logging.__exit__(None, None, None)

    # -- what was published ----------------------------------------------------------------

    def published(self) -> list[tuple[str, Message]]:
        with self.data.lock:
            return list(self.data.messages)


@server_fixture
def rig(broker: Mosquitto, tmp_path: Path) -> Iterator[Rig]:
    made = Rig(broker, tmp_path)
    yield made
    made.close()


# -- samples, as published and as read back -----------------------------------------------


def _norm(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(float(v) for v in value)
    return value


def published_samples(messages: list[tuple[str, Message]]) -> list[tuple[Any, ...]]:
    """(signal id, source ts, server ts, quality, value) of every sample published."""
    rows = []
    for _, message in messages:
        if message.header.name == PROBE_NAME:
            continue  # a consumer group's probe crosses the data topics once per member
        body = message.body
        for sample in body["samples"]:
            rows.append(
                (
                    body["signal"]["id"],
                    sample["source_timestamp_ms"],
                    sample["server_timestamp_ms"],
                    sample["quality"],
                    _norm(sample["value"]),
                )
            )
    return sorted(rows, key=repr)


def _ms(value: Any) -> int:
    return 0 if value is None else int(value.timestamp() * 1000 + 0.5)


def _typed_value(row: Mapping[str, Any]) -> Any:
    kind = row["value_type"]
    if kind == "null":
        return None
    if kind == "json":
        return json.loads(row["value_json"])
    return _norm(row[f"value_{kind}"])


def read_with_pyarrow(output: Path) -> list[tuple[Any, ...]]:
    """Every closed file under `output`, through pyarrow.dataset with Hive partitions."""
    dataset = ds.dataset(
        output,
        format="parquet",
        partitioning=ds.HivePartitioning.discover(infer_dictionary=True),
    )
    table = dataset.to_table()
    return sorted(
        (
            (r["signal_id"], _ms(r["source_ts"]), _ms(r["server_ts"]), r["quality"],
             _typed_value(r))
            for r in table.to_pylist()
        ),
        key=repr,
    )  # fmt: skip


def read_with_duckdb(output: Path) -> list[tuple[Any, ...]]:
    """The same through DuckDB's own Parquet reader (an independent implementation)."""
    glob = str(output / "**" / "*.parquet")
    connection = duckdb.connect()
    try:
        rows = connection.execute(
            "SELECT signal_id, epoch_ms(source_ts), epoch_ms(server_ts), quality, value_type,"
            " value_float64, value_int64, value_bool, value_string, value_list, value_json"
            " FROM read_parquet(?, hive_partitioning = false)",
            [glob],
        ).fetchall()
    finally:
        connection.close()
    out = []
    for signal, source, server, quality, kind, f64, i64, flag, text, items, js in rows:
        value = {
            "null": None,
            "float64": f64,
            "int64": i64,
            "bool": flag,
            "string": text,
            "list": None if items is None else tuple(float(v) for v in items),
            "json": None if js is None else json.loads(js),
        }[kind]
        out.append((signal, source or 0, server or 0, quality, value))
    return sorted(out, key=repr)


def parquet_files(output: Path) -> list[Path]:
    return sorted(output.rglob("*.parquet"))


def leftovers(output: Path) -> list[Path]:
    return sorted(p for p in output.rglob("*") if p.is_file() and p.suffix != ".parquet")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    wait_until(condition, timeout, what, interval=0.02)


def update(signal: str, samples: list[dict[str, Any]], device: str = "gw") -> Message:
    """A signal update as an adapter on `device` publishes it."""
    identity = Identity("site/device", f"plant-1/{device}", "ethernet-ip-adapter", "plc-1")
    return (
        MessageBuilder("SouthboundSignalUpdate", "1.0")
        .identity(identity)
        .signal_update(signal, samples, name=f"Program:{signal}")
        .build()
    )


def data_topic(root: str, signal: str, device: str = "gw", instance: str = "plc-1") -> str:
    return f"{root}/{device}/ethernet-ip-adapter/{instance}/data/{signal}"


class Alarms:
    """Every alarm and event the recorder publishes, by type."""

    def __init__(self, messaging: MessagingClient, root: str) -> None:
        self.inbox = Inbox()
        messaging.subscribe(f"{root}/+/signal-recorder/evt/#", self.inbox.add, max_concurrency=1)
        wait_until(messaging.subscriptions_acknowledged, 10, "the alarm listener's SUBACK")

    def states(self, alarm_type: str) -> list[str]:
        with self.inbox.lock:
            bodies = [m.body for _, m in self.inbox.messages]
        return [b["state"] for b in bodies if b.get("type") == alarm_type and "state" in b]


__all__ = ["pa"]
