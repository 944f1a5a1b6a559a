"""The benchmark regression gate's judgement (`benches/check.py`, `make bench-check`): a bad
baseline fails with the JSON path, a 2x slowdown of any gated row fails, the measured spread
passes. The benchmarks themselves run for minutes (`make bench-check`), not in `make test`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from benches.check import (
    BASELINE,
    MAX_TOLERANCE,
    SUBSET,
    BaselineError,
    Gate,
    cpu_class,
    judge,
    load_baseline,
    main,
    parse_baseline,
    read_run,
    render,
)

GOOD = {
    "rows": {"a.row": {"ratio": 2.0, "tolerance": 0.25}, "b.row": {"ratio": 0.8, "tolerance": 0.1}}
}


def write(path: Path, content: Any) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def results_file(folder: Path, ratios: dict[str, float], timings: Any = None) -> Path:
    """A run's folder as `run_subset` leaves it: results.json and pytest-benchmark's JSON."""
    folder.mkdir()
    rows = [
        {"name": n, "ours_ops_per_s": r, "anchor": "x", "anchor_ops_per_s": 1.0, "ratio": r}
        for n, r in ratios.items()
    ]
    write(folder / "results.json", rows)
    write(folder / "timings.json", {"benchmarks": []} if timings is None else timings)
    return folder


def timed(test: str, params: dict[str, str], best: float, mean: float) -> dict[str, Any]:
    ids = "-".join(params.values())
    return {"name": f"{test}[{ids}]", "params": params, "stats": {"min": best, "mean": mean}}


# --- bad input: the baseline -----------------------------------------------------------------


def test_a_missing_baseline_fails_the_gate_with_a_clear_message(tmp_path, capsys) -> None:
    results = results_file(tmp_path / "run", {"a.row": 2.0, "b.row": 0.8})
    missing = tmp_path / "baseline.json"
    assert main(["--baseline", str(missing), "--from", str(results)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: missing" in err
    assert "git checkout -- benches/baseline.json" in err


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"rows": {"a.row": {"ratio": 2.0, "tolerance": 0.2}', "line 1 column"),  # truncated
        ("", "line 1 column 1"),
        ("\x00\x01garbage", "not valid JSON"),
    ],
)
def test_a_corrupted_baseline_fails_the_gate_naming_the_position(
    tmp_path, capsys, text: str, where: str
) -> None:
    baseline = write(tmp_path / "baseline.json", text)
    results = results_file(tmp_path / "run", {"a.row": 2.0})
    assert main(["--baseline", str(baseline), "--from", str(results)]) == 2
    err = capsys.readouterr().err
    assert f"{baseline}: not valid JSON" in err
    assert where in err


def test_a_baseline_that_is_not_utf8_fails(tmp_path, capsys) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_bytes(b'{"rows": "\xff\xfe"}')
    with pytest.raises(BaselineError, match="unreadable"):
        load_baseline(baseline)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], r"\$: must be an object, got list"),
        ({}, r"\$\.rows: must be an object of gated rows, got nothing"),
        ({"rows": []}, r"\$\.rows: must be an object of gated rows, got list"),
        ({"rows": {}}, r"\$\.rows: is empty"),
        ({"rows": {"a": 15}}, r'\$\.rows\["a"\]: must be an object, got int'),
        ({"rows": {"a": {"tolerance": 0.2}}}, r"\$\.rows\[\"a\"\]: missing required key 'ratio'"),
        ({"rows": {"a": {"ratio": 1.0}}}, r"\$\.rows\[\"a\"\]: missing required key 'tolerance'"),
        ({"rows": {"a": {"ratio": "1.0", "tolerance": 0.2}}}, r'\["a"\]\.ratio: must be a finite'),
        ({"rows": {"a": {"ratio": True, "tolerance": 0.2}}}, r'\["a"\]\.ratio: must be a finite'),
        ({"rows": {"a": {"ratio": 0, "tolerance": 0.2}}}, r'\["a"\]\.ratio: must be above 0'),
        ({"rows": {"a": {"ratio": 1.0, "tolerance": None}}}, r'\["a"\]\.tolerance: must be a fin'),
        ({"rows": {"a": {"ratio": 1.0, "tolerance": 0}}}, r'\["a"\]\.tolerance: must be above 0'),
        # Too loose to catch a 2x regression: refused, not accepted.
        ({"rows": {"a": {"ratio": 1.0, "tolerance": 0.5}}}, r"a 2x regression would pass"),
        ({"rows": {"a": {"ratio": 1.0, "tolerance": 0.2, "tol": 1}}}, r"unknown key 'tol'"),
    ],
)
def test_a_malformed_baseline_names_the_json_path(document: Any, message: str) -> None:
    with pytest.raises(BaselineError, match=message):
        parse_baseline(document, "baseline.json")


def test_a_malformed_baseline_fails_main_before_any_benchmark_runs(tmp_path, capsys) -> None:
    # No --results: without the early check main would start the benchmarks.
    baseline = write(tmp_path / "baseline.json", {"rows": {"a": {"ratio": 1.0, "tolerance": 0.7}}})
    assert main(["--baseline", str(baseline)]) == 2
    assert "tolerance: must be above 0 and below 0.5" in capsys.readouterr().err


def test_an_unusable_results_file_fails_the_gate(tmp_path, capsys) -> None:
    baseline = write(tmp_path / "baseline.json", GOOD)
    bad = results_file(tmp_path / "run", {})
    write(bad / "results.json", [{"name": "a.row"}])
    assert main(["--baseline", str(baseline), "--from", str(bad)]) == 2
    assert "not a results file" in capsys.readouterr().err
    write(bad / "results.json", [])
    write(bad / "timings.json", "{")
    assert main(["--baseline", str(baseline), "--from", str(bad)]) == 2
    assert "not a pytest-benchmark JSON file" in capsys.readouterr().err


def test_timed_rows_take_the_ratio_of_the_best_rounds(tmp_path) -> None:
    """The envelope rows: anchor's min over ours's min, not results.json's
    mean-based ratio (which swings with the machine's other load)."""
    ours = {"case": "decode", "body": "typical", "impl": "ours"}
    anchor = {**ours, "impl": "anchor"}
    timings = {
        "benchmarks": [
            timed("test_envelope", ours, best=2e-6, mean=9e-6),
            timed("test_envelope", anchor, best=3e-6, mean=4e-6),
        ]
    }
    run = results_file(tmp_path / "run", {"envelope.decode.typical": 0.44}, timings)
    assert read_run(run) == {"envelope.decode.typical": 1.5}
    # A timed row the run did not time is unmeasured, whatever results.json says.
    run = results_file(tmp_path / "other", {"envelope.decode.typical": 0.44})
    assert read_run(run) == {}


# --- the judgement ---------------------------------------------------------------------------


def test_rows_at_or_above_the_floor_pass_and_the_table_is_printed(tmp_path, capsys) -> None:
    baseline = write(tmp_path / "baseline.json", GOOD)
    # a.row's floor is 1.5; the median of three runs (1.5) is exactly on it.
    runs = [
        results_file(tmp_path / f"run-{i}", {"a.row": a, "b.row": 0.75})
        for i, a in enumerate((1.4, 1.5, 2.6))
    ]
    assert main(["--baseline", str(baseline), "--from", *map(str, runs)]) == 0
    out = capsys.readouterr().out
    assert "a.row" in out
    assert "b.row" in out
    assert " 1.50x  ok" in out
    assert "2 rows hold their baseline" in out


def test_a_row_below_its_floor_fails_and_is_named(tmp_path, capsys) -> None:
    baseline = write(tmp_path / "baseline.json", GOOD)
    run = results_file(tmp_path / "run", {"a.row": 1.49, "b.row": 0.8})
    assert main(["--baseline", str(baseline), "--from", str(run)]) == 1
    captured = capsys.readouterr()
    assert "FAIL (74% of baseline)" in captured.out
    assert "FAILED" in captured.err
    assert "a.row" in captured.err
    assert "b.row" not in captured.err


def test_a_row_no_run_produced_fails(tmp_path, capsys) -> None:
    baseline = write(tmp_path / "baseline.json", GOOD)
    run = results_file(tmp_path / "run", {"a.row": 2.0})
    assert main(["--baseline", str(baseline), "--from", str(run)]) == 1
    assert "FAIL (not measured)" in capsys.readouterr().out


def test_record_rewrites_ratios_and_spreads_and_keeps_tolerances(tmp_path, capsys) -> None:
    baseline = write(tmp_path / "baseline.json", {"about": "kept", **GOOD})
    runs = [
        results_file(tmp_path / f"run-{i}", {"a.row": a, "b.row": 0.9})
        for i, a in enumerate((3, 1, 2))
    ]
    assert main(["--baseline", str(baseline), "--record", "--from", *map(str, runs)]) == 0
    document = json.loads(baseline.read_text())
    assert document["about"] == "kept"
    assert document["rows"]["a.row"] == {"ratio": 2.0, "tolerance": 0.25, "spread": [1.0, 3.0]}
    assert document["rows"]["b.row"] == {"ratio": 0.9, "tolerance": 0.1, "spread": [0.9, 0.9]}
    # A row no run produced leaves the file as it was.
    before = baseline.read_text()
    partial = results_file(tmp_path / "partial", {"a.row": 2.0})
    assert main(["--baseline", str(baseline), "--record", "--from", str(partial)]) == 2
    assert "b.row: not measured" in capsys.readouterr().err
    assert baseline.read_text() == before


# --- the committed baseline ------------------------------------------------------------------


ROWS = json.loads(BASELINE.read_text())["rows"]
CLASSES = sorted({cpu for row in ROWS.values() for cpu in row.get("by_cpu", {})})
# Each row once per CPU class it has a baseline for; a row of one baseline with any class.
ROW_CLASSES = [
    (name, cpu) for name, row in sorted(ROWS.items()) for cpu in (row.get("by_cpu") or CLASSES[:1])
]


def committed(cpu: str) -> dict[str, Gate]:
    return parse_baseline(json.loads(BASELINE.read_text()), str(BASELINE), cpu=cpu)


@pytest.mark.parametrize("cpu", CLASSES)
def test_the_committed_baseline_is_valid_and_gates_the_subset(cpu: str) -> None:
    gates = committed(cpu)
    assert len(gates) >= 10
    assert all(0 < g.tolerance < MAX_TOLERANCE for g in gates.values())
    files = {node.split("::")[0] for node in SUBSET}
    prefixes = {"envelope.": "bench_envelope", "cip.": "bench_cip"}
    prefixes["image."] = "bench_image"
    for name in gates:
        [module] = [m for p, m in prefixes.items() if name.startswith(p)]
        assert f"benches/{module}.py" in files, name


@pytest.mark.parametrize(("row", "cpu"), ROW_CLASSES)
def test_a_2x_slowdown_of_any_gated_row_fails(row: str, cpu: str) -> None:
    """Ours at half its speed halves the ratio: that row, and only it, fails."""
    gates = committed(cpu)
    healthy = {name: gate.ratio for name, gate in gates.items()}
    slowed = {**healthy, row: healthy[row] / 2}
    verdicts = judge(gates, [slowed, slowed, slowed])
    assert [v.gate.name for v in verdicts if not v.passed] == [row]
    assert all(v.passed for v in judge(gates, [healthy]))
    assert "FAIL (50% of baseline)" in render(verdicts, 3)


@pytest.mark.parametrize(("row", "cpu"), ROW_CLASSES)
def test_the_measured_spread_passes(row: str, cpu: str) -> None:
    """The lowest and highest of the 10 measured gate results (each a median of 3 runs)
    recorded beside each row pass: the tolerance is wider than the noise seen."""
    document = ROWS[row].get("by_cpu", {}).get(cpu, ROWS[row])
    low, high = document["spread"]
    gates = committed(cpu)
    for value in (low, high):
        assert all(
            v.passed for v in judge(gates, [{**{n: g.ratio for n, g in gates.items()}, row: value}])
        )


# --- rows whose baseline depends on the CPU ---------------------------------------------------

PER_CPU = {
    "rows": {
        "a.row": {"ratio": 2.0, "tolerance": 0.25},
        "crc.row": {"by_cpu": {"x86_64-avx512-vpclmulqdq": {"ratio": 2.0, "tolerance": 0.1}}},
    }
}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse4_2 pclmulqdq avx2 avx512f avx512vl vpclmulqdq", "x86_64-avx512-vpclmulqdq"),
        ("fpu sse4_2 pclmulqdq avx2 vpclmulqdq", "x86_64-avx2-vpclmulqdq"),
        ("fpu sse4_2 pclmulqdq avx2", "x86_64-pclmulqdq"),
        ("fpu sse4_2", "x86_64"),
    ],
)
def test_the_cpu_class_is_read_from_the_flags(tmp_path, monkeypatch, flags, expected) -> None:
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    cpuinfo = write(tmp_path / "cpuinfo", f"processor\t: 0\nflags\t\t: {flags}\n")
    assert cpu_class(cpuinfo) == expected
    assert cpu_class(tmp_path / "absent") == "x86_64"


