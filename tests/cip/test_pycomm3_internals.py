"""The pycomm3 internals `unskit.cip.logix` leans on, one test each, so that an upgrade past
the pinned release that moves or renames one fails here instead of misbehaving. The class
checks need no target; the behavioural ones run against cpppo's simulator."""

from __future__ import annotations

import ast
import inspect
import socket
from pathlib import Path

import pytest
from pycomm3 import CIPDriver, LogixDriver
from pycomm3.cip import PADDED_EPATH, UINT, PortSegment
from pycomm3.packets import base as packets_base
from pycomm3.packets import logix as packets_logix
from pycomm3.packets import util as packets_util
from pycomm3.packets.base import RequestPacket
from pycomm3.packets.logix import WriteTagRequestPacket
from pycomm3.socket_ import Socket
from pycomm3.util import cycle

from tests.support.cpppo import LogixSimulator
from unskit.cip.logix import LogixSession, _UnconnectedTagRequest
from unskit.elementary_types import TYPES

DINT = TYPES["DINT"].code
REAL = TYPES["REAL"].code


def session(path: str = "127.0.0.1", *, routed: bool = False) -> LogixSession:
    return LogixSession(path, routed=routed)


def params(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


# -- class checks (no target) ----------------------------------------------------------------


def test_logix_is_the_only_module_that_imports_pycomm3():
    package = Path(inspect.getfile(LogixSession)).parents[1]
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "pycomm3" for name in names):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"cip/logix.py"}


def test_the_session_overrides_nothing_of_logix_driver_but_send():
    # A name of ours that pycomm3 also uses would silently replace its behaviour (a
    # `list_identity` of ours would shadow CIPDriver's classmethod).
    ours = {name for name in vars(LogixSession) if not name.startswith("__")}
    assert ours & set(dir(LogixDriver)) == {"send"}
    bare = LogixDriver("127.0.0.1", init_tags=False, init_program_tags=False)
    ours = {"routed", "_unskit_reply_types", "transport"}
    assert not set(vars(session())) - ours - set(vars(bare))
    assert not ours & set(vars(bare))


def test_open_uses_a_socket_set_beforehand_and_the_socket_layer_uses_only_sock():
    # TlsTransport relies on both: CIPDriver.open() keeps a `_sock` set before it, and
    # pycomm3's Socket does its I/O through `self.sock` (send, recv, settimeout, close).
    import inspect

    from pycomm3.cip_driver import CIPDriver
    from pycomm3.socket_ import Socket

    assert "if self._sock is None" in inspect.getsource(CIPDriver.open)
    for method, calls in (
        (Socket.send, ("self.sock.send(", "self.sock.settimeout(")),
        (Socket.receive, ("self.sock.recv(", "self.sock.settimeout(")),
        (Socket.close, ("self.sock.close()",)),
    ):
        source = inspect.getsource(method)
        assert all(call in source for call in calls), method.__name__


def test_tags_is_the_table_pycomm3_looks_tags_up_in():
    plc = session()
    assert plc._tags == {}
    plc.define("Counts", DINT, 10, array=True)
    assert plc.get_tag_info("Counts") is plc._tags["Counts"]


def test_create_tag_turns_a_symbol_record_into_a_definition():
    assert params(LogixDriver._create_tag) == ["self", "name", "raw_tag"]
    plc = session()
    plc.define("Counts", DINT, 10, array=True)
    plc.define("Temp", REAL, 1, array=False)
    counts, temp = plc._tags["Counts"], plc._tags["Temp"]
    assert (counts["tag_name"], counts["data_type_name"], counts["dim"]) == ("Counts", "DINT", 1)
    assert counts["type_class"].length == 10
    assert (temp["tag_name"], temp["data_type_name"], temp["dim"]) == ("Temp", "REAL", 0)


def test_cfg_connection_size_is_the_request_size_pycomm3_plans_with():
    plc = session()
    plc._cfg["connection_size"] = 500
    assert plc.connection_size == 500
    # The read and write planners size their requests by it.
    planners = (LogixDriver._read_build_multi_requests, LogixDriver._write_build_multi_requests)
    for planner in planners:
        assert "self.connection_size" in inspect.getsource(planner)


