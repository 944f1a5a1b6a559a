"""Documents the configuration tests start from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

THING = "gw-01"
TOKEN = "test-component"

BASE: dict[str, Any] = {
    "component": {"token": TOKEN, "instances": []},
    "hierarchy": {"levels": ["site", "line", "device"]},
    "identity": {"site": "plant-1", "line": "line-4"},
    "tags": {"owner": "ops"},
    "messaging": {"local": {"host": "localhost", "port": 1883}},
}

DELETE = object()

#: `unskit validate --schema` for TOKEN, which is no installed component: any object.
ANY_COMPONENT_SCHEMA = str(Path(__file__).with_name("any-component.schema.json"))


def base_document() -> dict[str, Any]:
    """A valid document (a fresh copy each call)."""
    return copy.deepcopy(BASE)


def patched(patch: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """`base` (default: BASE) with `patch` merged in; a DELETE value removes the key."""
    out = base_document() if base is None else copy.deepcopy(base)
    _merge(out, patch)
    return out


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is DELETE:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
