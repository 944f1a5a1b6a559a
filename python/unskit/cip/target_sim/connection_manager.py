"""The connection manager: Forward Open, Large Forward Open and Forward Close, each checked as
the specification says a target checks it (see `unskit.cip.target_sim`)."""

from __future__ import annotations

import struct
import time

from unskit.cip.target_sim.state import _Connection, _log, _Session, _SimState
from unskit.cip.target_sim.wire import (
    DEFAULT_UDP_PORT,
    DEVICE_TYPE,
    EXT_CONNECTION_IN_USE,
    EXT_CONNECTION_NOT_FOUND,
    EXT_INVALID_CONFIG_PATH,
    EXT_INVALID_CONNECTION_SIZE,
    EXT_INVALID_CONSUMING_PATH,
    EXT_INVALID_PRODUCING_PATH,
    EXT_INVALID_SEGMENT,
    EXT_INVALID_T2O_CONNECTION_TYPE,
    EXT_KEY_MISMATCH,
    EXT_OWNERSHIP_CONFLICT,
    EXT_RPI_NOT_SUPPORTED,
    FORWARD_CLOSE,
    FORWARD_OPEN,
    GS_CONNECTION_FAILURE,
    GS_NOT_ENOUGH_DATA,
    GS_SUCCESS,
    ITEM_SOCKADDR_O2T,
    ITEM_SOCKADDR_T2O,
    LARGE_FORWARD_OPEN,
    MULTICAST,
    P2P,
    PRODUCT_CODE,
    REVISION,
    VENDOR_ID,
    RefusalError,
    cip_reply,
    connection_size,
    logical_segment,
    sockaddr_item,
)


