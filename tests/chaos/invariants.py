"""What must hold after the fault schedule, each checked against what is on disk and what the
servers and probes saw, never against what the components say about themselves alone."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow
import pyarrow.parquet

from tests.chaos.faults import Injected
from tests.chaos.stack import Stack
from unskit.demo.plan import THING


@dataclass(frozen=True)
class Verdict:
    name: str
    held: bool
    detail: str


@dataclass(frozen=True)
class Accepted:
    """A capture the camera committed as SUCCEEDED, with what it announced."""

    capture_id: str
    image: str
    sha256: str
    sidecar: str | None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def accepted_captures(stack: Stack) -> list[Accepted]:
    """The SUCCEEDED jobs of the camera's catalog."""
    db = stack.root / "state" / THING / "camera-adapter" / "catalog.sqlite3"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        rows = connection.execute(
            "SELECT capture_id, result FROM jobs WHERE state = 'SUCCEEDED'"
        ).fetchall()
    connection.close()
    found = []
    for capture_id, result in rows:
        image = json.loads(result)["image"]
        found.append(
            Accepted(
                capture_id,
                image["relativePath"],
                image["sha256"],
                image.get("metadataSidecarRelativePath"),
            )
        )
    return found


def failures(stack: Stack) -> Counter[str]:
    """Error codes of the captures the camera refused or lost (FAILED, INTERRUPTED)."""
    db = stack.root / "state" / THING / "camera-adapter" / "catalog.sqlite3"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        rows = connection.execute(
            "SELECT state, error_code FROM jobs WHERE state != 'SUCCEEDED'"
        ).fetchall()
    connection.close()
    return Counter(f"{state} {code}" for state, code in rows)


def undelivered(stack: Stack) -> list[str]:
    """Files of accepted captures not (yet) at the destination."""
    missing = []
    for capture in accepted_captures(stack):
        for rel in (capture.image, capture.sidecar):
            if rel is not None and not (stack.delivered / rel).is_file():
                missing.append(rel)
    return missing


