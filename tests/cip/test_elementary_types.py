"""The one CIP elementary type table: the Rust core's rows, the Python view of them, the
CIP specification, `struct`, pycomm3 (which the poll path addresses tags with), the JSON
Schema's type enum, and the BOOL packing rule shared by config validation and plans."""

from __future__ import annotations

import struct

import pytest
from pycomm3.cip import DataTypes

from unskit import elementary_types as types
from unskit._core import cip as core
from unskit.cip.config import parse_component
from unskit.cip.plan import AssemblyField, InputPlan
from unskit.config.schema import load_schema
from unskit.errors import CipError

from .test_config import config, poll_instance, push_instance

#: CIP Vol. 1, Appendix C-6.1: name, type code, bytes, signed.
CIP_SPEC = [
    ("BOOL", 0xC1, 1, False),
    ("SINT", 0xC2, 1, True),
    ("INT", 0xC3, 2, True),
    ("DINT", 0xC4, 4, True),
    ("LINT", 0xC5, 8, True),
    ("USINT", 0xC6, 1, False),
    ("UINT", 0xC7, 2, False),
    ("UDINT", 0xC8, 4, False),
    ("ULINT", 0xC9, 8, False),
    ("REAL", 0xCA, 4, True),
    ("LREAL", 0xCB, 8, True),
]
NAMES = [row[0] for row in CIP_SPEC]


def row_of(entry: core.ElementaryType) -> tuple[object, ...]:
    return (entry.name, entry.code, entry.size, entry.signed, entry.is_float, entry.range)


def test_the_python_view_is_the_core_table_row_by_row() -> None:
    assert [row_of(entry) for entry in core.ELEMENTARY_TYPES] == [
        row_of(entry) for entry in types.TYPES.values()
    ]
    assert list(types.TYPES) == NAMES


@pytest.mark.parametrize(("name", "code", "size", "signed"), CIP_SPEC, ids=NAMES)
def test_each_row_is_the_cip_specification(name: str, code: int, size: int, signed: bool) -> None:
    entry = types.TYPES[name]
    assert (entry.code, entry.size, entry.signed) == (code, size, signed)
    assert entry.is_float == (name in ("REAL", "LREAL"))


@pytest.mark.parametrize("name", NAMES)
def test_each_row_agrees_with_pycomm3(name: str) -> None:
    theirs = DataTypes[name.lower()]
    entry = types.TYPES[name]
    assert (entry.code, entry.size) == (theirs.code, theirs.size)
    if name != "BOOL":  # pycomm3 encodes BOOL by hand (0x00 / 0xFF), without a format
        assert "<" + types.STRUCT_FORMATS[name] == theirs._format


def test_packed_bool_arrays_agree_with_pycomm3() -> None:
    dword = DataTypes.dword
    assert (dword.code, 8 * dword.size) == (types.DWORD_CODE, types.BOOLS_PER_DWORD)


@pytest.mark.parametrize("name", NAMES)
def test_struct_formats_have_the_size_and_range_of_the_type(name: str) -> None:
    entry = types.TYPES[name]
    fmt = "<" + types.STRUCT_FORMATS[name]
    assert struct.calcsize(fmt) == entry.size
    if entry.range is None:
        assert name == "BOOL" or name in types.FLOAT_TYPES
        return
    low, high = entry.range
    assert types.INTEGER_RANGES[name] == (low, high)
    assert struct.unpack(fmt, struct.pack(fmt, low)) == (low,)
    assert struct.unpack(fmt, struct.pack(fmt, high)) == (high,)
    for outside in (low - 1, high + 1):
        with pytest.raises(struct.error):
            struct.pack(fmt, outside)


def test_integer_ranges_and_float_types_partition_the_numeric_types() -> None:
    assert set(types.INTEGER_RANGES) | types.FLOAT_TYPES == set(NAMES) - {"BOOL"}
    assert not set(types.INTEGER_RANGES) & types.FLOAT_TYPES


def test_the_schema_enum_is_the_table() -> None:
    schema = load_schema("ethernet-ip-adapter.schema.json")
    assert schema["$defs"]["cipType"]["enum"] == NAMES


# A BOOL array packs 8 to a byte; a bit field is one byte; anything else count * size.
SHAPES = [
    *[(name, None, None) for name in NAMES],
    *[(name, count, None) for name in NAMES for count in (1, 3)],
    *[("BOOL", count, None) for count in (7, 8, 9, 16, 17)],
    ("BOOL", None, 5),
]


@pytest.mark.parametrize(("name", "count", "bit"), SHAPES)
def test_field_bytes_is_what_a_plan_needs(name: str, count: int | None, bit: int | None) -> None:
    size = types.field_bytes(name, count, bit=bit is not None)
    expected = (
        1
        if bit is not None
        else -(-count // 8)
        if name == "BOOL" and count is not None
        else (count or 1) * types.TYPES[name].size
    )
    assert size == expected
    field = AssemblyField("f", 1, name, bit=bit, array_count=count)
    assert InputPlan(100, 1 + size, [field]).size_bytes == 1 + size
    with pytest.raises(CipError, match="do not fit"):
        InputPlan(100, size, [field])


@pytest.mark.parametrize(
    ("name", "count", "bit"),
    [
        ("BOOL", None, None),
        ("BOOL", 1, None),
        ("BOOL", 9, None),
        ("BOOL", None, 5),
        ("DINT", 3, None),
        ("LREAL", None, None),
    ],
)
def test_config_validation_uses_the_same_extent(
    name: str, count: int | None, bit: int | None
) -> None:
    field: dict[str, object] = {"name": "f", "offset": 1, "type": name}
    if count is not None:
        field["arrayCount"] = count
    if bit is not None:
        field["bit"] = bit
    size = types.field_bytes(name, count, bit=bit is not None)

    def issues(size_bytes: int) -> list[str]:
        entry = push_instance(input={"sizeBytes": size_bytes, "signals": [field]})
        skipped = parse_component(config(poll_instance("good"), entry)).skipped
        return [str(issue) for entry in skipped for issue in entry.issues]

    assert issues(1 + size) == [], "the field fits"
    assert any("io.input.signals[0].offset" in issue for issue in issues(size))


def test_an_unknown_type_name_is_a_cip_error_listing_the_table() -> None:
    with pytest.raises(CipError, match=", ".join(NAMES)):
        types.field_bytes("STRING")