class _ConnectionManager(_SimState):
    """Opens and closes class-1 connections (the Connection Manager object, class 0x06)."""

    def _forward_open(
        self, session: _Session, data: bytes, large: bool, t2o_sockaddr: bytes | None
    ) -> tuple[bytes, list[tuple[int, bytes]]]:
        service = LARGE_FORWARD_OPEN if large else FORWARD_OPEN
        _tick, _ticks, _o2t_id, t2o_id, serial, vendor, orig_serial, multiplier = (
            struct.unpack_from("<BBIIHHIB", data)
        )
        params = "<IIIIB" if large else "<IHIHB"
        o2t_rpi, o2t_params, t2o_rpi, t2o_params, _transport = struct.unpack_from(params, data, 22)
        at = 22 + struct.calcsize(params)
        path = data[at + 1 : at + 1 + 2 * data[at]]
        if len(path) != 2 * data[at]:
            raise RefusalError(EXT_INVALID_SEGMENT)
        triad = (serial, vendor, orig_serial)
        if self.refuse is not None:
            raise RefusalError(self.refuse)
        config, output, input_ = self._connection_path(path)
        size_mask, type_shift = (0xFFFF, 29) if large else (0x1FF, 13)
        o2t_size, t2o_size = o2t_params & size_mask, t2o_params & size_mask
        t2o_type = (t2o_params >> type_shift) & 3
        with self._changed:
            if any(c.triad == triad for c in self._by_o2t.values()):
                raise RefusalError(EXT_CONNECTION_IN_USE)
            if min(o2t_rpi, t2o_rpi) < self.min_rpi_ms * 1000:
                raise RefusalError(EXT_RPI_NOT_SUPPORTED)
            if t2o_type not in (P2P, MULTICAST):
                raise RefusalError(EXT_INVALID_T2O_CONNECTION_TYPE)
            if config is not None and config not in self._assemblies:
                raise RefusalError(EXT_INVALID_CONFIG_PATH)
            if output not in self._assemblies:
                raise RefusalError(EXT_INVALID_CONSUMING_PATH)
            if input_ not in self._assemblies:
                raise RefusalError(EXT_INVALID_PRODUCING_PATH)
            out_spec, in_spec = self._assemblies[output].spec, self._assemblies[input_].spec
            o2t_format = out_spec.format or ("heartbeat" if out_spec.size == 0 else "header32")
            t2o_format = in_spec.format or "modeless"
            want_o2t = connection_size(out_spec.size, o2t_format)
            want_t2o = connection_size(in_spec.size, t2o_format)
            if o2t_size != want_o2t:
                raise RefusalError(EXT_INVALID_CONNECTION_SIZE, want_o2t)
            if t2o_size != want_t2o:
                raise RefusalError(EXT_INVALID_CONNECTION_SIZE, want_t2o)
            if o2t_format != "heartbeat" and any(
                c.output_instance == output for c in self._by_o2t.values()
            ):
                raise RefusalError(EXT_OWNERSHIP_CONFLICT)
            multicast = t2o_type == MULTICAST
            port = DEFAULT_UDP_PORT
            if t2o_sockaddr is not None and len(t2o_sockaddr) == 16:
                port = struct.unpack_from(">H", t2o_sockaddr, 2)[0] or DEFAULT_UDP_PORT
            destination = (self.multicast_group if multicast else session.peer, port)
            o2t_id = self._new_id()
            if multicast:
                t2o_id = self._new_id()
            o2t_api = self.api_override_us or o2t_rpi
            t2o_api = self.api_override_us or t2o_rpi
            now = time.monotonic()
            connection = _Connection(
                o2t_id=o2t_id,
                t2o_id=t2o_id,
                triad=triad,
                output_instance=output,
                input_instance=input_,
                config_instance=config,
                o2t_rpi_us=o2t_rpi,
                t2o_rpi_us=t2o_rpi,
                o2t_api_us=o2t_api,
                t2o_api_us=t2o_api,
                o2t_size=o2t_size,
                t2o_size=t2o_size,
                o2t_format=o2t_format,
                t2o_format=t2o_format,
                timeout_multiplier=4 << min(multiplier, 7),
                multicast=multicast,
                t2o_destination=destination,
                large=large,
                next_due=now,
                last_heard=now,
            )
            self._connections.append(connection)
            self._by_o2t[o2t_id] = connection
            self._changed.notify_all()
        _log.info(
            "cip-target-sim: opened O->T 0x%08X T->O 0x%08X (%s -> %s)",
            o2t_id,
            t2o_id,
            output,
            input_,
        )
        body = struct.pack("<IIHHIIIBB", o2t_id, t2o_id, *triad, o2t_api, t2o_api, 0, 0)
        items = [(ITEM_SOCKADDR_O2T, sockaddr_item(self.host, self.udp_port))]
        if multicast:
            items.append((ITEM_SOCKADDR_T2O, sockaddr_item(*destination)))
        return cip_reply(service, GS_SUCCESS, (), body), items

    def _connection_path(self, path: bytes) -> tuple[int | None, int, int]:
        """(config instance or None, O->T connection point, T->O connection point)."""
        at = 0
        config: int | None = None
        points: list[int] = []
        klass: int | None = None
        while at < len(path):
            segment = path[at]
            if segment == 0x34:  # electronic key, format 4
                if at + 10 > len(path) or path[at + 1] != 0x04:
                    raise RefusalError(EXT_INVALID_SEGMENT)
                vendor, device, product, major, minor = struct.unpack_from("<HHHBB", path, at + 2)
                self._check_key(vendor, device, product, major & 0x7F, minor)
                at += 10
            elif segment in (0x20, 0x24, 0x2C):  # 8-bit class, instance, connection point
                if at + 2 > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
                value, at = path[at + 1], at + 2
                klass, config = logical_segment(segment, value, klass, config, points)
            elif segment in (0x21, 0x25, 0x2D):  # 16-bit, padded: a pad byte first
                if at + 4 > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
                value, at = struct.unpack_from("<H", path, at + 2)[0], at + 4
                klass, config = logical_segment(segment & 0xFC, value, klass, config, points)
            elif segment == 0x80:  # simple data segment: configuration data, ignored
                if at + 2 > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
                at += 2 + 2 * path[at + 1]
                if at > len(path):
                    raise RefusalError(EXT_INVALID_SEGMENT)
            else:
                raise RefusalError(EXT_INVALID_SEGMENT)
        if klass != 0x04 or len(points) != 2:
            raise RefusalError(EXT_INVALID_SEGMENT)
        return config, points[0], points[1]

    def _check_key(self, vendor: int, device: int, product: int, major: int, minor: int) -> None:
        mine = (VENDOR_ID, DEVICE_TYPE, PRODUCT_CODE, *REVISION)
        for asked, have in zip((vendor, device, product, major, minor), mine, strict=True):
            if asked and asked != have:
                raise RefusalError(EXT_KEY_MISMATCH)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _forward_close(self, data: bytes) -> bytes:
        if len(data) < 12:
            return cip_reply(FORWARD_CLOSE, GS_NOT_ENOUGH_DATA)
        triad = struct.unpack_from("<HHI", data, 2)
        tail = struct.pack("<HHI", *triad)
        with self._changed:
            connection = next((c for c in self._by_o2t.values() if c.triad == triad), None)
            if connection is None:
                return cip_reply(
                    FORWARD_CLOSE,
                    GS_CONNECTION_FAILURE,
                    (EXT_CONNECTION_NOT_FOUND,),
                    tail + b"\x00\x00",
                )
            connection.state = "closed"
            del self._by_o2t[connection.o2t_id]
            self._changed.notify_all()
        _log.info("cip-target-sim: closed O->T 0x%08X", connection.o2t_id)
        return cip_reply(FORWARD_CLOSE, GS_SUCCESS, (), tail + b"\x00\x00")
