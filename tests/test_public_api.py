"""The public API: every name in `unskit.__all__` resolves, and lazy ones load on demand."""

from __future__ import annotations

import subprocess
import sys

import pytest

import unskit


@pytest.mark.parametrize("name", unskit.__all__)
def test_every_public_name_resolves(name):
    assert getattr(unskit, name) is not None


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = unskit.Nope  # type: ignore[attr-defined]


@pytest.mark.integration
def test_importing_unskit_does_not_import_paho():
    code = "import sys, unskit; print('paho' in ' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
