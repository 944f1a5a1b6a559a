"""Configuration from the real edge runtime: RUNTIME_CONFIG (the component's own
configuration, followed, deployments validated), CONFIG_COMPONENT (another component's) and
SHADOW (a named shadow's desired state, its outcome reported back).

One nucleus for the module, with the shadow manager and the Greengrass CLI: a deployment
that changes a harness's configuration goes through `Nucleus.deploy_configuration`. The test
process acts as `HARNESS` (its accessControl allows pub/sub and shadows, nothing for the
configuration store).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.config.documents import TOKEN, base_document
from tests.edge.conftest import HARNESS
from tests.support.greengrass import THING_NAME, Harness, Nucleus
from tests.support.servers import wait_until
from tests.support.tiers import server_fixture
from unskit.config import ComponentConfig, ConfigLoader, Platform, SourceKind
from unskit.edge import IpcConnection, IpcEndpoint
from unskit.edge import shadow as ipc_shadow
from unskit.edge.configuration import get_configuration
from unskit.edge.providers import STATUS_KEY
from unskit.edge.pubsub import publish_binary
from unskit.errors import ConfigError

pytestmark = pytest.mark.integration

#: The component whose configuration holds a document for CONFIG_COMPONENT.
HOLDER = "ConfigHolder"
#: The shadow SHADOW reads by default: unskit-{the component's built-in token}.
SHADOW = f"unskit-{TOKEN}"
DEPLOY_S = 90.0
WAIT_S = 20.0


@server_fixture(scope="module")
def nucleus() -> Iterator[Nucleus]:
    runtime = Nucleus(
        [
            Harness(HARNESS, configuration=base_document()),
            Harness(HOLDER, configuration=base_document()),
        ],
        shadow_manager=True,
        cli=True,
    ).start()
    yield runtime
    runtime.remove()


class Seen:
    """What a loader's watch reported, thread-safe (it reports on a worker thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.applied: list[ComponentConfig] = []
        self.errors: list[ConfigError] = []

    def apply(self, config: ComponentConfig) -> None:
        with self._lock:
            self.applied.append(config)

    def refuse(self, error: ConfigError) -> None:
        with self._lock:
            self.errors.append(error)

    def messages(self) -> list[str]:
        with self._lock:
            return [str(e) for e in self.errors]


def loader(nucleus: Nucleus, path: str | None = None, source: str | None = None) -> ConfigLoader:
    return ConfigLoader(
        path,
        thing=THING_NAME,
        platform=Platform.EDGE_RUNTIME,
        environ=nucleus.component_env(HARNESS),
        default_component=TOKEN,
        config_source=source,
    )


@pytest.fixture
def ipc(nucleus: Nucleus) -> Iterator[IpcConnection]:
    """The test's own connection, as `HARNESS`, to set shadows and read configurations."""
    connection = IpcConnection(IpcEndpoint.from_environment(nucleus.component_env(HARNESS)))
    connection.connect()
    yield connection
    connection.close()


# -- RUNTIME_CONFIG --------------------------------------------------------------------------


def test_runtime_config_is_read_and_a_deployment_applied_live(nucleus: Nucleus) -> None:
    config_loader = loader(nucleus)
    assert config_loader.source.kind is SourceKind.RUNTIME_CONFIG
    try:
        assert "accessControl" not in config_loader.read()  # the runtime's, not the document's
        config = config_loader.load()
        assert config.tags["owner"] == "ops"
        seen = Seen()
        watch = config_loader.watch(seen.apply, seen.refuse)
        assert watch is not None
        # Two keys changed: the nucleus sends one event per key, applied as one change. The
        # port comes back as 1884.0 (the nucleus keeps doubles) and must not be refused.
        status, out = nucleus.deploy_configuration(
            HARNESS, {"tags": {"owner": "night-shift"}, "messaging": {"local": {"port": 1884}}}
        )
        assert status == "SUCCEEDED", out
        wait_until(lambda: len(seen.applied) >= 1, WAIT_S, "the deployment applied")
        applied = seen.applied[-1]
        assert applied.tags["owner"] == "night-shift"
        assert applied.messaging.local is not None
        assert applied.messaging.local.port == 1884
        assert type(applied.messaging.local.port) is int
        assert [c.tags["owner"] for c in seen.applied] == ["night-shift"]
        assert config_loader.current == applied
        assert seen.errors == []
        watch.close()
    finally:
        config_loader.close()


