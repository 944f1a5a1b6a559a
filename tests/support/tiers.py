"""Test tiers, decided where a fixture is defined rather than by what it is called.

A fixture that starts or reaches a real server, a component or a process is declared with
`server_fixture` instead of `pytest.fixture`; every test that uses it, directly or through
other fixtures, is integration. A fixture of the same name defined elsewhere without it does
not move a test between tiers: the definition in effect decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

import pytest

__all__ = ["server_fixture", "uses_server"]

_F = TypeVar("_F", bound=Callable[..., Any])
#: The attribute `server_fixture` sets on the fixture's function.
_SERVER = "__unskit_server_fixture__"


@overload
def server_fixture(function: _F, /) -> _F: ...
@overload
def server_fixture(**options: Any) -> Callable[[_F], _F]: ...
def server_fixture(function: Any = None, /, **options: Any) -> Any:
    """`pytest.fixture` (same options) for a fixture that starts or reaches a real server."""

    def declare(fixture_function: _F) -> _F:
        setattr(fixture_function, _SERVER, True)
        return pytest.fixture(**options)(fixture_function)  # type: ignore[no-any-return]

    return declare if function is None else declare(function)


def uses_server(item: pytest.Item) -> bool:
    """Whether a server fixture is among the fixtures `item` runs (its whole closure)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in getattr(item, "fixturenames", ()):
        definitions = info.name2fixturedefs.get(name, ())
        # The last definition is the one in effect; one that requests its own name (an
        # override extending the fixture it overrides) runs the one before it as well.
        for definition in reversed(definitions):
            if getattr(definition.func, _SERVER, False):
                return True
            if name not in definition.argnames:
                break
    return False