def test_cfg_cip_path_is_the_route_of_the_connection_path():
    routed = session("127.0.0.1/bp/3", routed=True)
    expected = PADDED_EPATH.encode([PortSegment("bp", 3)], length=True, pad_length=True)
    assert routed._cfg["cip_path"] == [PortSegment("bp", 3)]
    assert routed._route() == bytes(expected)
    # pycomm3 adds slot 0 to a path without one, so the route is only used when asked for.
    plain = session()
    assert plain._cfg["cip_path"] == [PortSegment("bp", 0)]
    assert plain._route() is None


def test_msg_and_msg_setup_still_double_a_rebuilt_write_and_the_reset_fixes_it():
    packet = RequestPacket()
    assert (packet._msg, packet._msg_setup) == ([], False)
    source = inspect.getsource(packets_base.RequestPacket.build_message)
    assert "self._msg_setup" in source
    assert "self._msg +=" in source
    # pycomm3 builds a single write, marks it not set up, and builds it again when sent.
    assert "request._msg_setup = False" in inspect.getsource(
        LogixDriver._write_build_single_request
    )
    plc = session()
    plc.define("Count", DINT, 1, array=False)

    def write() -> WriteTagRequestPacket:
        info = plc._tags["Count"]
        return WriteTagRequestPacket(cycle(65535), "Count", 1, info, 0, False, b"\x07\x00\x00\x00")

    once = write().build_message()
    rebuilt = write()
    rebuilt.build_message()
    rebuilt._msg_setup = False
    assert rebuilt.build_message() != once, "pycomm3 no longer doubles it: drop the fix"
    fixed = write()
    fixed.build_message()
    fixed._msg_setup = False
    fixed._msg = []  # what LogixSession.send does
    assert fixed.build_message() == once


def test_setup_message_of_the_unconnected_packet_frames_our_tag_service():
    assert params(packets_base.RequestPacket._setup_message) == ["self"]
    path, data = b"\x91\x05Count\x00", UINT.encode(1)
    assert _UnconnectedTagRequest(b"\x4c", path, data, None).build_message() == (
        b"\x4c" + path + data
    )
    route = b"\x01\x00\x01\x03"
    wrapped = _UnconnectedTagRequest(b"\x4c", path, data, route).build_message()
    assert wrapped == packets_util.wrap_unconnected_send(b"\x4c" + path + data, route)


def test_the_packet_helpers_keep_their_signatures_and_meaning():
    assert params(packets_util.parse_read_reply) == ["data", "data_type", "elements"]
    assert params(packets_util.tag_request_path) == ["tag", "tag_info", "use_instance_ids"]
    assert params(packets_util.wrap_unconnected_send) == ["message", "route_path"]
    plc = session()
    plc.define("Counts", DINT, 10, array=True)
    info = plc._tags["Counts"]
    assert packets_util.tag_request_path("Counts[2]", info, False) is not None
    reply = UINT.encode(DINT) + (5).to_bytes(4, "little") + (-6).to_bytes(4, "little", signed=True)
    assert packets_util.parse_read_reply(reply, info, 2) == ([5, -6], "DINT[2]")


def test_send_is_the_door_every_request_passes_and_pycomm3_is_not_patched():
    assert params(LogixDriver.send) == ["self", "request"]
    assert "self.send(request)" in inspect.getsource(LogixDriver._send_requests)
    assert "self.send(request)" in inspect.getsource(CIPDriver.generic_message)
    assert "self.send(request)" in inspect.getsource(CIPDriver._list_identity)
    # The fixes live in the session, not in pycomm3's modules.
    import unskit.cip.poll  # noqa: F401

    assert packets_logix.parse_read_reply is packets_util.parse_read_reply
    assert WriteTagRequestPacket.build_message is RequestPacket.build_message


# -- behaviour against cpppo -----------------------------------------------------------------