def test_a_deployment_with_an_invalid_value_is_refused_before_it_is_applied(
    nucleus: Nucleus, ipc: IpcConnection
) -> None:
    config_loader = loader(nucleus)
    try:
        before = config_loader.load()
        running = get_configuration(ipc)["messaging"]
        seen = Seen()
        watch = config_loader.watch(seen.apply, seen.refuse)
        assert watch is not None
        status, out = nucleus.deploy_configuration(
            HARNESS, {"messaging": {"local": {"port": 70000}}}
        )
        # The validity report fails the deployment: the runtime never applies it.
        assert status == "FAILED", out
        assert "COMPONENT_CONFIGURATION_NOT_VALID" in out
        assert "$.messaging.local.port" in out
        assert get_configuration(ipc)["messaging"] == running
        # Only a whole float is taken as an integer: 1884.5 is refused where one is required.
        status, out = nucleus.deploy_configuration(
            HARNESS, {"messaging": {"local": {"port": 1884.5}}}
        )
        assert status == "FAILED", out
        assert "$.messaging.local.port" in out
        assert "must be an integer" in out
        assert get_configuration(ipc)["messaging"] == running
        assert config_loader.current == before
        assert seen.applied == []
        watch.close()
    finally:
        config_loader.close()


# -- CONFIG_COMPONENT ------------------------------------------------------------------------


def test_config_component_is_read_and_followed(nucleus: Nucleus) -> None:
    # HARNESS has no aws.greengrass.ipc.config policy: reading another component's
    # configuration needs none on this nucleus.
    config_loader = loader(nucleus, HOLDER, "CONFIG_COMPONENT")
    assert config_loader.source.kind is SourceKind.CONFIG_COMPONENT
    try:
        assert config_loader.load().tags["owner"] == "ops"
        seen = Seen()
        watch = config_loader.watch(seen.apply, seen.refuse)
        assert watch is not None
        status, out = nucleus.deploy_configuration(HOLDER, {"tags": {"owner": "held"}})
        assert status == "SUCCEEDED", out
        wait_until(lambda: len(seen.applied) >= 1, WAIT_S, "the holder's change applied")
        assert seen.applied[-1].tags["owner"] == "held"
        watch.close()
    finally:
        config_loader.close()


def test_a_missing_config_component_is_named(nucleus: Nucleus) -> None:
    config_loader = loader(nucleus, "NoSuchComponent", "CONFIG_COMPONENT")
    try:
        with pytest.raises(ConfigError) as refused:
            config_loader.load()
        assert "'NoSuchComponent'" in str(refused.value)
        assert "no component" in str(refused.value)
    finally:
        config_loader.close()


# -- SHADOW ----------------------------------------------------------------------------------


def _shadow_state(ipc: IpcConnection) -> dict[str, Any]:
    document = ipc_shadow.get_thing_shadow(ipc, THING_NAME, SHADOW) or {}
    state = document.get("state")
    return state if isinstance(state, dict) else {}


def _reported_status(ipc: IpcConnection) -> dict[str, Any]:
    status = _shadow_state(ipc).get("reported", {}).get(STATUS_KEY)
    return status if isinstance(status, dict) else {}


