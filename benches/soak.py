"""`make soak`: the demo stack at its steady load for a while, its resources sampled.

Runs `unskit demo --duration S`, reads each process's pid from the demo's own listing, and
every few seconds samples per process the resident set (VmRSS), open file descriptors and
threads, and the size of the SQLite files under the demo's state folder. After a warm-up (a
quarter of the run, at least 30 s) it fits a least-squares line to each series and fails
when one grows faster than its tolerance:

    RSS                  4 MiB per hour, per process
    file descriptors     2 over the measured window, per process
    threads              2 over the measured window, per process
    SQLite files         8 MiB per hour, all together
    queue depths         50 entries over the measured window, per queue (the
                         `queues/depth` gauges each component publishes on the demo's
                         broker every 10 s: publish backlog, command inbox, captures,
                         files to deliver)

The worst RSS slope is written as a row of benches/results.json (ours: the slope in MiB/h;
anchor: the tolerance; a ratio below 1 passes), so a leak shows beside the performance
figures. Exit 0 when every series is within its tolerance and the demo exited 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benches.conftest import record_ratio  # noqa: E402
from unskit.config.model import BrokerConfig, MessagingConfig  # noqa: E402
from unskit.demo.plan import ROOT as DEMO_ROOT  # noqa: E402
from unskit.envelope import Message  # noqa: E402
from unskit.messaging import MessagingClient  # noqa: E402
from unskit.runtime.component import QUEUES_FAMILY  # noqa: E402

RSS_MIB_PER_HOUR = 4.0
FDS_PER_WINDOW = 2.0
THREADS_PER_WINDOW = 2.0
SQLITE_MIB_PER_HOUR = 8.0
QUEUE_ENTRIES_PER_WINDOW = 50.0
SAMPLE_EVERY_S = 5.0
MIN_WARMUP_S = 30.0
_LISTED = re.compile(r"^\s+(?P<name>[a-z][a-z0-9-]+)\s+pid (?P<pid>\d+)\s")
_BROKER = re.compile(r"^broker\s+(?P<host>[^\s:]+):(?P<port>\d+)\s")


@dataclass
class Series:
    """One measured quantity over time: (seconds since start, value)."""

    points: list[tuple[float, float]] = field(default_factory=list)

    def slope_per_s(self, after_s: float) -> float:
        """Least-squares slope of the points at or after `after_s` (0 with fewer than 3)."""
        kept = [(t, v) for t, v in self.points if t >= after_s]
        if len(kept) < 3:
            return 0.0
        n = len(kept)
        mean_t = sum(t for t, _ in kept) / n
        mean_v = sum(v for _, v in kept) / n
        spread = sum((t - mean_t) ** 2 for t, _ in kept)
        if spread == 0:
            return 0.0
        return sum((t - mean_t) * (v - mean_v) for t, v in kept) / spread


@dataclass(frozen=True)
class Verdict:
    what: str
    slope: float
    limit: float
    unit: str

    @property
    def ok(self) -> bool:
        return self.slope <= self.limit


def judge(
    series: dict[str, Series], sqlite: Series, warmup_s: float, window_s: float
) -> list[Verdict]:
    """Every series against its tolerance, after the warm-up."""
    verdicts = []
    for key, values in sorted(series.items()):
        process, kind = key.rsplit(":", 1)
        slope = values.slope_per_s(warmup_s)
        if kind == "rss_mib":
            verdicts.append(Verdict(f"{process} RSS", slope * 3600, RSS_MIB_PER_HOUR, "MiB/h"))
        elif kind == "fds":
            verdicts.append(Verdict(f"{process} fds", slope * window_s, FDS_PER_WINDOW, "fds"))
        elif kind == "threads":
            verdicts.append(
                Verdict(f"{process} threads", slope * window_s, THREADS_PER_WINDOW, "threads")
            )
        elif kind == "queue":
            verdicts.append(
                Verdict(f"{process} queue", slope * window_s, QUEUE_ENTRIES_PER_WINDOW, "entries")
            )
    sqlite_slope = sqlite.slope_per_s(warmup_s) * 3600
    verdicts.append(Verdict("SQLite files", sqlite_slope, SQLITE_MIB_PER_HOUR, "MiB/h"))
    return verdicts


def _sample_process(pid: int) -> dict[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": float(fields["Threads"]),
        "fds": float(fds),
    }


def _sqlite_mib(state: Path) -> float:
    files = [p for p in state.rglob("*") if p.is_file() and ".db" in p.name]
    return sum(p.stat().st_size for p in files) / (1 << 20)


class QueueDepths:
    """The `queues/depth` gauges the demo's components publish, as series keyed
    ``{component} {queue}:queue``."""

    def __init__(self, start: float) -> None:
        self._start = start
        self._lock = threading.Lock()
        self.series: dict[str, Series] = {}
        self._client: MessagingClient | None = None

    def watch(self, host: str, port: int) -> None:
        config = MessagingConfig(local=BrokerConfig(host=host, port=port, client_id="soak"))
        client = MessagingClient(config, persistent_session=False).start()
        self._client = client
        if not client.wait_connected(10):
            raise RuntimeError(f"cannot connect to the demo's broker at {host}:{port}")
        client.subscribe(f"{DEMO_ROOT}/#", self._on_message, max_concurrency=1)

    def _on_message(self, topic: str, message: Message) -> None:
        body = message.body
        if not (isinstance(body, dict) and body.get("family") == QUEUES_FAMILY):
            return
        identity = message.identity
        component = identity.component if identity is not None else topic
        now = time.monotonic() - self._start
        with self._lock:
            for metric in body.get("metrics") or []:
                queue = (metric.get("dimensions") or {}).get("queue")
                if metric.get("name") == "depth" and queue:
                    key = f"{component} {queue}:queue"
                    point = (now, float(metric["value"]))
                    self.series.setdefault(key, Series()).points.append(point)

    def close(self) -> None:
        if self._client is not None:
            self._client.close(1)


def soak(seconds: float) -> int:
    """Runs the demo for `seconds` while sampling; prints the verdicts; exit code."""
    with tempfile.TemporaryDirectory(prefix="unskit-soak-") as tmp:
        output = Path(tmp) / "demo"
        command = [
            sys.executable, "-m", "unskit.cli", "demo",
            "--duration", str(seconds), "--output", str(output),
        ]  # fmt: skip
        demo = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert demo.stdout is not None
        pids: dict[str, int] = {}
        broker: list[tuple[str, int]] = []
        listed = threading.Event()

        def read() -> None:
            assert demo.stdout is not None
            for line in demo.stdout:
                match = _LISTED.match(line)
                if match:
                    pids[match["name"]] = int(match["pid"])
                elif (found := _BROKER.match(line)) is not None:
                    broker.append((found["host"], int(found["port"])))
                elif pids:
                    listed.set()
            listed.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        listed.wait(120)
        series: dict[str, Series] = {}
        sqlite = Series()
        start = time.monotonic()
        queues = QueueDepths(start)
        if broker:
            queues.watch(*broker[0])
        while demo.poll() is None:
            now = time.monotonic() - start
            for name, pid in pids.items():
                sample = _sample_process(pid)
                for kind, value in (sample or {}).items():
                    series.setdefault(f"{name}:{kind}", Series()).points.append((now, value))
            sqlite.points.append((now, _sqlite_mib(output / "state")))
            with contextlib.suppress(subprocess.TimeoutExpired):
                demo.wait(SAMPLE_EVERY_S)
        reader.join(10)
        queues.close()
        window_s = time.monotonic() - start
        series.update(queues.series)
    warmup_s = max(MIN_WARMUP_S, window_s / 4)
    verdicts = judge(series, sqlite, warmup_s, window_s - warmup_s)
    for verdict in verdicts:
        mark = "ok  " if verdict.ok else "FAIL"
        print(
            f"{mark} {verdict.what:40} {verdict.slope:9.3f} {verdict.unit} (limit {verdict.limit})"
        )
    rss = [v for v in verdicts if v.what.endswith("RSS")]
    worst = max(rss, key=lambda v: v.slope) if rss else Verdict("RSS", 0.0, RSS_MIB_PER_HOUR, "")
    record_ratio(
        "soak RSS slope, worst process (MiB/h; lower is better)",
        max(worst.slope, 0.0),
        "tolerance MiB/h",
        RSS_MIB_PER_HOUR,
        unit="MiB/h",
        lower_is_better=True,
        worst_process=worst.what,
        seconds=round(window_s),
        verdicts={v.what: round(v.slope, 3) for v in verdicts},
        passed=all(v.ok for v in verdicts),
    )
    print(f"demo exit {demo.returncode}; {len(verdicts)} series over {window_s:.0f} s")
    return 0 if demo.returncode == 0 and all(v.ok for v in verdicts) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="how long (600)")
    return soak(parser.parse_args().seconds)


if __name__ == "__main__":
    sys.exit(main())
