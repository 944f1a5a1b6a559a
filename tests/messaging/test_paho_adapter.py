"""paho's internals behind `messaging/paho_adapter.py`: one test per private name it uses, and
the confinement (nothing else in unskit reaches past paho's public API).

Unit tests over a socketpair: paho reads and writes it as it would a broker's TCP socket."""

from __future__ import annotations

import ast
import contextlib
import inspect
import socket
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

import unskit
from unskit.messaging import paho_adapter
from unskit.messaging.paho_adapter import (
    PAHO_PRIVATE_NAMES,
    READ_CHUNK_BYTES,
    BufferedClient,
    awaits_acknowledgement,
    retarget,
    unacknowledged,
)

PINGRESP = b"\xd0\x00"
# The adapter's own state on the client: it must not shadow anything of paho's.
ADAPTER_ATTRIBUTES = ("_read_sock", "_read_buffer", "_read_pos", "_write_lock")
PACKAGE = Path(unskit.__file__).parent
#: The transport: `MqttTransport` in mqtt.py, joined from its layers.
TRANSPORT = (
    "messaging/mqtt.py",
    "messaging/mqtt_connection.py",
    "messaging/mqtt_publish.py",
    "messaging/mqtt_subscriptions.py",
)


class RecordingSocket:
    """The client's end of a socketpair, recording the size of every recv()."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.recv_sizes: list[int] = []

    def recv(self, bufsize: int) -> bytes:
        self.recv_sizes.append(bufsize)
        return self.sock.recv(bufsize)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


@pytest.fixture
def wired() -> Iterator[tuple[BufferedClient, RecordingSocket, socket.socket]]:
    """A BufferedClient whose socket is one end of a socketpair; the test holds the other."""
    ours, broker = socket.socketpair()
    ours.setblocking(False)
    client = BufferedClient(CallbackAPIVersion.VERSION2, client_id="adapter-test")
    recording = RecordingSocket(ours)
    client._sock = recording
    try:
        yield client, recording, broker
    finally:
        broker.close()
        ours.close()


def handled_pingresps(client: paho.Client) -> list[str]:
    logs: list[str] = []
    client.on_log = lambda _c, _u, _level, text: logs.append(text)
    return logs


def test_every_private_name_has_its_test():
    tested = {
        name.removeprefix("test_private_").split("__")[0]
        for name, value in globals().items()
        if name.startswith("test_private_") and callable(value)
    }
    assert tested == {name.lstrip("_") for name in PAHO_PRIVATE_NAMES}


def test_private_sock__is_the_socket_paho_reads_or_none(wired):
    assert paho.Client(CallbackAPIVersion.VERSION2)._sock is None
    client, recording, broker = wired
    assert client._sock is recording
    broker.close()  # link lost: paho closes the socket and forgets it
    assert client.loop_read() == MQTTErrorCode.MQTT_ERR_CONN_LOST
    assert client._sock is None


def test_private_sock_recv__is_paho_s_one_read_and_the_adapter_fills_a_buffer_per_call(wired):
    parameters = inspect.signature(paho.Client._sock_recv).parameters
    assert list(parameters) == ["self", "bufsize"]
    assert "self._sock_recv(" in inspect.getsource(paho.Client._packet_read)
    client, recording, broker = wired
    logs = handled_pingresps(client)
    broker.sendall(PINGRESP * 3)
    assert client.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    # Six one-byte reads by paho, served by one recv() with data and one finding none left.
    assert recording.recv_sizes == [READ_CHUNK_BYTES, READ_CHUNK_BYTES]
    assert logs.count("Received PINGRESP") == 3


def test_private_packet_read__reads_one_packet_or_reports_again(wired):
    assert list(inspect.signature(paho.Client._packet_read).parameters) == ["self"]
    client, _recording, broker = wired
    logs = handled_pingresps(client)
    broker.sendall(PINGRESP * 2)
    assert client._packet_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert logs.count("Received PINGRESP") == 1
    assert client._packet_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert client._packet_read() == MQTTErrorCode.MQTT_ERR_AGAIN
    assert logs.count("Received PINGRESP") == 2


def test_private_loop_rc_handle__closes_a_lost_link_and_returns_the_code(wired):
    assert list(inspect.signature(paho.Client._loop_rc_handle).parameters) == ["self", "rc"]
    client, _recording, _broker = wired
    lost: list[object] = []
    client.on_disconnect = lambda *args: lost.append(args)
    rc = client._loop_rc_handle(MQTTErrorCode.MQTT_ERR_CONN_LOST)
    assert rc == MQTTErrorCode.MQTT_ERR_CONN_LOST
    assert client._sock is None
    assert len(lost) == 1


def test_private_out_messages__holds_qos1_publishes_until_their_puback(wired):
    offline = paho.Client(CallbackAPIVersion.VERSION2)
    offline.publish("t/a", b"1", 1)
    offline.publish("t/b", b"2", 2)
    offline.publish("t/c", b"3", 0)
    assert unacknowledged(offline) == 2  # queued while down, QoS 0 never held
    client, _recording, broker = wired
    info = client.publish("t/d", b"4", 1)
    assert unacknowledged(client) == 1
    assert broker.recv(64)[0] >> 4 == 3  # the PUBLISH went out
    broker.sendall(bytes([0x40, 2, info.mid >> 8, info.mid & 0xFF]))  # its PUBACK
    assert client.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert unacknowledged(client) == 0


def test_awaits_acknowledgement_follows_a_publish_until_its_own_puback(wired):
    offline = paho.Client(CallbackAPIVersion.VERSION2)
    queued = offline.publish("t/a", b"1", 1)
    assert queued.rc == MQTTErrorCode.MQTT_ERR_NO_CONN  # is_published() would raise for it
    assert awaits_acknowledgement(offline, queued)
    client, _recording, broker = wired
    info = client.publish("t/d", b"4", 1)
    assert awaits_acknowledgement(client, info)
    assert broker.recv(64)[0] >> 4 == 3
    broker.sendall(bytes([0x40, 2, info.mid >> 8, info.mid & 0xFF]))  # its PUBACK
    assert client.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert not awaits_acknowledgement(client, info)
    # Its packet id taken by a later publish is that one's, not the acknowledged one's.
    client._last_mid = info.mid - 1
    reused = client.publish("t/e", b"5", 1)
    assert reused.mid == info.mid
    assert awaits_acknowledgement(client, reused)
    assert not awaits_acknowledgement(client, info)


@pytest.fixture
def plain() -> Iterator[tuple[BufferedClient, socket.socket, socket.socket]]:
    """A BufferedClient on a real socket (one end of a socketpair) with paho's wake-up pair:
    the test holds the broker's end and the network loop's end of the wake-up pair."""
    ours, broker = socket.socketpair()
    wake_r, wake_w = socket.socketpair()
    for sock in (ours, broker, wake_r):
        sock.setblocking(False)
    client = BufferedClient(CallbackAPIVersion.VERSION2, client_id="adapter-write-test")
    client._sock, client._sockpairW = ours, wake_w
    try:
        yield client, broker, wake_r
    finally:
        for sock in (ours, broker, wake_r, wake_w):
            sock.close()


def _woken(wake_r: socket.socket) -> bool:
    try:
        return bool(wake_r.recv(16))
    except BlockingIOError:
        return False


def test_private_packet_queue__a_publish_is_written_by_the_publishing_thread(plain):
    theirs = inspect.signature(paho.Client._packet_queue).parameters
    assert list(theirs) == list(inspect.signature(BufferedClient._packet_queue).parameters)
    assert list(theirs) == ["self", "command", "packet", "mid", "qos", "info"]
    client, broker, wake_r = plain
    info = client.publish("t/direct", b"payload", 1)
    packet = broker.recv(64)
    assert packet[0] >> 4 == 3
    assert b"t/direct" in packet
    assert packet.endswith(b"payload")
    assert not client.want_write()
    assert not _woken(wake_r)  # written here: the network loop was not woken for it
    assert unacknowledged(client) == 1
    assert info.mid > 0


def test_private_out_packet__holds_what_a_full_socket_left_for_the_network_thread(plain):
    assert "self._out_packet.append(" in inspect.getsource(paho.Client._packet_queue)
    client, broker, wake_r = plain
    # Fill the socket: the rest of a publish waits in the queue and the loop is woken.
    client._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    payload = b"x" * (4 << 20)
    client.publish("t/big", payload, 0)
    assert client.want_write()
    assert len(client._out_packet) == 1
    assert _woken(wake_r)
    received = bytearray()
    while client.want_write() or len(received) < len(payload):
        client.loop_write()
        with contextlib.suppress(BlockingIOError):
            received += broker.recv(1 << 20)
    assert received.endswith(payload)


def test_private_packet_write__writes_the_queue_in_order(plain):
    assert list(inspect.signature(paho.Client._packet_write).parameters) == ["self"]
    client, broker, _wake_r = plain
    client._out_packet.append(
        {
            "command": 0xC0,
            "mid": 0,
            "qos": 0,
            "pos": 0,
            "to_process": 2,
            "packet": b"\xc0\x00",
            "info": None,
        }
    )
    client.publish("t/after", b"2", 1)  # behind the PINGREQ, never before it
    data = broker.recv(64)
    assert data[:2] == b"\xc0\x00"
    assert data[2] >> 4 == 3
    assert client._packet_write() == MQTTErrorCode.MQTT_ERR_SUCCESS  # nothing left


def test_private_sockpairW__wakes_the_network_loop_when_paho_writes(plain):  # noqa: N802
    client, _broker, wake_r = plain
    client.on_publish = lambda *_: None  # acknowledgements stay on the network thread
    client.publish("t/queued", b"1", 1)
    assert _woken(wake_r)
    assert "self._sockpairW.send(" in inspect.getsource(paho.Client._packet_queue)


def test_a_tls_or_unknown_socket_is_written_by_the_network_thread_only(wired):
    client, _recording, _broker = wired  # not a plain socket: paho's own queueing
    assert type(client._sock) is not socket.socket
    client._thread = object()  # as under loop_start: paho leaves the write to its loop
    client.publish("t/x", b"1", 1)
    assert client.want_write()


def _reconnect_dials_the_retargeted_address() -> None:
    """connect_async to a port nobody listens on, retarget, reconnect: the listener is dialed."""
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: nothing answers there
        client = paho.Client(CallbackAPIVersion.VERSION2)
        client.connect_async("127.0.0.2", unused.getsockname()[1])
        assert (client.host, client.port) == ("127.0.0.2", unused.getsockname()[1])
        retarget(client, "127.0.0.1", listener.getsockname()[1])
        assert (client.host, client.port) == ("127.0.0.1", listener.getsockname()[1])
        listener.settimeout(10)
        try:
            client.reconnect()
            accepted, _ = listener.accept()
            accepted.close()
        finally:
            client._sock_close()


@pytest.mark.integration
def test_private_host__is_the_host_reconnect_dials():
    assert "self._host" in inspect.getsource(paho.Client._create_socket_connection)
    _reconnect_dials_the_retargeted_address()


@pytest.mark.integration
def test_private_port__is_the_port_reconnect_dials():
    assert "self._port" in inspect.getsource(paho.Client._create_socket_connection)
    _reconnect_dials_the_retargeted_address()


def test_loop_read_is_the_read_entry_point_of_paho_s_own_loop():
    # The adapter replaces loop_read's body; paho's network loop must still call it, with
    # the same signature, and the public loop_write/loop_misc it services writes with.
    assert "self.loop_read(" in inspect.getsource(paho.Client._loop)
    ours = inspect.signature(BufferedClient.loop_read)
    theirs = inspect.signature(paho.Client.loop_read)
    assert list(ours.parameters) == list(theirs.parameters) == ["self", "max_packets"]
    for name in ("loop_write", "loop_misc"):
        assert list(inspect.signature(getattr(paho.Client, name)).parameters) == ["self"]


def test_a_burst_larger_than_one_read_is_handled_in_one_loop_read(wired):
    client, recording, broker = wired
    logs = handled_pingresps(client)
    count = READ_CHUNK_BYTES // len(PINGRESP) + 5
    broker.sendall(PINGRESP * count)
    assert client.loop_read() == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert logs.count("Received PINGRESP") == count
    assert all(size == READ_CHUNK_BYTES for size in recording.recv_sizes)


def test_the_adapter_state_shadows_nothing_of_paho():
    client = paho.Client(CallbackAPIVersion.VERSION2)
    source = inspect.getsource(paho.Client)
    for name in ADAPTER_ATTRIBUTES:
        assert not hasattr(client, name), name
        assert name not in source, name


def _private_attributes(path: Path) -> list[tuple[str, str]]:
    """(object, attribute) for every `x._name` in a module, dunders aside."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        private = isinstance(node, ast.Attribute) and node.attr.startswith("_")
        if private and not node.attr.startswith("__"):
            found.append((ast.unparse(node.value), node.attr))
    return found


def test_the_adapter_uses_no_private_name_of_paho_beyond_its_list():
    used = {attr for _, attr in _private_attributes(Path(paho_adapter.__file__))}
    assert used <= {*PAHO_PRIVATE_NAMES, *ADAPTER_ATTRIBUTES}
    assert set(PAHO_PRIVATE_NAMES) <= used  # the list names nothing stale


def test_only_the_transport_and_the_adapter_import_paho():
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name == "paho" or name.startswith("paho.") for name in names):
                importers.add(path.relative_to(PACKAGE).as_posix())
    assert importers == {*TRANSPORT, "messaging/paho_adapter.py"}


@pytest.mark.parametrize("module", TRANSPORT)
def test_the_transport_touches_no_private_attribute_of_paho(module):
    path = PACKAGE / module
    # Its own state only: every private attribute it reads is one of MqttTransport's.
    assert {owner for owner, _ in _private_attributes(path)} == {"self"}
    assert not {attr for _, attr in _private_attributes(path)} & set(PAHO_PRIVATE_NAMES)