def test_sock_is_the_socket_open_uses_and_a_preset_one_is_kept(logix: LogixSimulator):
    plc = session(logix.endpoint)
    assert plc._sock is None
    plc.open_session(5, 0.75)
    try:
        assert isinstance(plc._sock, Socket)
        assert isinstance(plc._sock.sock, socket.socket)
        assert plc._sock.sock.gettimeout() == 0.75
    finally:
        plc.close_quietly()
    # The CIP Security transport hands its socket in before open(): it must be the one used.
    connects: list[tuple[str, int]] = []

    class Recorded(Socket):
        def connect(self, host: str, port: int) -> None:
            connects.append((host, port))
            super().connect(host, port)

    preset = session(logix.endpoint)
    preset._sock = Recorded(5)
    preset.open_session(5, 1)
    try:
        assert connects == [("127.0.0.1", logix.port)]
        assert preset.identity()
    finally:
        preset.close_quietly()


def test_target_is_connected_tells_whether_a_cip_connection_is_held(logix: LogixSimulator):
    plc = session(logix.endpoint)
    assert plc._target_is_connected is False
    plc.open_session(5, 1)
    try:
        # pycomm3's session set-up (get_plc_name) leaves a connection open.
        assert plc._target_is_connected is True
        plc.release_connection()
        assert plc._target_is_connected is False
        plc.define("Temp", REAL, 1, array=False)
        assert plc.read_tags(["Temp"], 4000)[0].error is None
        assert plc._target_is_connected is True  # a connected read opens one again
    finally:
        plc.close_quietly()


def test_forward_close_ends_the_connection(logix: LogixSimulator):
    assert params(CIPDriver._forward_close) == ["self"]
    plc = session(logix.endpoint)
    plc.open_session(5, 1)
    try:
        assert plc._forward_close() is True
        assert plc._target_is_connected is False
    finally:
        plc.close_quietly()


def test_list_identity_answers_on_the_open_session(logix: LogixSimulator):
    assert params(CIPDriver._list_identity) == ["self"]
    plc = session(logix.endpoint)
    plc.open_session(5, 1)
    try:
        identity = plc._list_identity()
        assert identity["product_name"] == plc.info["product_name"]
        assert plc.identity() == identity
    finally:
        plc.close_quietly()


@pytest.mark.parametrize("request_bytes", [4000, 500], ids=["whole", "fragmented"])
def test_read_replies_carry_their_type_code_and_tag(logix: LogixSimulator, request_bytes: int):
    # `send` reads each reply's `data` and `tag_info`, and a multi-service reply's
    # `responses`; the tags come back as one multi-service request or, at 500 bytes, with
    # Big as Read Tag Fragmented.
    plc = session(logix.endpoint)
    plc.open_session(5, 1)
    try:
        plc.define("Temp", REAL, 1, array=False)
        plc.define("Big", DINT, 1000, array=True)
        results = plc.read_tags(["Temp", "Big{1000}"], request_bytes)
        assert [result.error for result in results] == [None, None]
        assert len(results[1].value) == 1000
        assert (plc.reply_type("Temp"), plc.reply_type("Big")) == (REAL, DINT)
    finally:
        plc.close_quietly()


def test_unconnected_reads_record_their_type_code_too(logix: LogixSimulator):
    plc = session(logix.endpoint)
    plc.open_session(5, 1)
    try:
        plc.release_connection()
        plc.define("Count", DINT, 1, array=False)
        assert plc.read_unconnected("Count", 4).error is None
        assert plc.reply_type("Count") == DINT
        assert plc._target_is_connected is False
    finally:
        plc.close_quietly()


def test_the_loggers_quieted_during_a_posture_read_are_pycomm3s():
    # logix.quiet_probe filters these loggers by name: pycomm3 names them module.qualname.
    from pycomm3.cip_driver import CIPDriver
    from pycomm3.packets.ethernetip import SendRRDataResponsePacket

    assert CIPDriver._CIPDriver__log.name == "pycomm3.cip_driver.CIPDriver"
    assert LogixDriver._LogixDriver__log.name == "pycomm3.logix_driver.LogixDriver"
    packet_log = SendRRDataResponsePacket._SendRRDataResponsePacket__log
    assert packet_log.name == "pycomm3.packets.ethernetip.SendRRDataResponsePacket"