def check(stack: Stack, injected: list[Injected]) -> list[Verdict]:
    """Every invariant, held or not, with what was measured."""
    verdicts: list[Verdict] = []
    captures = accepted_captures(stack)
    expected = {c.image for c in captures} | {c.sidecar for c in captures if c.sidecar}

    bad = [
        c.capture_id
        for c in captures
        if not (stack.delivered / c.image).is_file()
        or sha256(stack.delivered / c.image) != c.sha256
    ]
    verdicts.append(
        Verdict(
            "every accepted capture delivered, SHA-256 as announced",
            bool(captures) and not bad,
            f"{len(captures) - len(bad)} of {len(captures)} verified"
            + (f"; failing: {bad[:5]}" if bad else "")
            + "; not accepted: "
            + (", ".join(f"{n} {what}" for what, n in sorted(failures(stack).items())) or "none"),
        )
    )
    if any(r.fault == "camera storage full" for r in injected):
        refused = failures(stack)["FAILED PERSISTENCE_FAILED"]
        verdicts.append(
            Verdict(
                "a full output root refuses captures (PERSISTENCE_FAILED)",
                refused > 0,
                f"{refused} refused",
            )
        )
    unarchived = [
        rel
        for rel in sorted(expected)
        if not (stack.archive / rel).is_file()
        or not (stack.delivered / rel).is_file()
        or sha256(stack.archive / rel) != sha256(stack.delivered / rel)
    ]
    left = sorted(
        str(p.relative_to(stack.images))
        for p in stack.images.rglob("*")
        if p.is_file() and p.suffix in (".jpg", ".json")
    )
    verdicts.append(
        Verdict(
            "every source archived byte-identical, none left behind",
            not unarchived and not left,
            f"{len(expected) - len(unarchived)} of {len(expected)} archived; "
            f"{len(left)} left in the output root" + (f": {left[:3]}" if left else ""),
        )
    )

    renames = Counter(
        str(Path(target).relative_to(stack.delivered)) for target in stack.sftp.renames()
    )
    twice = {rel: n for rel, n in renames.items() if n > 1}
    never = sorted(rel for rel in expected if renames[rel] == 0)
    verdicts.append(
        Verdict(
            "every file put in place exactly once (sshd's own log)",
            not twice and not never,
            f"{sum(renames.values())} renames for {len(expected)} files"
            + (f"; more than once: {dict(list(twice.items())[:3])}" if twice else "")
            + (f"; never: {never[:3]}" if never else ""),
        )
    )

    present = sorted(
        str(p.relative_to(stack.delivered)) for p in stack.delivered.rglob("*") if p.is_file()
    )
    # The recorder's Parquet files ride the egress too: each must be whole (its footer read).
    stray = [rel for rel in present if rel not in expected and not _whole_parquet(stack, rel)]
    verdicts.append(
        Verdict(
            "no torn, temporary or unknown file at the destination",
            not stray,
            f"{len(present)} files" + (f"; stray: {stray[:5]}" if stray else ""),
        )
    )

    late = []
    missed = []
    flapped = []
    for record in injected:
        for name, after in record.seen_down.items():
            if after is None:
                missed.append(f"{record.fault}: {name}")
            elif after > record.bound_s:
                late.append(f"{record.fault}: {name} after {after:.1f} s > {record.bound_s:.1f} s")
        flapped += [f"{record.fault}: {name}" for name in record.flapped]
    verdicts.append(
        Verdict(
            "readiness off within its bound for each outage",
            not late and not missed,
            "; ".join(late + [f"never off: {m}" for m in missed]) or "all in time",
        )
    )
    verdicts.append(
        Verdict(
            "readiness unaffected by faults past the broker link",
            not flapped,
            "; ".join(flapped) or "no component flapped",
        )
    )
    slowest = max((r.recovered - r.healed for r in injected), default=0.0)
    verdicts.append(
        Verdict(
            "every component ready again after each fault",
            all(r.recovered >= r.healed for r in injected),
            f"slowest recovery {slowest:.1f} s after the heal",
        )
    )
    return verdicts


def _whole_parquet(stack: Stack, rel: str) -> bool:
    if not (rel.startswith("signals/") and rel.endswith(".parquet")):
        return False
    try:
        pyarrow.parquet.read_metadata(stack.delivered / rel)
    except (OSError, pyarrow.ArrowException):
        return False
    return True


def exit_verdict(stack: Stack) -> Verdict:
    codes = {c.name: c.exit_code for c in stack.components.values()} | stack.peer_exits
    return Verdict(
        "every unskit process exits 0 on SIGTERM",
        all(code == 0 for code in codes.values()),
        ", ".join(f"{name} {code}" for name, code in codes.items()),
    )


def table(seed: int, injected: list[Injected], verdicts: list[Verdict]) -> str:
    """The faults injected and the invariants, as text."""
    lines = [
        f"chaos seed {seed}",
        "",
        f"{'fault':<34} {'detail':<52} {'readiness':<24} ready again",
    ]
    start = injected[0].injected if injected else 0.0
    for r in injected:
        off = [a for a in r.seen_down.values() if a is not None]
        if not r.expect_down:
            down = "stays ready"
        elif len(r.expect_down) == 1:
            down = f"off after {off[0]:.1f} s" if off else "NEVER off"
        else:
            down = f"{len(off)}/{len(r.expect_down)} off, last {max(off, default=0):.1f} s"
        lines.append(
            f"{r.fault:<34} {r.detail[:52]:<52} {down:<24} "
            f"{r.recovered - r.healed:.1f} s after the heal (t={r.injected - start:.0f} s)"
        )
    lines += ["", f"{'invariant':<58} {'held':<5} measured"]
    for v in verdicts:
        lines.append(f"{v.name:<58} {'yes' if v.held else 'NO':<5} {v.detail}")
    return "\n".join(lines)
