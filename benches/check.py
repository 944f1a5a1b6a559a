"""`make bench-check`: the benchmark regression gate.

Runs a bounded subset of the benchmarks (CPU-bound pairs, ours beside its anchor in one
process) RUNS times, takes each row's median ours/anchor ratio and fails when a row falls
more than its tolerance below the committed baseline (benches/baseline.json):

    fail when  median ratio < baseline ratio x (1 - tolerance)

Ratios, not absolute times: both sides of a row see the same machine. For the rows that
pytest-benchmark times (envelope) the gate takes each side's best round (its `min`), not
the mean that results.json holds: on a shared machine the mean of one side swings 2-3x
with whatever else runs, the best round of thousands hardly moves. The CIP and image rows
are best rounds of ours and the anchor interleaved (benches/interleaved.py), taken from
results.json as they are: the CIP rows' best rounds timed one side after the other still
moved with the phase each ran in (16.7x to 31.5x in three runs of one gate). Every tolerance must
be below 0.5, so a 2x slowdown of ours (half the ratio) always fails. A missing or malformed
baseline fails the gate with the JSON path of the fault; it never passes silently.

A row whose ratio depends on the CPU's vector units (CRC32C: AVX-512 VPCLMULQDQ, AVX2
VPCLMULQDQ or PCLMULQDQ kernels) keeps one baseline per CPU class under "by_cpu"; the gate
takes this machine's class, and a class with no baseline fails until one is recorded here
(`--record` adds it), never falls back to another class's number.

    python benches/check.py                 # run the subset, compare, print the table
    python benches/check.py --from DIR DIR   # judge runs already made (results.json,
                                             # timings.json in each DIR)
    python benches/check.py --record        # run, then rewrite the baseline's ratios
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHES = Path(__file__).resolve().parent
ROOT = BENCHES.parent
BASELINE = BENCHES / "baseline.json"
RUNS = 3
# A tolerance of 0.5 or more would let a 2x regression (half the ratio) pass.
MAX_TOLERANCE = 0.5
# The tolerance a CPU class's first recorded baseline gets (the least any row has).
MIN_NEW_TOLERANCE = 0.1

# CPU-bound pairs only: network and disk rows swing with the other tenants of the machine.
# Left out too: signal vs numba, whose two sides run one after the other in ~1 s phases of
# 15-80 ms rounds; its best-round ratio fell 49% below its median in the 10 measured runs
# (docs/decisions.md), too noisy to gate below a 2x tolerance (interleaving did not help).
SUBSET = (
    "benches/bench_envelope.py",
    "benches/bench_cip.py::test_cip_decode_ratio",
    "benches/bench_image.py::test_sha256[1MiB]",
    "benches/bench_image.py::test_crc32c[1MiB]",
    "benches/bench_image.py::test_thumbnail_raw",
    "benches/bench_image.py::test_thumbnail_from_jpeg",
)


# Rows whose ratio the gate takes from pytest-benchmark's timings: (test function, params of
# ours, params of the anchor). Both sides of each pair do the same units of work per call.
PAIRS: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {
    **{
        f"envelope.{case}.{body}": (
            "test_envelope",
            {"case": case, "body": body, "impl": "ours"},
            {"case": case, "body": body, "impl": "anchor"},
        )
        for case in ("build_encode", "decode", "decode_to_dict")
        for body in ("typical", "opaque_4k")
    },
}  # fmt: skip


def cpu_class(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This machine's class for the CPU-dependent rows: its architecture and vector units."""
    machine = platform.machine().lower()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return machine
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    if "vpclmulqdq" in flags and "avx512vl" in flags:
        return f"{machine}-avx512-vpclmulqdq"
    if "vpclmulqdq" in flags and "avx2" in flags:
        return f"{machine}-avx2-vpclmulqdq"
    if "pclmulqdq" in flags:
        return f"{machine}-pclmulqdq"
    return machine


class BaselineError(Exception):
    """The baseline file is missing or malformed (the message names the JSON path)."""


class RunError(Exception):
    """A benchmark run failed or produced no usable rows."""


@dataclass(frozen=True)
class Gate:
    """One gated row: the committed ratio and how far below it a run may fall."""

    name: str
    ratio: float
    tolerance: float
    # The CPU class of a per-CPU row's baseline; None for a row with one baseline.
    cpu: str | None = None

    @property
    def floor(self) -> float:
        """The lowest ratio that passes."""
        return self.ratio * (1 - self.tolerance)


