"""Prints benches/results.json as a table: ours beside each anchor, with the ratio."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("results.json")


def main() -> int:
    """Prints the table; exit 1 when there are no results."""
    if not RESULTS.exists():
        print("no benches/results.json: run `make bench`", file=sys.stderr)
        return 1
    rows = json.loads(RESULTS.read_text())
    header = (
        f"{'benchmark':44} {'ours ops/s':>14} {'anchor':>28} {'anchor ops/s':>14} "
        f"{'ratio':>7} {'target':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in sorted(rows, key=lambda r: r["name"]):
        target = row.get("target")
        print(
            f"{row['name']:44} {row['ours_ops_per_s']:>14,.0f} {row['anchor']:>28} "
            f"{row['anchor_ops_per_s']:>14,.0f} {row['ratio']:>6.2f}x "
            f"{'' if target is None else f'>={target}x':>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
