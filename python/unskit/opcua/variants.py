"""OPC UA values to JSON and back (the adapter's second asyncua module, for values only).

To JSON: numbers, strings and booleans as they are; arrays as lists; DateTime as ISO 8601
UTC with milliseconds (``2024-01-02T03:04:05.678Z``); ByteString as base64; Guid as its
text; NodeId as a stable id (``ns=0;i=2258``); QualifiedName as ``"ns:name"``;
LocalizedText as ``{"locale", "text"}``; StatusCode as its symbolic name; XmlElement as its
text; a decoded structure as an object of its fields (mapped the same way, enumerations by
name); an undecodable ExtensionObject as ``{"typeId", "encoding", "body"}`` (body base64);
NaN and the infinities, which JSON lacks, as the strings ``"NaN"``, ``"Infinity"``,
``"-Infinity"``; Null as None.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import enum
import math
import uuid
from typing import Any

from asyncua import ua
from asyncua.ua import status_codes

from unskit.opcua.matchers import format_stable_id, parse_stable_id

__all__ = [
    "from_json",
    "node_id",
    "stable_id",
    "status_name",
    "to_json",
    "type_name",
]

_KINDS = {
    ua.NodeIdType.TwoByte: "i",
    ua.NodeIdType.FourByte: "i",
    ua.NodeIdType.Numeric: "i",
    ua.NodeIdType.String: "s",
    ua.NodeIdType.Guid: "g",
    ua.NodeIdType.ByteString: "b",
}

_INT_RANGES = {
    ua.VariantType.SByte: (-(2**7), 2**7 - 1),
    ua.VariantType.Byte: (0, 2**8 - 1),
    ua.VariantType.Int16: (-(2**15), 2**15 - 1),
    ua.VariantType.UInt16: (0, 2**16 - 1),
    ua.VariantType.Int32: (-(2**31), 2**31 - 1),
    ua.VariantType.UInt32: (0, 2**32 - 1),
    ua.VariantType.Int64: (-(2**63), 2**63 - 1),
    ua.VariantType.UInt64: (0, 2**64 - 1),
}
_FLOAT_MAX = 3.4028234663852886e38


def identifier_text(nodeid: ua.NodeId) -> tuple[str, str]:
    """(kind, identifier text) of a node id."""
    kind = _KINDS[nodeid.NodeIdType]
    identifier = nodeid.Identifier
    if kind == "b":
        return kind, base64.b64encode(identifier or b"").decode("ascii")
    return kind, str(identifier)


def stable_id(nodeid: ua.NodeId) -> str:
    """``ns=<index>;<i|s|g|b>=<id>`` of a node id."""
    kind, text = identifier_text(nodeid)
    return format_stable_id(nodeid.NamespaceIndex, kind, text)


def node_id(text: str) -> ua.NodeId:
    """The node id of a stable id; ValueError when it is malformed."""
    namespace, kind, identifier = parse_stable_id(text)
    if kind == "i":
        return ua.NodeId(int(identifier), namespace)
    if kind == "g":
        return ua.NodeId(uuid.UUID(identifier), namespace)
    if kind == "b":
        return ua.NodeId(base64.b64decode(identifier), namespace, ua.NodeIdType.ByteString)
    return ua.NodeId(identifier, namespace)


def status_name(code: ua.StatusCode | int | None) -> str:
    """The symbolic name of a status code (``BadNodeIdUnknown``), or its hex value."""
    if code is None:
        return "Good"
    value = code.value if isinstance(code, ua.StatusCode) else int(code)
    # The low 16 bits are info bits (overflow, limits), not part of the code's name.
    known = status_codes.code_to_name_doc.get(value & 0xFFFF0000)
    return known[0] if known else f"0x{value:08X}"


def type_name(data_type: ua.NodeId | None, value_rank: int | None = None) -> str:
    """A DataType's name (``Double``, ``Range``); ``[]`` appended for arrays."""
    if data_type is None:
        name = "BaseDataType"
    elif data_type.NamespaceIndex == 0 and isinstance(data_type.Identifier, int):
        name = ua.ObjectIdNames.get(data_type.Identifier, stable_id(data_type))
    else:
        name = stable_id(data_type)
    return name + "[]" if value_rank is not None and value_rank >= 1 else name


