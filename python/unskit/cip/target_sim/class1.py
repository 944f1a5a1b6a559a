"""Class-1 I/O over UDP: consuming O->T datagrams, producing T->O ones, and the demo pattern
(see `unskit.cip.target_sim`)."""

from __future__ import annotations

import math
import struct
import time

from unskit.cip.target_sim.state import _SEEN, _Connection, _log, _SimState
from unskit.cip.target_sim.wire import class1_datagram, parse_class1


class _Class1Io(_SimState):
    """Consumes O->T and produces T->O datagrams of the open connections."""

    # -- UDP: class-1 datagrams --------------------------------------------------------------

    def _receive_udp(self) -> None:
        assert self._udp is not None
        for _ in range(64):  # bounded: timers must not starve under a flood
            try:
                datagram, _peer = self._udp.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ICMP port unreachable from an earlier T->O: not ours to fix
                continue
            self._consume(datagram)

    def _consume(self, datagram: bytes) -> None:
        parsed = parse_class1(datagram)
        with self._changed:
            if parsed is None:
                self.malformed += 1
                return
            connection_id, sequence, payload = parsed
            connection = self._by_o2t.get(connection_id)
            if connection is None:
                self.unmatched += 1
                return
            connection.last_heard = time.monotonic()
            if len(payload) != connection.o2t_size:
                connection.dropped["wrong_size"] = connection.dropped.get("wrong_size", 0) + 1
                self._changed.notify_all()
                return
            last = connection.o2t_sequence
            if last is not None and not 0 < (sequence - last) & 0xFFFFFFFF < 0x80000000:
                connection.dropped["stale"] = connection.dropped.get("stale", 0) + 1
                self._changed.notify_all()
                return
            connection.o2t_sequence = sequence
            connection.o2t_sequence_count = struct.unpack_from("<H", payload)[0]
            connection.consumed += 1
            assembly = self._assemblies[connection.output_instance]
            body = payload[2:]
            if connection.o2t_format == "header32":
                assembly.run = bool(struct.unpack_from("<I", body)[0] & 1)
                body = body[4:]
            assembly.data[:] = body
            assembly.written = True
            if (not assembly.seen or assembly.seen[-1] != body) and len(assembly.seen) < _SEEN:
                assembly.seen.append(bytes(body))
            for source, target, offset in self._echo:
                if source == connection.output_instance:
                    image = self._assemblies[target]
                    piece = body[: image.spec.size - offset]
                    if image.data[offset : offset + len(piece)] != piece:
                        image.data[offset : offset + len(piece)] = piece
                        image.sequence_count = (image.sequence_count + 1) & 0xFFFF
            self._changed.notify_all()

    def _produce(self, connection: _Connection) -> None:
        """Sends one T->O datagram (the lock is held)."""
        assert self._udp is not None
        assembly = self._assemblies[connection.input_instance]
        data = bytes(assembly.data)
        if self._wrong_size:
            self._wrong_size -= 1
            data += b"\x00"
        connection.t2o_sequence = (connection.t2o_sequence + 1) & 0xFFFFFFFF
        datagram = class1_datagram(
            connection.t2o_id,
            connection.t2o_sequence,
            assembly.sequence_count,
            connection.t2o_format == "header32",
            data,
        )
        copies = [datagram]
        if self._duplicate:
            self._duplicate -= 1
            copies.append(datagram)
        if self._reorder:
            self._reorder -= 1
            copies.append(
                class1_datagram(
                    connection.t2o_id,
                    (connection.t2o_sequence - 1) & 0xFFFFFFFF,
                    (assembly.sequence_count - 1) & 0xFFFF,
                    connection.t2o_format == "header32",
                    data,
                )
            )
        for copy in copies:
            try:
                self._udp.sendto(copy, connection.t2o_destination)
            except OSError as exc:
                _log.info("cip-target-sim: T->O to %s failed: %s", connection.t2o_destination, exc)
        connection.produced += 1
        self._changed.notify_all()

    def _animate(self, now: float) -> None:
        self._pattern_tick += 1
        self._pattern_due += self._pattern_period
        if self._pattern_due <= now:
            self._pattern_due = now + self._pattern_period
        for instance in self._animated:
            assembly = self._assemblies[instance]
            demo_pattern(assembly.data, self._pattern_tick, now - self._pattern_start)
            assembly.sequence_count = (assembly.sequence_count + 1) & 0xFFFF
        self._changed.notify_all()


def demo_pattern(image: bytearray, tick: int, seconds: float) -> None:
    """Writes the demo pattern into `image` (see docs/configuration.md); what fits only."""
    # UDINT tick count at 0, REAL sine (period 10 s, amplitude 100) at 4, the count's low
    # byte at 8 (bit n toggles every 2**n ticks).
    if len(image) >= 4:
        struct.pack_into("<I", image, 0, tick & 0xFFFFFFFF)
    if len(image) >= 8:
        struct.pack_into("<f", image, 4, 100.0 * math.sin(2 * math.pi * seconds / 10.0))
    if len(image) >= 9:
        image[8] = tick & 0xFF
