#!/usr/bin/env python3
"""Greengrass v2 component recipes for unskit's components, built from their configuration.

    python3 deploy/greengrass/generate.py            # deploy/greengrass/recipes/ from examples/
    python3 deploy/greengrass/generate.py --check    # exit 1 when a committed recipe is stale
    python3 deploy/greengrass/generate.py --name camera-adapter \\
        --document my-camera.json --out my-recipes/  # one recipe from your own document

One recipe per component of pyproject.toml's `unskit.components` entry points, named
``com.unskit.<Name>`` (``ethernet-ip-adapter`` -> ``com.unskit.EthernetIpAdapter``), versioned
as the package. Each recipe holds (docs/deployment.md, "AWS IoT Greengrass v2"):

- ``DefaultConfiguration``: the unskit configuration document itself (its top-level sections
  ``component``, ``hierarchy``, ``identity`` ...) beside ``accessControl``; ``messaging.local``
  is left out, so the component's local link is the nucleus's IPC bus;
- ``accessControl``: PublishToTopic on the component's own UNS topics and on requesters'
  ``lib/reply-*`` topics; SubscribeToTopic on exactly the filters it subscribes to (its command
  inbox, its own reply filter, the topics a recorder records); nothing else (UpdateState and
  GetConfiguration of the component's own configuration need no policy);
- one artifact, the wheelhouse zip (``unskit-wheelhouse-VERSION.zip``: the unskit wheel and
  every dependency wheel for the gateway), unarchived by the nucleus; ``install`` makes a venv
  and installs from it with ``--no-index``, so a gateway without an index installs offline;
- ``startup`` (not ``run``: the component reports RUNNING itself once ready) runs
  ``unskit run NAME`` with ``UNSKIT_STATE_DIR={work:path}/state`` (its state in its own work
  folder).

The component reads its configuration from the runtime (RUNTIME_CONFIG, the EDGE_RUNTIME
default without ``-c``): GetConfiguration, followed live, each deployment validated before it
applies. The startup command interpolates no configuration, so a change never restarts it.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "deploy" / "greengrass" / "recipes"
EXAMPLES = ROOT / "examples"
PREFIX = "com.unskit."
PUBLISHER = "unskit"
#: The extra of each file-egress backend that needs an SDK (pyproject.toml).
_EGRESS_EXTRAS = {
    "objectstore": "egress",
    "sftp": "egress",
    "http": "http",
    "bucketstore": "bucketstore",
    "blobstore": "blobstore",
}
#: Topic filters a component subscribes to beyond its command inbox and reply filter, from
#: its document: the recorder records `component.topics.include`.
_RECORDED = ("signal-recorder",)
#: The nucleus's default timeouts (120 s) are short for pip installing NumPy and OpenCV on a
#: small gateway; the startup step's process is the component and ends only when it stops.
INSTALL_TIMEOUT_S = 900
#: What a startup that never reports RUNNING is given before the nucleus calls it broken.
STARTUP_TIMEOUT_S = 300


def project_version() -> str:
    """The package version (maturin takes it from the Rust crate)."""
    cargo = tomllib.loads((ROOT / "rust" / "unskit-py" / "Cargo.toml").read_text())
    version = cargo["package"]["version"]
    if isinstance(version, dict):  # version.workspace = true
        version = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"][
            "version"
        ]
    return str(version)


def component_names() -> list[str]:
    """The names `unskit run` accepts (pyproject.toml's entry points), in its order."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(project["project"]["entry-points"]["unskit.components"])


def component_name(name: str) -> str:
    """``ethernet-ip-adapter`` -> ``com.unskit.EthernetIpAdapter``."""
    return PREFIX + "".join(part[:1].upper() + part[1:] for part in name.split("-"))


def edge_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """The document as the runtime holds it: no `messaging.local` (the IPC bus is the local
    link on the edge runtime), and no empty `messaging` left behind."""
    result = copy.deepcopy(dict(document))
    messaging = result.get("messaging")
    if isinstance(messaging, dict):
        messaging.pop("local", None)
        if not messaging:
            del result["messaging"]
    return result


def topic_base(name: str, document: Mapping[str, Any]) -> str:
    """The component's topic base, ``{root}/{thing}/{token}`` (unskit.topics.TopicScope),
    with the thing as the recipe variable the nucleus fills in."""
    topic = document.get("topic", {})
    root = str(topic.get("root", "uns"))
    if topic.get("includeRoot"):
        first = document["hierarchy"]["levels"][0]
        root = f"{root}/{document['identity'][first]}"
    token = document.get("component", {}).get("token", name)
    return f"{root}/{{iot:thingName}}/{token}"


def access_control(name: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """The pub/sub policies of one component: what it publishes and subscribes, no more."""
    base = topic_base(name, document)
    token = document.get("component", {}).get("token", name)
    messaging = document.get("messaging", {})
    # Replies go to the requester's topic: lib/reply-* or a configured replyTopicPrefixes.
    replies = ["lib/reply-*", *(f"{p}*" for p in messaging.get("replyTopicPrefixes", ()))]
    # `*` is the policy's wildcard (MQTT's `#` and `+` in a policy match only themselves):
    # data, evt, state, metric, cfg and log, of the component and of each instance.
    publish = [f"{base}/*", *replies]
    subscribe = [
        # The command inbox (unskit.commands.inbox.CommandInbox.filters), exactly as sent.
        f"{base}/cmd/sb/+",
        f"{base}/+/cmd/sb/+",
        # The link's reply filter: lib/reply-{client id}/#, the client id {thing}-{token}
        # (unskit.config.messaging; a thing name outside [A-Za-z0-9_.-] is hashed instead).
        f"lib/reply-{{iot:thingName}}-{token}/#",
    ]
    if name == "echo":
        subscribe.append(f"{base}/cmd/sb/echo")
    if name in _RECORDED:
        subscribe.extend(document["component"]["topics"]["include"])
    policy_name = component_name(name)
    return {
        "aws.greengrass.ipc.pubsub": {
            f"{policy_name}:pubsub:publish": {
                "policyDescription": "its own UNS topics and requesters' reply topics",
                "operations": ["aws.greengrass#PublishToTopic"],
                "resources": publish,
            },
            f"{policy_name}:pubsub:subscribe": {
                "policyDescription": "its command inbox, its reply filter and what it consumes",
                "operations": ["aws.greengrass#SubscribeToTopic"],
                "resources": subscribe,
            },
        }
    }


def extras_for(name: str, document: Mapping[str, Any]) -> tuple[str, ...]:
    """The extras the component needs for `document` besides `edge` (the IPC bus); `unskit
    run` refuses a document whose SDK is missing, naming the same extra."""
    component = document.get("component", {})
    if name == "opcua-adapter":
        return ("opcua",)
    if name == "signal-recorder":
        return ("recorder",)
    if name == "camera-adapter":
        onvif = component.get("discovery", {}).get("enabled", False) or any(
            camera.get("backend") == "onvif" for camera in component.get("cameras", ())
        )
        return ("onvif",) if onvif else ()
    if name == "file-egress":
        types = {
            destination.get("type")
            for instance in component.get("instances", ())
            for destination in instance.get("egress", ())
        }
        return tuple(sorted({_EGRESS_EXTRAS[t] for t in types if t in _EGRESS_EXTRAS}))
    return ()


def wheelhouse_name(version: str) -> str:
    """The artifact: a zip of the unskit wheel and its dependencies' wheels."""
    return f"unskit-wheelhouse-{version}"


def _startup(name: str) -> str:
    # The component's state (the command journal; an outbox, a recorder's or egress's state
    # unless the document names a stateDir) in its own work folder, owned by the user the
    # nucleus runs it as: no home folder needed, and none shared with another component.
    return f"UNSKIT_STATE_DIR={{work:path}}/state exec {{work:path}}/venv/bin/unskit run {name}"


def recipe(
    name: str,
    document: Mapping[str, Any],
    *,
    version: str,
    artifact_uri: str | None = None,
) -> dict[str, Any]:
    """The recipe of component `name` with `document` as its default configuration."""
    document = edge_document(document)
    extras = extras_for(name, document)
    house = wheelhouse_name(version)
    requirement = f"unskit[{','.join(['edge', *extras])}]=={version}"
    install = (
        "python3 -m venv {work:path}/venv && "
        "{work:path}/venv/bin/python -m pip install --disable-pip-version-check -q "
        f"--no-index --find-links {{artifacts:decompressedPath}}/{house} '{requirement}'"
    )
    uri = artifact_uri or f"s3://YOUR-BUCKET/unskit/{version}/{house}.zip"
    return {
        "RecipeFormatVersion": "2020-01-25",
        "ComponentName": component_name(name),
        "ComponentVersion": version,
        "ComponentDescription": f"unskit {name}: `unskit run {name}` on the IPC bus",
        "ComponentPublisher": PUBLISHER,
        "ComponentConfiguration": {
            "DefaultConfiguration": {**document, "accessControl": access_control(name, document)}
        },
        "Manifests": [
            {
                "Platform": {"os": "linux"},
                "Lifecycle": {
                    "install": {"Script": install, "Timeout": INSTALL_TIMEOUT_S},
                    "startup": {"Script": _startup(name), "Timeout": STARTUP_TIMEOUT_S},
                },
                "Artifacts": [{"Uri": uri, "Unarchive": "ZIP"}],
            }
        ],
    }


def recipe_file(recipe_: Mapping[str, Any]) -> str:
    """The file name `greengrass-cli deployment create --recipeDir` reads it under."""
    return f"{recipe_['ComponentName']}-{recipe_['ComponentVersion']}.json"


def render(recipe_: Mapping[str, Any]) -> str:
    return json.dumps(recipe_, indent=2) + "\n"


def recipes_from(folder: Path, names: Sequence[str]) -> dict[str, str]:
    """File name -> text of the recipe of each component of `names`, from folder/NAME.json."""
    version = project_version()
    found = {}
    for name in names:
        made = recipe(name, json.loads((folder / f"{name}.json").read_text()), version=version)
        found[recipe_file(made)] = render(made)
    return found


def default_recipes() -> dict[Path, dict[str, str]]:
    """Recipe folder -> its recipes: deploy/greengrass/recipes/ (every component, from
    examples/NAME.json) and examples/edge-runtime/recipes/ (from the documents there)."""
    edge = EXAMPLES / "edge-runtime"
    return {
        RECIPES: recipes_from(EXAMPLES, component_names()),
        edge / "recipes": recipes_from(edge, sorted(p.stem for p in edge.glob("*.json"))),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when recipes/ is stale")
    parser.add_argument("--name", help="one component (an entry point name)")
    parser.add_argument("--document", type=Path, help="its configuration (with --name)")
    parser.add_argument("--artifact-uri", help="where the wheelhouse zip is (default s3://…)")
    parser.add_argument("--out", type=Path, help="the recipe folder (with --name)")
    args = parser.parse_args(argv)
    if args.name:
        document = json.loads((args.document or EXAMPLES / f"{args.name}.json").read_text())
        made = recipe(
            args.name,
            document,
            version=project_version(),
            artifact_uri=args.artifact_uri,
        )
        folders = {args.out or Path.cwd(): {recipe_file(made): render(made)}}
    else:
        folders = default_recipes()
    if args.check:
        stale = stale_recipes(folders)
        for path in stale:
            print(f"{path}: stale (run deploy/greengrass/generate.py)")
        return 1 if stale else 0
    for folder, wanted in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        for file, text in wanted.items():
            (folder / file).write_text(text)
            print(folder / file)
    return 0


def stale_recipes(folders: Mapping[Path, Mapping[str, str]]) -> list[Path]:
    """Recipe files that differ from what would be generated, are missing, or are left over."""
    stale = []
    for folder, wanted in folders.items():
        stale += [folder / f for f, text in wanted.items() if _read(folder / f) != text]
        stale += [p for p in sorted(folder.glob("*.json")) if p.name not in wanted]
    return stale


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