def test_shadow_applied_on_start_and_on_deltas_with_the_outcome_reported(
    nucleus: Nucleus, ipc: IpcConnection
) -> None:
    desired = base_document()
    # The shadow manager refuses calls until it is running: the start retries within a
    # deadline, as the provider does.
    wait_until(
        lambda: _try_update(ipc, {"desired": desired}),
        WAIT_S,
        "the shadow manager accepting updates",
        interval=0.1,
    )
    config_loader = loader(nucleus, source="SHADOW")
    assert config_loader.source.kind is SourceKind.SHADOW
    assert SHADOW in config_loader.source.location
    try:
        assert config_loader.load().tags["owner"] == "ops"
        # Applied: the reported state is the document, so no delta is left.
        wait_until(
            lambda: _reported_status(ipc).get("status") == "APPLIED",
            WAIT_S,
            "the start's outcome reported",
        )
        state = _shadow_state(ipc)
        assert {k: v for k, v in state["reported"].items() if k != STATUS_KEY} == desired
        assert "delta" not in state

        seen = Seen()
        watch = config_loader.watch(seen.apply, seen.refuse)
        assert watch is not None
        changed = copy.deepcopy(desired)
        changed["tags"] = {"owner": "delta"}
        ipc_shadow.update_thing_shadow(
            ipc, THING_NAME, SHADOW, {"desired": {"tags": changed["tags"]}}
        )
        wait_until(lambda: len(seen.applied) >= 1, WAIT_S, "the delta applied")
        assert seen.applied[-1].tags["owner"] == "delta"
        wait_until(
            lambda: _shadow_state(ipc).get("reported", {}).get("tags") == {"owner": "delta"},
            WAIT_S,
            "the applied delta reported",
        )

        # Refused: reported with its errors, the running configuration stays.
        ipc_shadow.update_thing_shadow(
            ipc, THING_NAME, SHADOW, {"desired": {"messaging": {"local": {"port": 70000}}}}
        )
        wait_until(
            lambda: _reported_status(ipc).get("status") == "REFUSED",
            WAIT_S,
            "the refusal reported",
        )
        errors = _reported_status(ipc)["errors"]
        assert any("$.messaging.local.port" in e for e in errors), errors
        assert _shadow_state(ipc)["reported"]["messaging"]["local"]["port"] == 1883
        assert config_loader.current == seen.applied[-1]
        assert len(seen.applied) == 1
        assert any("$.messaging.local.port" in m for m in seen.messages())

        # Deltas nobody can set through the shadow manager (it refuses a non-object desired
        # state), published on the delta topic directly: named, nothing applied, still
        # watching.
        topic = ipc_shadow.delta_topic(THING_NAME, SHADOW)
        publish_binary(ipc.client, topic, b"not json{").result(10)
        publish_binary(ipc.client, topic, b"[1, 2]").result(10)
        wait_until(lambda: len(seen.messages()) >= 3, WAIT_S, "both bad deltas reported")
        bad = seen.messages()[-2:]
        assert all(SHADOW in m and topic in m for m in bad), bad
        assert "is not JSON" in bad[0]
        assert "not an object" in bad[1]
        assert len(seen.applied) == 1

        ipc_shadow.update_thing_shadow(
            ipc,
            THING_NAME,
            SHADOW,
            {"desired": {"messaging": {"local": {"port": 1885}}, "tags": {"owner": "after"}}},
        )
        wait_until(lambda: len(seen.applied) >= 2, WAIT_S, "a good delta applied after bad ones")
        assert seen.applied[-1].tags["owner"] == "after"
        wait_until(
            lambda: _reported_status(ipc).get("status") == "APPLIED",
            WAIT_S,
            "the last outcome reported",
        )
        assert _reported_status(ipc)["errors"] == []
        watch.close()
    finally:
        config_loader.close()


def _try_update(ipc: IpcConnection, state: dict[str, Any], name: str = SHADOW) -> bool:
    try:
        ipc_shadow.update_thing_shadow(ipc, THING_NAME, name, state)
    except Exception:
        return False
    return True


def test_a_shadow_that_does_not_exist_is_named(nucleus: Nucleus) -> None:
    config_loader = loader(nucleus, "no-such-shadow", "SHADOW")
    try:
        with pytest.raises(ConfigError) as refused:
            config_loader.load()
        message = str(refused.value)
        assert "'no-such-shadow'" in message
        assert f"$aws/things/{THING_NAME}/shadow/name/no-such-shadow" in message
        assert "does not exist" in message
    finally:
        config_loader.close()


def test_a_shadow_refused_at_start_is_reported_with_its_errors(
    nucleus: Nucleus, ipc: IpcConnection
) -> None:
    name = "refused-at-start"
    desired = base_document()
    desired["messaging"]["local"]["port"] = 70000
    wait_until(
        lambda: _try_update(ipc, {"desired": desired}, name),
        WAIT_S,
        "the shadow manager accepting updates",
        interval=0.1,
    )
    config_loader = loader(nucleus, name, "SHADOW")
    try:
        with pytest.raises(ConfigError) as refused:
            config_loader.load()
        assert [i.path for i in refused.value.issues] == ["$.messaging.local.port"]
        document = ipc_shadow.get_thing_shadow(ipc, THING_NAME, name) or {}
        status = document["state"]["reported"][STATUS_KEY]
        assert status["status"] == "REFUSED"
        assert any("$.messaging.local.port" in e for e in status["errors"]), status
        # Nothing of the refused document is reported as running.
        assert set(document["state"]["reported"]) == {STATUS_KEY}
    finally:
        config_loader.close()
