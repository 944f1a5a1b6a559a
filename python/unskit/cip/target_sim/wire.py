"""The wire of the class-1 target simulator: encapsulation, common packet format and
Connection Manager constants, and the few encoders and decoders the sim needs. Written from
the specifications (see `unskit.cip.target_sim`), sharing nothing with unskit's own codecs."""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from typing import Literal

__all__ = [
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_TCP_PORT",
    "DEFAULT_UDP_PORT",
    "DEVICE_TYPE",
    "ENCAP_HEADER",
    "ENCAP_INCORRECT_DATA",
    "ENCAP_INVALID_COMMAND",
    "ENCAP_INVALID_LENGTH",
    "ENCAP_INVALID_SESSION",
    "ENCAP_UNSUPPORTED_VERSION",
    "EXT_CONNECTION_IN_USE",
    "EXT_CONNECTION_NOT_FOUND",
    "EXT_INVALID_CONFIG_PATH",
    "EXT_INVALID_CONNECTION_SIZE",
    "EXT_INVALID_CONSUMING_PATH",
    "EXT_INVALID_PRODUCING_PATH",
    "EXT_INVALID_SEGMENT",
    "EXT_INVALID_T2O_CONNECTION_TYPE",
    "EXT_KEY_MISMATCH",
    "EXT_OWNERSHIP_CONFLICT",
    "EXT_RPI_NOT_SUPPORTED",
    "FORMATS",
    "FORWARD_CLOSE",
    "FORWARD_OPEN",
    "GS_CONNECTION_FAILURE",
    "GS_NOT_ENOUGH_DATA",
    "GS_PATH_DESTINATION_UNKNOWN",
    "GS_SERVICE_NOT_SUPPORTED",
    "GS_SUCCESS",
    "ITEM_CONNECTED_DATA",
    "ITEM_IDENTITY",
    "ITEM_NULL",
    "ITEM_SEQUENCED_ADDRESS",
    "ITEM_SOCKADDR_O2T",
    "ITEM_SOCKADDR_T2O",
    "ITEM_UNCONNECTED_DATA",
    "LARGE_FORWARD_OPEN",
    "LIST_IDENTITY",
    "MULTICAST",
    "P2P",
    "PRODUCT_CODE",
    "PRODUCT_NAME",
    "REGISTER_SESSION",
    "REVISION",
    "SEND_RR_DATA",
    "SERIAL_NUMBER",
    "UNCONNECTED_SEND",
    "UNREGISTER_SESSION",
    "VENDOR_ID",
    "Format",
    "MalformedError",
    "RefusalError",
    "cip_reply",
    "class1_datagram",
    "connection_size",
    "cpf_items",
    "logical_segment",
    "parse_class1",
    "sockaddr_item",
]

DEFAULT_TCP_PORT = 44818
DEFAULT_UDP_PORT = 2222
DEFAULT_MULTICAST_GROUP = "239.192.1.1"

Format = Literal["modeless", "header32", "heartbeat"]
FORMATS: tuple[str, ...] = ("modeless", "header32", "heartbeat")

# Encapsulation commands and statuses (Vol. 2, 2-3 and 2-4).
LIST_IDENTITY = 0x0063
REGISTER_SESSION = 0x0065
UNREGISTER_SESSION = 0x0066
SEND_RR_DATA = 0x006F
ENCAP_INVALID_COMMAND = 0x0001
ENCAP_INCORRECT_DATA = 0x0003
ENCAP_INVALID_SESSION = 0x0064
ENCAP_INVALID_LENGTH = 0x0065
ENCAP_UNSUPPORTED_VERSION = 0x0069
ENCAP_HEADER = struct.Struct("<HHII8sI")

# Common packet format item types.
ITEM_NULL = 0x0000
ITEM_IDENTITY = 0x000C
ITEM_CONNECTED_DATA = 0x00B1
ITEM_UNCONNECTED_DATA = 0x00B2
ITEM_SOCKADDR_O2T = 0x8000
ITEM_SOCKADDR_T2O = 0x8001
ITEM_SEQUENCED_ADDRESS = 0x8002