def test_a_per_cpu_row_takes_this_classes_baseline() -> None:
    gates = parse_baseline(PER_CPU, cpu="x86_64-avx512-vpclmulqdq")
    assert gates["crc.row"] == Gate("crc.row", 2.0, 0.1, "x86_64-avx512-vpclmulqdq")
    assert gates["a.row"].cpu is None
    assert "crc.row [x86_64-avx512-vpclmulqdq]" in render(judge(gates, [{"a.row": 2}]), 1)


def test_a_class_without_a_baseline_fails_naming_it_and_the_recorded_ones() -> None:
    with pytest.raises(BaselineError) as caught:
        parse_baseline(PER_CPU, cpu="x86_64-avx2-vpclmulqdq")
    message = str(caught.value)
    assert '$.rows["crc.row"].by_cpu' in message
    assert "'x86_64-avx2-vpclmulqdq'" in message
    assert "recorded: x86_64-avx512-vpclmulqdq" in message


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"by_cpu": {}}, "by_cpu: must be an object of CPU classes"),
        ({"by_cpu": {"c": {"ratio": 1.0, "tolerance": 0.1}}, "ratio": 1.0}, "no other keys"),
        ({"by_cpu": {"c": {"ratio": 1.0}}}, "by_cpu[\"c\"]: missing required key 'tolerance'"),
        ({"by_cpu": {"c": 3}}, 'by_cpu["c"]: must be an object, got int'),
    ],
)
def test_a_malformed_per_cpu_row_names_the_json_path(row: Any, message: str) -> None:
    with pytest.raises(BaselineError, match=re.escape(message)):
        parse_baseline({"rows": {"crc.row": row}}, cpu="c")


def test_record_adds_a_new_cpu_class_and_keeps_the_others(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("benches.check.cpu_class", lambda: "x86_64-avx2-vpclmulqdq")
    baseline = write(tmp_path / "baseline.json", PER_CPU)
    runs = [
        results_file(tmp_path / f"run-{i}", {"a.row": 2.0, "crc.row": c})
        for i, c in enumerate((1.2, 1.3, 1.25))
    ]
    assert main(["--baseline", str(baseline), "--from", str(runs[0])]) == 2
    assert main(["--baseline", str(baseline), "--record", "--from", *map(str, runs)]) == 0
    classes = json.loads(baseline.read_text())["rows"]["crc.row"]["by_cpu"]
    assert classes["x86_64-avx512-vpclmulqdq"] == {"ratio": 2.0, "tolerance": 0.1}
    assert classes["x86_64-avx2-vpclmulqdq"] == {
        "tolerance": 0.1,
        "ratio": 1.25,
        "spread": [1.2, 1.3],
    }
    assert main(["--baseline", str(baseline), "--from", *map(str, runs)]) == 0
