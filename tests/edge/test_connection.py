"""The IPC connection to the real nucleus: connect, refuse, lose."""

from __future__ import annotations

import sys
import threading

import pytest

from tests.edge.conftest import HARNESS
from tests.support.greengrass import (
    GREENGRASS_DIR_ENV,
    SOCKET_ENV,
    Harness,
    Nucleus,
    greengrass_dir,
)
from unskit.edge import IpcConnection, IpcEndpoint, edge_error
from unskit.errors import EdgeRuntimeError

pytestmark = pytest.mark.integration


def endpoint(nucleus: Nucleus, name: str = HARNESS) -> IpcEndpoint:
    return IpcEndpoint.from_environment(nucleus.component_env(name))


def test_connects_with_the_token_the_nucleus_handed_out(nucleus: Nucleus) -> None:
    connection = IpcConnection(endpoint(nucleus))
    connection.connect()
    try:
        assert connection.is_connected()
        reply = connection.client.get_configuration(key_path=[])
        assert "accessControl" in reply.value
    finally:
        connection.close()
    assert not connection.is_connected()


def test_the_token_is_not_in_the_endpoint_repr(nucleus: Nucleus) -> None:
    token = nucleus.svcuid(HARNESS)
    assert token not in repr(endpoint(nucleus))


def test_missing_variables_are_named() -> None:
    with pytest.raises(EdgeRuntimeError, match=f"{SOCKET_ENV}, SVCUID"):
        IpcEndpoint.from_environment({})


def test_a_socket_that_is_not_there_is_named(tmp_path) -> None:
    gone = IpcEndpoint(str(tmp_path / "ipc.socket"), "token")
    with pytest.raises(EdgeRuntimeError, match=r"not there: no IPC socket at .*ipc\.socket"):
        IpcConnection(gone).connect()


def test_a_wrong_token_is_refused(nucleus: Nucleus) -> None:
    wrong = IpcEndpoint(str(nucleus.socket_path), "NOT-A-TOKEN")
    with pytest.raises(EdgeRuntimeError, match="could not connect to the edge runtime"):
        IpcConnection(wrong).connect()


def test_the_loss_of_the_nucleus_is_reported_once() -> None:
    runtime = Nucleus([Harness(HARNESS)]).start()
    lost: list[str] = []
    reported = threading.Event()
    try:
        connection = IpcConnection(
            endpoint(runtime), on_lost=lambda why: (lost.append(why), reported.set())
        )
        connection.connect()
        runtime.kill()
        assert reported.wait(15), "the loss of the nucleus was not reported"
        assert not connection.is_connected()
        with pytest.raises(EdgeRuntimeError, match="not up"):
            _ = connection.client
        connection.close()
        assert len(lost) == 1
    finally:
        runtime.remove()


def test_a_missing_nucleus_names_its_variable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(GREENGRASS_DIR_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match=GREENGRASS_DIR_ENV):
        greengrass_dir()


def test_without_the_edge_extra_the_pip_command_is_named(tmp_path, monkeypatch) -> None:
    for name in ("awsiot", "awsiot.greengrasscoreipc", "awsiot.greengrasscoreipc.clientv2"):
        monkeypatch.setitem(sys.modules, name, None)  # import now raises ImportError
    with pytest.raises(EdgeRuntimeError, match=r"pip install 'unskit\[edge\]'"):
        IpcConnection(IpcEndpoint(str(tmp_path / "ipc.socket"), "token")).connect()
    # An SDK failure is still an unskit error when the SDK's error types cannot be loaded.
    assert "UpdateState" in str(edge_error(OSError("gone"), "UpdateState"))
