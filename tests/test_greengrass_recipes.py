"""deploy/greengrass/generate.py against the library: the committed recipes are its output,
and each recipe's accessControl names exactly the topic filters the component subscribes
to and the topics it publishes under, as the configuration model computes them.
tests/edge/test_deploy.py deploys the recipes onto the real nucleus."""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType
from typing import Any

import pytest

from tests.support.wheel import ROOT
from unskit.config.loader import resolve_config
from unskit.config.platform import Platform
from unskit.messaging.requests import reply_token
from unskit.topics import REPLY_TOPIC_PREFIX

THING = "gw-01"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "greengrass_generate", ROOT / "deploy" / "greengrass" / "generate.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _generator()
NAMES = generate.component_names()


def _recipe(name: str) -> dict[str, Any]:
    path = generate.RECIPES / f"{generate.component_name(name)}-{generate.project_version()}.json"
    recipe: dict[str, Any] = json.loads(path.read_text())
    return recipe


def _resources(recipe: dict[str, Any], operation: str) -> list[str]:
    policies = recipe["ComponentConfiguration"]["DefaultConfiguration"]["accessControl"]
    return [
        resource.replace("{iot:thingName}", THING)
        for policy in policies["aws.greengrass.ipc.pubsub"].values()
        if f"aws.greengrass#{operation}" in policy["operations"]
        for resource in policy["resources"]
    ]


def test_the_committed_recipes_are_the_generated_ones() -> None:
    assert generate.stale_recipes(generate.default_recipes()) == []


def test_every_component_has_a_recipe_named_after_it() -> None:
    assert {generate.component_name(n) for n in NAMES} == {
        json.loads(p.read_text())["ComponentName"] for p in generate.RECIPES.glob("*.json")
    }
    assert generate.component_name("ethernet-ip-adapter") == "com.unskit.EthernetIpAdapter"


@pytest.mark.parametrize("name", NAMES)
def test_the_policy_is_the_components_own_filters(name: str) -> None:
    recipe = _recipe(name)
    document = {
        k: v
        for k, v in recipe["ComponentConfiguration"]["DefaultConfiguration"].items()
        if k != "accessControl"
    }
    # The document the recipe carries is valid on the edge runtime, with IPC as its link.
    config = resolve_config(
        document, thing=THING, platform=Platform.EDGE_RUNTIME, default_component=name
    )
    assert config.messaging.local_ipc is not None
    base = config.topics.base
    subscribe = _resources(recipe, "SubscribeToTopic")
    inbox = [f"{base}/cmd/sb/+", f"{base}/+/cmd/sb/+"]  # CommandInbox.filters
    reply = f"{REPLY_TOPIC_PREFIX}{reply_token(config.messaging.local_ipc.client_id)}/#"
    assert subscribe[:3] == [*inbox, reply]
    # No wildcard in a policy beyond what the component itself subscribes to.
    assert all("*" not in resource for resource in subscribe)
    publish = _resources(recipe, "PublishToTopic")
    assert publish == [f"{base}/*", "lib/reply-*"]
    for topic in (config.topics.topic("data", "x", instance="i"), config.topics.topic("state")):
        assert topic.startswith(f"{base}/")


def test_the_recorder_may_subscribe_to_what_it_records() -> None:
    recipe = _recipe("signal-recorder")
    include = recipe["ComponentConfiguration"]["DefaultConfiguration"]["component"]["topics"][
        "include"
    ]
    assert _resources(recipe, "SubscribeToTopic")[3:] == include


@pytest.mark.parametrize(
    ("name", "extras"),
    [
        ("ethernet-ip-adapter", ""),
        ("camera-adapter", ",onvif"),
        ("opcua-adapter", ",opcua"),
        ("signal-recorder", ",recorder"),
        ("file-egress", ""),
    ],
)
def test_install_is_offline_from_the_wheelhouse_with_the_extras_the_document_needs(
    name: str, extras: str
) -> None:
    manifest = _recipe(name)["Manifests"][0]
    version = generate.project_version()
    install = manifest["Lifecycle"]["install"]["Script"]
    assert "--no-index --find-links {artifacts:decompressedPath}/unskit-wheelhouse-" in install
    assert f"'unskit[edge{extras}]=={version}'" in install
    assert manifest["Artifacts"][0]["Unarchive"] == "ZIP"
    startup = manifest["Lifecycle"]["startup"]["Script"]
    assert f"venv/bin/unskit run {name}" in startup
    assert "run" not in manifest["Lifecycle"]  # startup: the component reports RUNNING
