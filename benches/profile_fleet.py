"""Where the time goes in `unskit fleet-sim` at the largest K of bench_fleet: runs it under
py-spy (sampling whichever thread holds the GIL: the one process's Python CPU) against a fresh
Mosquitto or 3-node NATS cluster; prints the brokers' CPU seconds, the busiest functions
(self time) and the share of each part.

    python benches/profile_fleet.py [--broker mosquitto|nats] [--py-spy PATH] [-k 16]

py-spy is not a project dependency: `pip install py-spy` (or give --py-spy PATH).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "python")]

from tests.support.mosquitto import Mosquitto  # noqa: E402
from tests.support.nats import NatsCluster  # noqa: E402
from tests.support.pki import make_pki  # noqa: E402

#: Stack parts, first match from the leaf up wins (module path fragments).
PARTS = (
    ("paho network loop (socket, MQTT framing)", ("paho/mqtt",)),
    ("envelope build/decode (Rust)", ("envelope.py", "Message", "build_message")),
    ("subscriber: counting and latency", ("fleet/sim.py:on_message",)),
    ("southbound runtime: gate, poll, publish", ("southbound/",)),
    ("messaging client: link, subscriptions", ("unskit/messaging/",)),
    ("threading / queues / waits", ("threading.py", "queue.py")),
)


def _part(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, fragments in PARTS:
            if any(f in frame for f in fragments):
                return name
    return "other"


def summarise(collapsed: Path, top: int) -> str:
    """Self time per function and share per part, from py-spy's collapsed stacks."""
    leaves: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        stack = stack_text.split(";")
        total += count
        leaves[stack[-1]] += count
        parts[_part(stack)] += count
    lines = [f"{total} samples of the thread holding the GIL", "", "share by part:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in parts.most_common()]
    lines += ["", f"top {top} functions by self time:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in leaves.most_common(top)]
    return "\n".join(lines)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("mosquitto", "nats"), default="nats")
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), metavar="PATH")
    parser.add_argument("-k", "--gateways", type=int, default=16)
    parser.add_argument("-m", "--signals", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    if not args.py_spy:
        print("py-spy not found: pip install py-spy, or give --py-spy PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        if args.broker == "mosquitto":
            server: Mosquitto | NatsCluster = Mosquitto(work / "b", make_pki(work / "pki")).start()
            brokers = f"127.0.0.1:{server.plain_port}"
        else:
            server = NatsCluster(work / "nats").start()
            brokers = ",".join(f"127.0.0.1:{n.mqtt_port}" for n in server.nodes)
        if isinstance(server, Mosquitto):
            pids = [server.process.pid] if server.process else []
        else:
            pids = [n.process.pid for n in server.nodes if n.process]
        out = work / "stacks.txt"
        command = [sys.executable, "-m", "unskit.cli", "fleet-sim", "--broker", brokers]
        command += ["-k", str(args.gateways), "-m", str(args.signals)]
        command += ["--rate", str(args.rate), "--duration", str(args.duration)]
        brokers_before = sum(_cpu_s(pid) for pid in pids)
        try:
            subprocess.run(
                [
                    *(args.py_spy, "record", "--format", "raw", "--gil", "--nonblocking"),
                    *("--rate", "100", "-o", str(out), "--", *command),
                ],
                check=True,
                cwd=REPO,
                env={"PYTHONPATH": f"{REPO / 'python'}:{REPO}", "PATH": "/usr/bin:/bin"},
                timeout=args.duration + 120,
            )
            brokers_cpu = sum(_cpu_s(pid) for pid in pids) - brokers_before
        finally:
            if isinstance(server, Mosquitto):
                server.stop()
            else:
                server.remove()
        print(
            f"CPU seconds of {args.broker} ({len(pids)} process(es)) over the whole run "
            f"(connect, probe, publish, drain): {brokers_cpu:.1f}; "
            f"{os.cpu_count()} cores x {args.duration:g} s = {os.cpu_count() * args.duration:g}"
        )
        print(summarise(out, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
