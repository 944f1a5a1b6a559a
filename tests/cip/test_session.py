"""`LogixSession`'s failures: each is a DeviceError and none leaves a socket open."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from pycomm3.socket_ import Socket

from tests.support.cpppo import LogixSimulator
from unskit.cip.logix import LogixSession
from unskit.errors import DeviceError

#: An encapsulation header: RegisterSession (0x65) answered "unsupported protocol revision".
_REFUSAL = (0x65).to_bytes(2, "little") + bytes(6) + (0x69).to_bytes(4, "little") + bytes(12)
_REGISTER_SESSION_BYTES = 28


def test_a_port_pycomm3_refuses_is_a_device_error_naming_the_path() -> None:
    with pytest.raises(DeviceError, match=r"127\.0\.0\.1:65535: .*Invalid port"):
        LogixSession("127.0.0.1:65535", routed=False)


class _Target:
    """A TCP listener on 127.0.0.1 that refuses the session: it answers RegisterSession with
    an error, or hangs up; then it waits for the client to close its side."""

    def __init__(self, *, answer: bool) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.client_closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(10)
            if not self.answer:
                return
            conn.recv(_REGISTER_SESSION_BYTES)
            conn.sendall(_REFUSAL)
            if conn.recv(1) == b"":
                self.client_closed.set()

    def close(self) -> None:
        self.thread.join(15)
        self.listener.close()


@pytest.fixture(params=[True, False], ids=["refuses-register-session", "hangs-up"])
def refusing_target(request: pytest.FixtureRequest) -> Iterator[_Target]:
    target = _Target(answer=request.param)
    yield target
    target.close()


@pytest.mark.integration
def test_a_session_not_registered_closes_its_socket(refusing_target: _Target) -> None:
    plc = LogixSession(f"127.0.0.1:{refusing_target.port}", routed=False)
    plc._sock = Socket(5)
    sock = plc._sock.sock
    try:
        with pytest.raises(DeviceError):
            plc.open_session(5, 1)
        assert sock.fileno() == -1, "the session's socket is still open"
        if refusing_target.answer:
            assert refusing_target.client_closed.wait(10), "the target saw no close"
    finally:
        sock.close()


def test_a_failed_release_is_a_device_error_and_closes_the_session(
    logix: LogixSimulator,
) -> None:
    plc = LogixSession(logix.endpoint, routed=False)
    plc.open_session(5, 1)
    assert plc._target_is_connected  # pycomm3's set-up leaves a connection open
    assert plc._sock is not None
    sock = plc._sock.sock
    logix.stop()  # the Forward Close now meets a closed peer
    try:
        with pytest.raises(DeviceError) as raised:
            plc.release_connection()
        assert raised.value.connection_lost
        assert sock.fileno() == -1, "the session's socket is still open"
    finally:
        sock.close()
