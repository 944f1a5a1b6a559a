"""The IPC link's life against the real nucleus: a connection cut and restored (filters
back, held QoS 1 sent), a nucleus killed (down, QoS 0 dropped and counted, QoS 1 held and
bounded, retries with backoff; a restarted nucleus refuses the old token), a nucleus that is
not there, a variable that is not set."""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.edge.conftest import HARNESS
from tests.support.greengrass import SOCKET_ENV, Harness, Nucleus
from tests.support.servers import wait_until
from unskit import MessageBuilder
from unskit.config.messaging import IpcConfig, ReconnectConfig
from unskit.config.model import MessagingConfig
from unskit.envelope import Message
from unskit.errors import EdgeRuntimeError, PublishError
from unskit.messaging import MessagingClient
from unskit.messaging.ipc import IpcTransport
from unskit.messaging.transport import QoS

pytestmark = pytest.mark.integration

#: Short enough that a test sees several attempts, long enough to publish while down.
BACKOFF = ReconnectConfig(initial_delay_seconds=1.0, max_delay_seconds=2.0)


def ipc_config() -> MessagingConfig:
    return MessagingConfig(
        local=None,
        local_ipc=IpcConfig(client_id=f"loss-{uuid.uuid4().hex[:8]}", reconnect=BACKOFF),
    )


def envelope(body: object) -> Message:
    return MessageBuilder("Test", "1.0").body(body).build()


class Links:
    """The link changes the client's transport reported, in order."""

    def __init__(self, client: MessagingClient) -> None:
        self.changes: list[bool] = []
        link = client._local
        original = link._on_link

        def record(up: bool) -> None:
            self.changes.append(up)
            original(up)

        link._on_link = record  # type: ignore[method-assign]


def socket_fds() -> set[int]:
    """This process's open sockets (the IPC connection is one of them)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                found.add(int(name))
        except OSError:
            continue
    return found


def cut(fds: set[int]) -> None:
    """Shuts the connection's socket down under the SDK, as a broken link would: the
    nucleus stays up and the token stays valid."""
    for fd in fds:
        twin = socket.socket(fileno=os.dup(fd))
        try:
            twin.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            twin.close()


@pytest.fixture
def nucleus_to_lose() -> Iterator[Nucleus]:
    runtime = Nucleus([Harness(HARNESS)]).start()
    yield runtime
    runtime.remove()


def test_a_cut_connection_comes_back_with_its_filters_and_held_publishes(
    nucleus: Nucleus,
) -> None:
    before = socket_fds()
    client = MessagingClient(ipc_config(), environ=nucleus.component_env(HARNESS))
    links = Links(client)
    client.start()
    try:
        assert client.wait_connected(15)
        received: list[object] = []
        lock = threading.Lock()

        def on_message(_topic: str, message: Message) -> None:
            with lock:
                received.append(message.body)

        client.subscribe("t/cut/+", on_message)
        assert client.wait_subscribed(10)
        ours = socket_fds() - before
        assert ours, "no IPC socket found"
        cut(ours)
        wait_until(lambda: not client.connected(), 10, "the link down")
        assert not client.subscriptions_acknowledged()
        # Within the backoff's first wait (at least 1 s): held, then sent after the restore.
        client.publish("t/cut/held", envelope("held"), qos=QoS.AT_LEAST_ONCE)
        client.publish("t/cut/dropped", envelope("dropped"), qos=QoS.AT_MOST_ONCE)
        status = client.publish_status()
        if not status.connected:  # a reconnect faster than this thread would hold nothing
            assert status.backlog == 1
            assert status.failures == 1
        assert client.wait_connected(15)
        assert client.wait_subscribed(10), "the filters were not restored"
        wait_until(lambda: "held" in received, 10, "the held publish after the reconnect")
        assert "dropped" not in received
        assert links.changes[:3] == [True, False, True]
        client.publish("t/cut/after", envelope("after"))
        wait_until(lambda: "after" in received, 10, "a publish on the new connection")
    finally:
        client.close()


def test_a_killed_nucleus_leaves_the_link_down_and_retrying(
    nucleus_to_lose: Nucleus, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="unskit.messaging.ipc")
    monkeypatch.setattr("unskit.messaging.ipc_publish.MAX_QUEUED_MESSAGES", 3)
    old_token = nucleus_to_lose.svcuid(HARNESS)
    client = MessagingClient(ipc_config(), environ=nucleus_to_lose.component_env(HARNESS))
    links = Links(client)
    client.start()
    try:
        assert client.wait_connected(15)
        client.subscribe("t/kill/+", lambda _t, _m: None)
        assert client.wait_subscribed(10)
        nucleus_to_lose.kill()
        wait_until(lambda: not client.connected(), 15, "the link reported down")
        wait_until(lambda: links.changes == [True, False], 5, "the link change reported")
        assert not client.subscriptions_acknowledged()
        client.publish("t/kill/a", envelope("q0"), qos=QoS.AT_MOST_ONCE)
        assert client.publish_status().failures == 1
        for n in range(3):
            client.publish("t/kill/b", envelope(n), qos=QoS.AT_LEAST_ONCE)
        assert client.publish_status().backlog == 3
        with pytest.raises(PublishError, match="3 publishes already wait"):
            client.publish("t/kill/c", envelope("one too many"), qos=QoS.AT_LEAST_ONCE)
        status = client.publish_status()
        assert status.backlog == 3
        assert status.failures == 2
        assert status.oldest_age_s > 0

        def attempts() -> int:
            return sum("connecting again in" in r.getMessage() for r in caplog.records)

        wait_until(lambda: attempts() >= 3, 20, "three reconnect attempts")
        # A restarted nucleus issues new tokens: this process's old one is refused, so the
        # link stays down (the runtime restarts its components with the new one).
        nucleus_to_lose.start()
        assert nucleus_to_lose.svcuid(HARNESS) != old_token
        seen = attempts()
        wait_until(lambda: attempts() >= seen + 2, 20, "attempts against the new nucleus")
        assert not client.connected()
        assert client.publish_status().backlog == 3
        refused = [r.getMessage() for r in caplog.records if "could not connect" in r.getMessage()]
        assert refused, "the old token's refusal was not logged"
    finally:
        client.close(timeout=0.5)


def test_a_nucleus_that_is_not_there_is_named_and_retried(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="unskit.messaging.ipc")
    missing = tmp_path / "ipc.socket"
    client = MessagingClient(ipc_config(), environ={SOCKET_ENV: str(missing), "SVCUID": "x"})
    client.start()
    try:
        wait_until(
            lambda: (
                sum(f"no IPC socket at {missing}" in r.getMessage() for r in caplog.records) >= 2
            ),
            15,
            "two attempts naming the socket",
        )
        assert not client.connected()
        assert not client.subscriptions_acknowledged()
        assert client.link_status()["endpoint"] == f"ipc:{missing}"
        # Alive meanwhile: QoS 1 held for later, QoS 0 counted.
        client.publish("t/later", envelope("later"))
        client.publish("t/now", envelope("now"), qos=QoS.AT_MOST_ONCE)
        assert client.publish_status().backlog == 1
        assert client.publish_status().failures == 1
    finally:
        client.close(timeout=0.5)


def test_a_variable_that_is_not_set_is_named() -> None:
    with pytest.raises(EdgeRuntimeError, match="SVCUID"):
        MessagingClient(ipc_config(), environ={SOCKET_ENV: "/tmp/x.socket"})
    with pytest.raises(EdgeRuntimeError, match=SOCKET_ENV):
        IpcTransport.from_environment(IpcConfig(client_id="x"), {"SVCUID": "t"})
