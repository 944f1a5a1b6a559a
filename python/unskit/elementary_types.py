"""The CIP elementary types (BOOL, SINT ... LREAL; IEC 61131-3 names), read once from the
Rust core's table (`rust/unskit-core/src/cip/types.rs`): name, CIP type code, size,
signedness, float-ness, integer range, struct format and how BOOL packs.

Framework level on purpose: the southbound runtime checks integer ranges for any protocol
adapter and must not import `unskit.cip`; the CIP room, the reference twins and the tests
read the same table from here (see docs/decisions.md, "One elementary type table").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from unskit._core import cip as _cip
from unskit._core.cip import ElementaryType

__all__ = [
    "BOOLS_PER_DWORD",
    "DWORD_CODE",
    "FLOAT_TYPES",
    "INTEGER_RANGES",
    "STRUCT_FORMATS",
    "TYPES",
    "ElementaryType",
    "field_bytes",
]

#: Every elementary type by name, in the core's order (BOOL 0xC1 ... LREAL 0xCB).
TYPES: Mapping[str, ElementaryType] = MappingProxyType(
    {row.name: row for row in _cip.ELEMENTARY_TYPES}
)

#: The integer types and their inclusive (low, high).
INTEGER_RANGES: Mapping[str, tuple[int, int]] = MappingProxyType(
    {name: row.range for name, row in TYPES.items() if row.range is not None}
)

#: REAL and LREAL.
FLOAT_TYPES = frozenset(name for name, row in TYPES.items() if row.is_float)

#: The CIP type code of DWORD, the bit string a Logix BOOL array tag is stored in, and
#: how many BOOLs one DWORD holds.
DWORD_CODE: int = _cip.DWORD_CODE
BOOLS_PER_DWORD: int = _cip.BOOLS_PER_DWORD

_INTEGER_LETTERS = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOAT_LETTERS = {4: "f", 8: "d"}


def _struct_format(row: ElementaryType) -> str:
    if row.is_float:
        return _FLOAT_LETTERS[row.size]
    letter = _INTEGER_LETTERS[row.size]
    return letter if row.signed else letter.upper()


#: The `struct` letter of one element (little-endian on the wire: prefix ``<``).
STRUCT_FORMATS: Mapping[str, str] = MappingProxyType(
    {name: _struct_format(row) for name, row in TYPES.items()}
)


def field_bytes(type_name: str, array_count: int | None = None, *, bit: bool = False) -> int:
    """Bytes an assembly field covers from its offset (the core's BOOL packing rule)."""
    return _cip.field_bytes(type_name, array_count, bit)
