"""The Parquet files' schema (version 1): its columns, value types and qualities."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

__all__ = [
    "METADATA_KEY",
    "QUALITIES",
    "SCHEMA_VERSION",
    "TAG_PREFIX",
    "VALUE_TYPES",
    "file_schema",
]

#: Bumped whenever a column is added, removed or changes type (docs/configuration.md).
SCHEMA_VERSION = "1"
METADATA_KEY = b"unskit.recorder.schema_version"
TAG_PREFIX = "tag_"
_DICT = pa.dictionary(pa.int32(), pa.string())
_TS = pa.timestamp("ms", tz="UTC")
#: What `value_type` holds: which column carries the sample's value.
VALUE_TYPES = ("null", "float64", "int64", "bool", "string", "list", "json")
(_NULL, _F64, _I64, _BOOL, _STR, _LIST, _JSON) = range(len(VALUE_TYPES))
QUALITIES = ("GOOD", "UNCERTAIN", "BAD")
_VALUE_TYPE_DICT = pa.array(VALUE_TYPES, pa.string())
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def file_schema(tag_keys: Sequence[str], *, variant: bool) -> pa.Schema:
    """The schema of a file whose messages carry these tag keys (schema version 1)."""
    fields = [
        pa.field("source_ts", _TS),
        pa.field("server_ts", _TS),
        pa.field("receive_ts", _TS, nullable=False),
        pa.field("root", _DICT, nullable=False),
        pa.field("device", _DICT, nullable=False),
        pa.field("component", _DICT, nullable=False),
        pa.field("instance", _DICT),
        pa.field("signal_id", _DICT, nullable=False),
        pa.field("signal_path", _DICT),
        pa.field("quality", _DICT, nullable=False),
        pa.field("status", pa.string()),
        pa.field("value_type", _DICT, nullable=False),
    ]
    if not variant:
        fields += [
            pa.field("value_float64", pa.float64()),
            pa.field("value_int64", pa.int64()),
            pa.field("value_bool", pa.bool_()),
            pa.field("value_string", pa.string()),
            pa.field("value_list", pa.list_(pa.float64())),
        ]
    fields.append(pa.field("value_json", pa.string()))
    fields += [pa.field(TAG_PREFIX + key, _DICT) for key in tag_keys]
    return pa.schema(fields, metadata={METADATA_KEY: SCHEMA_VERSION.encode()})