# Connection Manager services and statuses (Vol. 1, 3-5.6).
FORWARD_OPEN = 0x54
LARGE_FORWARD_OPEN = 0x5B
FORWARD_CLOSE = 0x4E
UNCONNECTED_SEND = 0x52
GS_SUCCESS = 0x00
GS_CONNECTION_FAILURE = 0x01
GS_PATH_DESTINATION_UNKNOWN = 0x05
GS_SERVICE_NOT_SUPPORTED = 0x08
GS_NOT_ENOUGH_DATA = 0x13
EXT_CONNECTION_IN_USE = 0x0100
EXT_OWNERSHIP_CONFLICT = 0x0106
EXT_CONNECTION_NOT_FOUND = 0x0107
EXT_INVALID_CONNECTION_SIZE = 0x0109
EXT_RPI_NOT_SUPPORTED = 0x0111
EXT_KEY_MISMATCH = 0x0114
EXT_INVALID_T2O_CONNECTION_TYPE = 0x0124
EXT_INVALID_CONFIG_PATH = 0x0129
EXT_INVALID_CONSUMING_PATH = 0x012A
EXT_INVALID_PRODUCING_PATH = 0x012B
EXT_INVALID_SEGMENT = 0x0315

P2P = 2
MULTICAST = 1

# The sim's identity (ListIdentity, electronic key): vendor 0xFFFF is unassigned by ODVA.
VENDOR_ID = 0xFFFF
DEVICE_TYPE = 0x000C  # communications adapter
PRODUCT_CODE = 0x0001
REVISION = (1, 1)
SERIAL_NUMBER = 0x554E534B
PRODUCT_NAME = b"unskit cip-target-sim"


class RefusalError(Exception):
    """A Forward Open or Close refused with general status 0x01 and this extended status."""

    def __init__(self, extended: int, *extra: int) -> None:
        super().__init__(f"0x{extended:04X}")
        self.words = (extended, *extra)


class MalformedError(Exception):
    """A request too short or inconsistent to answer with anything but an error status."""


def logical_segment(
    segment: int, value: int, klass: int | None, config: int | None, points: list[int]
) -> tuple[int | None, int | None]:
    if segment == 0x20:
        return value, config
    if segment == 0x24:
        return klass, value
    points.append(value)
    if len(points) > 2:
        raise RefusalError(EXT_INVALID_SEGMENT)
    return klass, config


def connection_size(data_size: int, real_time_format: str) -> int:
    if real_time_format == "heartbeat":
        return 2
    return 2 + (4 if real_time_format == "header32" else 0) + data_size


def cip_reply(service: int, status: int, extended: Sequence[int] = (), body: bytes = b"") -> bytes:
    header = bytes([service | 0x80, 0, status, len(extended)])
    return header + b"".join(struct.pack("<H", word) for word in extended) + body


def sockaddr_item(host: str, port: int) -> bytes:
    """A Sockaddr Info item's body: big-endian, as struct sockaddr_in."""
    return struct.pack(">hH4s8x", socket.AF_INET, port, socket.inet_aton(host))


def cpf_items(data: bytes) -> list[tuple[int, bytes]]:
    if len(data) < 2:
        raise MalformedError("no item count")
    count = struct.unpack_from("<H", data)[0]
    at, items = 2, []
    for _ in range(count):
        if at + 4 > len(data):
            raise MalformedError("truncated item header")
        kind, length = struct.unpack_from("<HH", data, at)
        at += 4
        if at + length > len(data):
            raise MalformedError("truncated item")
        items.append((kind, data[at : at + length]))
        at += length
    return items


def parse_class1(datagram: bytes) -> tuple[int, int, bytes] | None:
    """(connection id, sequence number, connected data) of a class-1 datagram, else None."""
    try:
        items = cpf_items(datagram)
    except MalformedError:
        return None
    if len(items) != 2 or items[0][0] != ITEM_SEQUENCED_ADDRESS or len(items[0][1]) != 8:
        return None
    if items[1][0] != ITEM_CONNECTED_DATA or len(items[1][1]) < 2:
        return None
    connection_id, sequence = struct.unpack("<II", items[0][1])
    return connection_id, sequence, items[1][1]


def class1_datagram(
    connection_id: int, sequence: int, count: int, header32: bool, data: bytes
) -> bytes:
    payload = struct.pack("<H", count) + (struct.pack("<I", 1) if header32 else b"") + data
    return (
        struct.pack("<HHHII", 2, ITEM_SEQUENCED_ADDRESS, 8, connection_id, sequence)
        + struct.pack("<HH", ITEM_CONNECTED_DATA, len(payload))
        + payload
    )
