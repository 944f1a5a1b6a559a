"""Shared fixtures of the configuration tests: a clean environment and document helpers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Variables that would change platform detection, the thing name or the config path.
_ENV = (
    "UNSKIT_PLATFORM",
    "UNSKIT_THING_NAME",
    "AWS_IOT_THING_NAME",
    "UNSKIT_CONFIG",
    "UNSKIT_VAULT_KEY",
    "KUBERNETES_SERVICE_HOST",
    "AWS_GG_NUCLEUS_DOMAIN_SOCKET_FILEPATH_FOR_COMPONENT",
    "SVCUID",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def write_json(tmp_path: Path) -> Callable[..., Path]:
    def write(document: Any, name: str = "config.json") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(document, indent=2))
        return path

    return write