@dataclass(frozen=True)
class Verdict:
    """One row's outcome: the gate, the ratios measured in each run and their median."""

    gate: Gate
    measured: tuple[float, ...]

    @property
    def median(self) -> float | None:
        """The median of the runs' ratios, None when no run produced the row."""
        return statistics.median(self.measured) if self.measured else None

    @property
    def passed(self) -> bool:
        """True when the median is at or above the floor."""
        return self.median is not None and self.median >= self.gate.floor


def load_baseline(path: Path = BASELINE, recording: bool = False) -> dict[str, Gate]:
    """Reads and checks the baseline; raises BaselineError naming the file and JSON path."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(
            f"{path}: missing; the gate has nothing to compare against "
            "(restore the committed one: `git checkout -- benches/baseline.json`)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: unreadable: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return parse_baseline(document, str(path), recording=recording)


def parse_baseline(
    document: Any, source: str = "baseline", cpu: str | None = None, recording: bool = False
) -> dict[str, Gate]:
    """Checks a decoded baseline document; raises BaselineError naming the JSON path."""
    if not isinstance(document, dict):
        raise BaselineError(f"{source}: $: must be an object, got {_kind(document)}")
    rows = document.get("rows")
    if not isinstance(rows, dict):
        raise BaselineError(f"{source}: $.rows: must be an object of gated rows, got {_kind(rows)}")
    if not rows:
        raise BaselineError(f"{source}: $.rows: is empty; a gate of no rows checks nothing")
    cpu = cpu or cpu_class()
    gates = {}
    for name, row in rows.items():
        where = f"{source}: $.rows[{json.dumps(name)}]"
        if not isinstance(row, dict):
            raise BaselineError(f"{where}: must be an object, got {_kind(row)}")
        if "by_cpu" not in row:
            gates[name] = _gate(name, row, where)
            continue
        if set(row) != {"by_cpu"}:
            raise BaselineError(f"{where}: a by_cpu row has no other keys")
        classes = row["by_cpu"]
        if not isinstance(classes, dict) or not classes:
            raise BaselineError(f"{where}.by_cpu: must be an object of CPU classes")
        for other, entry in classes.items():
            at = f"{where}.by_cpu[{json.dumps(other)}]"
            if not isinstance(entry, dict):
                raise BaselineError(f"{at}: must be an object, got {_kind(entry)}")
            gate = _gate(name, entry, at)
            if other == cpu:
                gates[name] = Gate(name, gate.ratio, gate.tolerance, cpu)
        if name not in gates:
            if not recording:
                raise BaselineError(
                    f"{where}.by_cpu: no baseline for this machine's CPU class {cpu!r} "
                    f"(recorded: {', '.join(sorted(classes))}); measure it here with "
                    "`python benches/check.py --record`"
                )
            # Recording this class's first baseline: a placeholder the record replaces.
            gates[name] = Gate(name, 1.0, MIN_NEW_TOLERANCE, cpu)
    return gates


def _gate(name: str, row: Mapping[str, Any], where: str) -> Gate:
    unknown = sorted(set(row) - {"ratio", "tolerance", "spread"})
    if unknown:
        raise BaselineError(f"{where}: unknown key {unknown[0]!r}")
    ratio = _number(row, "ratio", where)
    if ratio <= 0:
        raise BaselineError(f"{where}.ratio: must be above 0, got {ratio}")
    tolerance = _number(row, "tolerance", where)
    if not 0 < tolerance < MAX_TOLERANCE:
        raise BaselineError(
            f"{where}.tolerance: must be above 0 and below {MAX_TOLERANCE} "
            f"(at {MAX_TOLERANCE} a 2x regression would pass), got {tolerance}"
        )
    return Gate(name, ratio, tolerance)


def _number(row: Mapping[str, Any], key: str, where: str) -> float:
    if key not in row:
        raise BaselineError(f"{where}: missing required key {key!r}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BaselineError(f"{where}.{key}: must be a finite number, got {json.dumps(value)}")
    return float(value)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def read_run(folder: Path) -> dict[str, float]:
    """One run's ratios {row: ours/anchor} from its results.json and timings.json."""
    results, timings = folder / "results.json", folder / "timings.json"
    try:
        ratios = {
            str(row["name"]): float(row["ratio"])
            for row in json.loads(results.read_text(encoding="utf-8"))
        }
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RunError(f"{results}: not a results file of the benches: {exc}") from exc
    try:
        best = {
            (bench["name"].split("[")[0], json.dumps(bench["params"], sort_keys=True)): float(
                bench["stats"]["min"]
            )
            for bench in json.loads(timings.read_text(encoding="utf-8"))["benchmarks"]
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RunError(f"{timings}: not a pytest-benchmark JSON file: {exc}") from exc
    for row, (test, ours, anchor) in PAIRS.items():
        ours_s = best.get((test, json.dumps(ours, sort_keys=True)))
        anchor_s = best.get((test, json.dumps(anchor, sort_keys=True)))
        if ours_s and anchor_s:
            ratios[row] = round(anchor_s / ours_s, 3)
        else:
            ratios.pop(row, None)  # not timed in this run: the gate reports it unmeasured
    return ratios


def judge(gates: Mapping[str, Gate], runs: Sequence[Mapping[str, float]]) -> list[Verdict]:
    """Each gated row's verdict over the runs (a row no run produced fails)."""
    return [
        Verdict(gate, tuple(run[name] for run in runs if name in run))
        for name, gate in gates.items()
    ]


def render(verdicts: Sequence[Verdict], runs: int) -> str:
    """The table: baseline, tolerance, floor, each run's ratio, the median and the verdict."""
    header = (
        f"{'row':46} {'baseline':>8} {'tol':>5} {'floor':>7} "
        f"{'runs':>{6 * runs}} {'median':>7}  verdict"
    )
    lines = [header, "-" * len(header)]
    for verdict in sorted(verdicts, key=lambda v: v.gate.name):
        gate = verdict.gate
        each = " ".join(f"{r:5.2f}" for r in verdict.measured) or "-"
        median = "-" if verdict.median is None else f"{verdict.median:6.2f}x"
        if verdict.passed:
            outcome = "ok"
        elif verdict.median is None:
            outcome = "FAIL (not measured)"
        else:
            outcome = f"FAIL ({verdict.median / gate.ratio:.0%} of baseline)"
        lines.append(
            f"{gate.name + (f' [{gate.cpu}]' if gate.cpu else ''):46} "
            f"{gate.ratio:7.2f}x {gate.tolerance:5.2f} {gate.floor:6.2f}x "
            f"{each:>{6 * runs}} {median:>7}  {outcome}"
        )
    return "\n".join(lines)


def run_subset(folder: Path) -> dict[str, float]:
    """Runs the subset once in a fresh pytest process, its files written into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "UNSKIT_BENCH_RESULTS": str(folder / "results.json")}
    command = [
        sys.executable, "-m", "pytest", *SUBSET,
        "--benchmark-only", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
        f"--benchmark-json={folder / 'timings.json'}",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        raise RunError("the benchmark run took over 900 s; the machine is too loaded") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise RunError(f"the benchmark run failed (pytest exit {done.returncode}):\n{tail}")
    return read_run(folder)


def record(path: Path, gates: Mapping[str, Gate], runs: Sequence[Mapping[str, float]]) -> None:
    """Rewrites the baseline's ratios (medians) and spreads from the runs, keeping tolerances."""
    document = json.loads(path.read_text(encoding="utf-8"))
    verdicts = judge(gates, runs)
    for verdict in verdicts:
        if verdict.median is None:
            raise RunError(f"{verdict.gate.name}: not measured, the baseline is left as it was")
    for verdict in verdicts:
        gate = verdict.gate
        row = document["rows"][gate.name]
        if gate.cpu is not None:
            row = row["by_cpu"].setdefault(gate.cpu, {"tolerance": gate.tolerance})
        row["ratio"] = round(verdict.median or 0.0, 3)
        row["spread"] = [min(verdict.measured), max(verdict.measured)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every gated row holds, 1 on a regression, 2 on a bad baseline or run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--runs", type=int, default=RUNS, help="runs of the subset (median)")
    parser.add_argument(
        "--from", dest="folders", type=Path, nargs="+", help="judge these runs' folders"
    )
    parser.add_argument("--record", action="store_true", help="rewrite the baseline ratios")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        # The baseline first: a bad one fails in a second, not after minutes of benchmarks.
        gates = load_baseline(args.baseline, recording=args.record)
        started = time.monotonic()
        if args.folders:
            runs = [read_run(folder) for folder in args.folders]
        else:
            runs = []
            with tempfile.TemporaryDirectory(prefix="bench-check-") as folder:
                for index in range(args.runs):
                    print(f"bench-check: run {index + 1} of {args.runs}...", flush=True)
                    runs.append(run_subset(Path(folder) / f"run-{index}"))
        if args.record:
            record(args.baseline, gates, runs)
            print(f"bench-check: {args.baseline} rewritten from {len(runs)} runs")
            return 0
    except (BaselineError, RunError) as exc:
        print(f"bench-check: {exc}", file=sys.stderr)
        return 2
    verdicts = judge(gates, runs)
    print(render(verdicts, len(runs)))
    failed = [v.gate.name for v in verdicts if not v.passed]
    seconds = time.monotonic() - started
    if failed:
        print(f"bench-check: FAILED ({seconds:.0f} s): {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"bench-check: {len(verdicts)} rows hold their baseline ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
