"""cpppo's Logix simulator serving packed BOOL arrays, as a Logix controller stores a BOOL[32 n]:
a tag whose name starts with ``Packed`` and is declared ``UDINT[n]`` is served as DWORD[n]
(type code 0xD3), its bits set by `packed_bits`. cpppo's command line has no DWORD type and
its reply encoder does not list it, so both are added here.

Run as ``python -m tests.cip.packed_logix --address HOST:PORT Tag=TYPE[n] ...``."""

from __future__ import annotations

import sys
from typing import Any

from cpppo.server.enip import device, parser
from cpppo.server.enip.main import main

PACKED_PREFIX = "Packed"


def packed_bits(count: int) -> list[bool]:
    """The first `count` bits every packed tag starts with (bit i set when i % 3 == 0)."""
    return [i % 3 == 0 for i in range(count)]


def _words(count: int) -> list[int]:
    bits = packed_bits(32 * count)
    return [sum(1 << b for b in range(32) if bits[32 * w + b]) for w in range(count)]


class PackedAttribute(device.Attribute):  # type: ignore[misc]
    """A tag store that serves ``Packed*`` tags as DWORD arrays."""

    def __init__(self, name: str, type_cls: Any, default: Any = 0, **settings: Any) -> None:
        if name.startswith(PACKED_PREFIX):
            type_cls = parser.DWORD
            default = _words(len(default) if isinstance(default, list) else 1)
        super().__init__(name, type_cls, default=default, **settings)


if __name__ == "__main__":
    parser.typed_data.TYPES_SUPPORTED[parser.DWORD.tag_type] = parser.DWORD
    sys.exit(main(attribute_class=PackedAttribute))
