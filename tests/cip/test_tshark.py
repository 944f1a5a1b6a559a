"""An independent decoder reads our class-1 datagrams: Wireshark's EtherNet/IP dissector
(tshark) on a pcap of O-to-T datagrams we built, UDP port 2222."""

from __future__ import annotations

import struct
import subprocess

import pytest

from tests.support.servers import require_binary
from unskit.cip.frames import build


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _packet(payload: bytes) -> bytes:
    udp = struct.pack("!HHHH", 2222, 2222, 8 + len(payload), 0) + payload
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
        bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]),
    )  # fmt: skip
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    ether = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00"
    return ether + ip + udp


def _pcap(payloads: list[bytes]) -> bytes:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    for i, payload in enumerate(payloads):
        frame = _packet(payload)
        out += struct.pack("<IIII", 1_700_000_000 + i, 0, len(frame), len(frame)) + frame
    return out


@pytest.mark.integration
def test_tshark_reads_our_datagrams(tmp_path):
    # A missing decoder fails the test, never skips it.
    tshark = require_binary("tshark")
    datagrams = [
        build(0x11223344, 7, 0x0102, "header32", run=True, data=bytes(range(16))),
        build(0x55667788, 8, 0x0304, "modeless", data=b"\xaa\xbb"),
        build(0x0A0B0C0D, 9, 0x0506, "heartbeat"),
    ]
    path = tmp_path / "class1.pcap"
    path.write_bytes(_pcap(datagrams))
    fields = [
        "enip.cpf.itemcount",
        "enip.cpf.sai.connid",
        "enip.cpf.sai.seq",
        "enip.cpf.typeid",
        "enip.cpf.length",
    ]
    out = subprocess.run(
        [tshark, "-r", str(path), "-T", "fields", "-E", "separator=;"]
        + [arg for f in fields for arg in ("-e", f)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    rows = [line.split(";") for line in out.stdout.strip().splitlines()]
    assert [(r[0], int(r[1], 0), int(r[2], 0)) for r in rows] == [
        ("2", 0x11223344, 7),
        ("2", 0x55667788, 8),
        ("2", 0x0A0B0C0D, 9),
    ]
    for row in rows:
        assert [int(t, 0) for t in row[3].split(",")] == [0x8002, 0x00B1]
    # Connected data item: sequence count, run/idle header (header32), data.
    assert [r[4] for r in rows] == ["8,22", "8,4", "8,2"]