def _iso(moment: datetime.datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    moment = moment.astimezone(datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def to_json(value: Any) -> Any:
    """One OPC UA value (a Variant's payload) as JSON-ready data."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.datetime):
        return _iso(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, ua.StatusCode):
        return status_name(value)
    if isinstance(value, ua.ExpandedNodeId):
        return value.to_string()
    if isinstance(value, ua.NodeId):
        return stable_id(value)
    if isinstance(value, ua.QualifiedName):
        return f"{value.NamespaceIndex}:{value.Name}"
    if isinstance(value, ua.LocalizedText):
        return {"locale": value.Locale, "text": value.Text}
    if isinstance(value, ua.XmlElement):
        return value.Value
    if isinstance(value, ua.Variant):
        return to_json(value.Value)
    if isinstance(value, ua.ExtensionObject):
        # asyncua leaves Encoding 0 on decoded objects: the body's type tells.
        body = value.Body
        encoding = "binary" if body is not None else "none"
        if isinstance(body, ua.XmlElement):
            body, encoding = body.Value.encode("utf-8"), "xml"
        return {
            "typeId": stable_id(value.TypeId),
            "encoding": encoding,
            "body": base64.b64encode(body or b"").decode("ascii"),
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: to_json(getattr(value, field.name)) for field in dataclasses.fields(value)
        }
    return str(value)


# -- JSON to a Variant (sb/write) -------------------------------------------------------------


def from_json(value: Any, vtype: ua.VariantType, array: bool) -> ua.Variant:
    """The Variant a write sends; ValueError when the JSON value does not fit the type."""
    if array:
        if not isinstance(value, list):
            raise ValueError(f"the node holds a {vtype.name} array: write a JSON array")
        return ua.Variant([_scalar(item, vtype) for item in value], vtype, is_array=True)
    if isinstance(value, list):
        raise ValueError(f"the node holds one {vtype.name}, not an array")
    return ua.Variant(_scalar(value, vtype), vtype)


def _scalar(value: Any, vtype: ua.VariantType) -> Any:
    name = vtype.name
    if vtype == ua.VariantType.Boolean:
        if not isinstance(value, bool):
            raise ValueError(f"Boolean wants true or false, not {value!r}")
        return value
    if vtype in _INT_RANGES:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} wants an integer, not {value!r}")
        low, high = _INT_RANGES[vtype]
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range for {name} ({low} to {high})")
        return value
    if vtype in (ua.VariantType.Float, ua.VariantType.Double):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} wants a number, not {value!r}")
        if vtype == ua.VariantType.Float and math.isfinite(value) and abs(value) > _FLOAT_MAX:
            raise ValueError(f"{value} is out of range for Float")
        return float(value)
    if vtype in (ua.VariantType.String, ua.VariantType.XmlElement):
        if not isinstance(value, str):
            raise ValueError(f"{name} wants a string, not {value!r}")
        return value if vtype == ua.VariantType.String else ua.XmlElement(value)
    if not isinstance(value, (str, dict)):
        raise ValueError(f"{name} wants a string, not {value!r}")
    try:
        return _parsed(value, vtype)
    except (ValueError, TypeError, binascii.Error) as error:
        raise ValueError(f"{value!r} is not a valid {name}: {error}") from None


def _parsed(value: str | dict[str, Any], vtype: ua.VariantType) -> Any:
    if vtype == ua.VariantType.LocalizedText:
        if isinstance(value, dict):
            return ua.LocalizedText(value.get("text"), value.get("locale"))
        return ua.LocalizedText(value)
    if not isinstance(value, str):
        raise TypeError("an object fits only LocalizedText")
    if vtype == ua.VariantType.DateTime:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            raise ValueError("a DateTime needs a UTC offset or Z")
        return moment.astimezone(datetime.timezone.utc)
    if vtype == ua.VariantType.Guid:
        return uuid.UUID(value)
    if vtype == ua.VariantType.ByteString:
        return base64.b64decode(value, validate=True)
    if vtype == ua.VariantType.NodeId:
        return node_id(value)
    if vtype == ua.VariantType.QualifiedName:
        namespace, colon, name = value.partition(":")
        if not colon or not namespace.isdigit():
            raise ValueError('a QualifiedName is written "ns:name"')
        return ua.QualifiedName(name, int(namespace))
    if vtype == ua.VariantType.StatusCode:
        code = getattr(ua.StatusCodes, value, None)
        if not isinstance(code, int):
            raise ValueError("not a status code name")
        return ua.StatusCode(code)
    raise ValueError(f"writing {vtype.name} values is not supported")
