"""A class-1 EtherNet/IP target for tests and demos: `unskit cip-target-sim`.

The other side of a push-mode (implicit I/O) connection, written from the CIP and
EtherNet/IP specifications as Wireshark's ENIP/CIP dissector reads them, and on purpose
sharing no code with unskit's own CIP codecs (``unskit._core.cip``, ``unskit.cip.frames``,
``unskit.cip.plan``): a misunderstanding in those cannot hide in both ends.

- TCP encapsulation (port 44818 by default): RegisterSession, UnregisterSession,
  ListIdentity, and SendRRData carrying Forward Open (0x54), Large Forward Open (0x5B) and
  Forward Close (0x4E) to the Connection Manager (class 6 instance 1), directly or inside
  one Unconnected Send (0x52, its route path not checked).
- The connection path is ``[34 04 key] 20 04 24 <config> 2C <O->T> 2C <T->O>`` (padded
  EPATH, 8- or 16-bit logical segments, an optional simple data segment 0x80 with
  configuration data). A zero electronic key matches anything; a non-zero one must match
  the sim's identity (0x0114 otherwise).
- Connection ids, as CIP Vol. 2 (3-3.7.1) says: the consumer of a point-to-point
  connection picks its id, the producer of a multicast one. So the sim picks the O->T id
  (it consumes it), keeps the originator's T->O id for point-to-point T->O and picks its
  own for multicast T->O.
- Refusals are general status 0x01 with the extended status Wireshark names:
  0x0100 connection in use (the same triad twice), 0x0106 ownership conflict (an output
  assembly already owned), 0x0109 invalid connection size (the expected size follows as a
  second word), 0x0111 RPI not supported (below ``min_rpi_ms``), 0x0114 key mismatch,
  0x0129 / 0x012A / 0x012B unknown configuration / consuming (O->T) / producing (T->O)
  assembly, 0x0315 invalid segment in the connection path, 0x0107 Forward Close of an
  unknown connection, and ``refuse=`` forces any extended status.
- UDP (port 2222 by default): consumes O->T datagrams (0x8002 sequenced address item +
  0x00B1 connected data item: 16-bit sequence count, run/idle header for header32, data)
  and produces T->O at the negotiated T->O API on absolute deadlines, to the originator's
  address and the port of its Sockaddr Info T->O item (else 2222), or to the multicast
  group (``IP_MULTICAST_IF`` 127.0.0.1, TTL 0). A connection whose O->T is silent for
  its timeout (multiplier x O->T API, counted from the open) times out and stops
  producing.

Connection sizes in the network parameters include the 2-byte sequence count and, for
header32, the 4-byte run/idle header. An assembly's real-time format is its
`AssemblySpec.format`; unset, O->T is header32 and T->O modeless. A size-0 assembly used as
O->T is a heartbeat (sequence count only, several connections may share it); as a
configuration instance it takes no data.

Quirks of the ``ethernetip`` PyPI package (1.2.0), the independent originator the tests
use against this sim: it sends O->T to the module global ``ENIP_UDP_PORT`` and connects to
``ENIP_TCP_PORT`` (read at call time, so tests patch them); it always sends a zero
electronic key; its connection path is a packed EPATH, so instances above 255 come out
malformed (tests use 8-bit instances); its O->T sequence count and number both start at 0
and its run/idle header is always "run"; its UDP listener binds 0.0.0.0 and matches T->O
by source address and T->O id; `stopIO` closes the socket under a thread still in
``select``, and neither its producer socket nor its TCP socket is ever closed by it.

Modules: `wire` (the specification's constants, encoders and decoders), `sim` (the target:
its lifecycle, service loop and test controls), `state` (its data), `encap` (TCP
encapsulation), `connection_manager` (Forward Open and Close), `class1` (UDP I/O and the demo
pattern), `cli` (`unskit cip-target-sim`).
"""

from __future__ import annotations

from unskit.cip.target_sim.cli import main
from unskit.cip.target_sim.sim import AssemblySpec, CipTargetSim, ConnectionInfo, demo_pattern
from unskit.cip.target_sim.wire import (
    DEFAULT_MULTICAST_GROUP,
    DEFAULT_TCP_PORT,
    DEFAULT_UDP_PORT,
)

__all__ = [
    "DEFAULT_MULTICAST_GROUP",
    "DEFAULT_TCP_PORT",
    "DEFAULT_UDP_PORT",
    "AssemblySpec",
    "CipTargetSim",
    "ConnectionInfo",
    "demo_pattern",
    "main",
]
