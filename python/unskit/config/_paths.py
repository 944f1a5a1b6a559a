"""JSON paths in the `$.messaging.local.port` form every configuration error names."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["json_path"]

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def json_path(parts: Iterable[str | int], root: str = "$") -> str:
    """Renders path parts as a JSON path: keys as `.key` (or `['k ey']`), indexes as `[i]`."""
    out = [root]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _PLAIN_KEY.match(part):
            out.append(f".{part}")
        else:
            escaped = part.replace("\\", "\\\\").replace("'", "\\'")
            out.append(f"['{escaped}']")
    return "".join(out)
