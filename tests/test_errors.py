"""The exception tree: every class is defined once in `unskit.errors` and drawn in its
docstring under its real parent, with its other bases named as ``(also ...)``."""

from __future__ import annotations

import inspect
import re

import pytest

from unskit import errors

_NODE = re.compile(r"(?:^\s*|[├└]── )(?P<name>\w+Error)\b(?P<rest>.*)$")


def drawn_tree() -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """Class name -> (drawn parent, the bases named in "(also ...)")."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1].split("\n\n")[1]
    tree: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = _NODE.search(line)
        if match is None:
            continue
        column = line.index(match["name"])
        while stack and stack[-1][0] >= column:
            stack.pop()
        also = re.match(r"\s*\(also ([\w, ]+)\)", match["rest"])
        tree[match["name"]] = (
            stack[-1][1] if stack else None,
            tuple(also[1].split(", ")) if also else (),
        )
        stack.append((column, match["name"]))
    return tree


CLASSES = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, errors.UnskitError) and cls.__module__ == errors.__name__
]


@pytest.mark.parametrize("cls", CLASSES, ids=[cls.__name__ for cls in CLASSES])
def test_every_error_class_is_drawn_under_its_parent(cls: type[errors.UnskitError]) -> None:
    tree = drawn_tree()
    assert cls.__name__ in tree, f"{cls.__name__} is missing from the errors docstring"
    parent, also = tree[cls.__name__]
    ours = [base for base in cls.__bases__ if issubclass(base, errors.UnskitError)]
    others = tuple(b.__name__ for b in cls.__bases__ if b not in ours and b is not Exception)
    assert parent == (ours[0].__name__ if ours else None)
    assert also == others


def test_the_drawing_names_no_class_that_does_not_exist() -> None:
    assert set(drawn_tree()) == {cls.__name__ for cls in CLASSES}
    assert {cls.__name__ for cls in CLASSES} <= set(errors.__all__)


def test_device_error_is_one_class_defined_with_the_tree() -> None:
    from unskit.southbound import driver

    assert driver.DeviceError is errors.DeviceError
    error = errors.DeviceError("gone", connection_lost=True, code="0x01")
    assert (str(error), error.connection_lost, error.code) == ("gone", True, "0x01")
