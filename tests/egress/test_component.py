"""The file-egress component: its configuration refused with JSON paths, and its verbs
(sb/status, sb/pause, sb/resume, sb/retry) over a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.egress.conftest import write_file
from tests.support.adapter import AdapterHarness
from tests.support.mosquitto import Mosquitto
from tests.support.servers import wait_until
from unskit.config.model import build_config
from unskit.config.platform import Platform
from unskit.config.schema import validate_document
from unskit.egress.component import FileEgress
from unskit.egress.config import component_schema, configuration_issues
from unskit.errors import CommandError


def document(*egress: dict[str, Any], **instance: Any) -> dict[str, Any]:
    entry = {"id": "line-1", "source": {"path": "/data/out"}, "egress": list(egress), **instance}
    return {
        "component": {"instances": [entry]},
        "messaging": {"local": {"host": "embedded"}},
    }


def issues(doc: dict[str, Any]) -> list[str]:
    found = validate_document(doc, component_schema=component_schema())
    if not found:
        config = build_config(
            doc, thing="gw", platform=Platform.HOST, component_token="file-egress"
        )
        found = configuration_issues(config)
    return [str(issue) for issue in found]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            document({"type": "local", "path": "/y", "colour": "red"}),
            "$.component.instances[0].egress[0].colour: unknown key",
        ),
        (document({"type": "local"}), "$.component.instances[0].egress[0].path: is required"),
        (
            document({"type": "objectstore", "bucket": "bkt", "multipart": {"partSize": 1}}),
            "$.component.instances[0].egress[0].multipart.partSize: unknown key",
        ),
        (
            document({"type": "objectstore", "bucket": "bkt", "checksumAlgorithm": "MD5"}),
            "$.component.instances[0].egress[0].checksumAlgorithm",
        ),
        (
            document({"type": "objectstore", "bucket": "bkt", "kmsKeyId": "k"}),
            "$.component.instances[0].egress[0].kmsKeyId: applies only with sse aws:kms",
        ),
        (
            document({"type": "http", "url": "ftp://h/x"}),
            "$.component.instances[0].egress[0].url: must be an http:// or https:// URL",
        ),
        (
            document({"type": "http", "url": "https://u:pw@h/x"}),
            "$.component.instances[0].egress[0].url: must not carry credentials",
        ),
        (
            document({"type": "http", "url": "https://h/", "method": "PATCH"}),
            "$.component.instances[0].egress[0].method: must be PUT or POST",
        ),
        (
            document({"type": "http", "url": "https://h/", "bearerToken": "t", "username": "u"}),
            "$.component.instances[0].egress[0].bearerToken: not allowed with username",
        ),
        (
            document(
                {
                    "type": "http",
                    "url": "https://h/",
                    "bearerToken": "t",
                    "headers": {"authorization": "x"},
                }
            ),
            "$.component.instances[0].egress[0].headers.Authorization: conflicts with the",
        ),
        (
            {
                **document(
                    {
                        "type": "http",
                        "url": "https://h/",
                        "credentials": {"$secret": "w"},
                        "username": "u",
                    }
                ),
                "credentials": {"vaultPath": "/tmp/none"},
            },
            "$.component.instances[0].egress[0].username: not allowed with credentials",
        ),
        (
            document({"type": "http", "url": "https://h/", "password": "p"}),
            "$.component.instances[0].egress[0].username: required with password",
        ),
        (
            document({"type": "http", "url": "https://h/", "chunkBytes": 1000}),
            "$.component.instances[0].egress[0].chunkBytes",
        ),
        (
            document({"type": "http", "url": "https://h/", "headers": {"bad name": "x"}}),
            "$.component.instances[0].egress[0].headers",
        ),
        (
            document({"type": "sftp", "host": "h", "username": "u", "hostKey": "ssh-rsa x"}),
            "$.component.instances[0].egress[0].hostKey: not an SSH public key line",
        ),
        (
            document({"type": "sftp", "host": "h"}),
            "$.component.instances[0].egress[0].username: required without credentials",
        ),
        (
            {
                **document(
                    {"type": "sftp", "host": "h", "username": "u", "credentials": {"$secret": "f"}}
                ),
                "credentials": {"vaultPath": "/tmp/none"},
            },
            "$.component.instances[0].egress[0].username: not allowed with credentials",
        ),
        (
            document({"type": "sftp", "host": "h", "username": "u", "tempSuffix": "a/b"}),
            "$.component.instances[0].egress[0].tempSuffix",
        ),
        (
            document({"type": "sftp", "host": "h", "username": "u", "insecure": True}),
            "$.component.instances[0].egress[0].insecure: unknown key",
        ),
        (
            document({"type": "ftps", "host": "h", "username": "u", "hostKey": "k"}),
            "$.component.instances[0].egress[0].hostKey: unknown key",
        ),
        (
            document({"type": "ftps", "host": "h"}),
            "$.component.instances[0].egress[0].username: required without credentials",
        ),
        (
            document({"type": "local", "path": "/y"}, onComplete={"action": "archive"}),
            "$.component.instances[0].onComplete.archiveDir: the archive action needs it",
        ),
        (
            document({"type": "local", "path": "/data/out/copy"}),
            "$.component.instances[0].egress[0].path: must not lie inside the source",
        ),
        (
            document(
                {"type": "local", "path": "/a", "id": "x"},
                {"type": "local", "path": "/b", "id": "x"},
            ),
            "$.component.instances[0].egress[1].id: duplicate egress id 'x'",
        ),
        # Issue 36: an empty include list was replaced by ["*"] and delivered everything.
        (
            document({"type": "local", "path": "/y"}, source={"path": "/data/out", "include": []}),
            "$.component.instances[0].source.include: must not be empty",
        ),
        # ... an integer written 2.0 reached the thread pool (TypeError at start) ...
        (
            document({"type": "local", "path": "/y", "maxConcurrentFiles": 2.0}),
            "$.component.instances[0].egress[0].maxConcurrentFiles: must be an integer",
        ),
        # ... and a settle time of 1e300 killed the watcher thread with OverflowError.
        (
            document(
                {"type": "local", "path": "/y"}, source={"path": "/d", "settleSeconds": 1e300}
            ),
            "$.component.instances[0].source.settleSeconds: must be <= 315360000",
        ),
        (document(), "$.component.instances[0].egress"),
        ({"component": {"instances": [{"id": "a", "egress": []}]}}, "source: is required"),
    ],
)
def test_bad_configurations_are_refused_with_their_json_path(doc, expected):
    assert any(expected in issue for issue in issues(doc)), issues(doc)


@pytest.mark.parametrize("key", ["global.stateDir", "source.path", "onComplete.archiveDir"])
def test_a_directory_key_where_a_file_is_refused_with_its_path(tmp_path: Path, key: str):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    entry: dict[str, Any] = {
        "source": {"path": str(tmp_path / "out")},
        "onComplete": {"action": "archive", "archiveDir": str(tmp_path / "sent")},
    }
    destination = {"type": "local", "path": str(tmp_path / "nas")}
    doc = document(destination, **entry)
    component = doc["component"]
    if key == "global.stateDir":
        component["global"] = {"stateDir": str(blocker / "state")}
        path = "$.component.global.stateDir"
    else:
        instance = component["instances"][0]
        section, _, name = key.partition(".")
        instance[section][name] = str(blocker)
        path = f"$.component.instances[0].{key}"
    found = issues(doc)
    assert any(issue.startswith(f"{path}: ") and "is a file" in issue for issue in found), found


def test_the_shipped_schema_accepts_every_spec_key():
    full = document(
        {"type": "local", "path": "/y", "fsync": True, "id": "nas", "bandwidthBytesPerSec": 1},
        {
            "type": "objectstore",
            "bucket": "bkt",
            "prefix": "p/",
            "region": "eu-west-1",
            "endpointUrl": "https://s3.example",
            "credentials": {"$secret": "s3"},
            "storageClass": "STANDARD_IA",
            "sse": "aws:kms",
            "kmsKeyId": "alias/k",
            "accelerate": False,
            "unsignedPayload": True,
            "checksumAlgorithm": "SHA256",
            "multipart": {
                "thresholdBytes": 16 * 1024 * 1024,
                "partSizeBytes": 8 * 1024 * 1024,
                "maxConcurrentParts": 8,
            },
        },
        {
            "type": "sftp",
            "host": "sftp.example",
            "port": 2222,
            "baseDir": "/in",
            "username": "edge",
            "password": {"$secret": "sftp", "field": "password"},
            "privateKey": "/keys/id_ed25519",
            "passphrase": {"$secret": "sftp", "field": "passphrase"},
            "hostKey": "ssh-ed25519 "
            "AAAAC3NzaC1lZDI1NTE5AAAAIEoH1fvV0Wn1z+R2iDl1dcS4Rl6dh0D0cR1wqZnS0H0k",
            "insecureAcceptAnyHostKey": False,
            "tempSuffix": ".part",
            "fsync": True,
            "checksumAlgorithm": "CRC32C",
        },
        {"type": "sftp", "host": "h", "credentials": {"$secret": "sftp-login"}},
        {
            "type": "ftps",
            "host": "ftp.example",
            "port": 990,
            "baseDir": "up",
            "username": "edge",
            "password": {"$secret": "ftp"},
            "explicitTls": False,
            "passive": False,
            "caPath": "/etc/ca.pem",
            "tempSuffix": ".tmp",
            "checksumAlgorithm": "SHA256",
        },
        {"type": "ftps", "host": "h", "credentials": {"$secret": "ftp-login"}},
        {
            "type": "http",
            "url": "https://ingest.example/up/?tenant=7",
            "method": "PUT",
            "headers": {"X-Site": "plant-1", "X-Api-Key": {"$secret": "api", "field": "key"}},
            "username": "edge",
            "password": {"$secret": "http", "field": "password"},
            "resumable": True,
            "chunkBytes": 4 * 1024 * 1024,
            "checksumAlgorithm": "SHA256",
        },
        {"type": "http", "url": "http://h/", "method": "POST", "bearerToken": "t"},
        {"type": "http", "url": "http://h/", "credentials": {"$secret": "http-login"}},
    )
    full["credentials"] = {"vaultPath": "/tmp/none"}
    found = validate_document(full, component_schema=component_schema())
    assert not found, found


@pytest.mark.integration
def test_unskit_run_refuses_a_bad_configuration_naming_the_path(tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document({"type": "local", "path": "/y", "oops": 1})))
    result = subprocess.run(
        [sys.executable, "-m", "unskit.cli", "run", "file-egress", "-c", str(path), "-t", "gw"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "$.component.instances[0].egress[0].oops" in result.stderr


@pytest.fixture
def adapters(broker: Mosquitto, tmp_path: Path, restore_root_logging: None):
    # The in-process Runtime configures the root logger; later tests expect it as it was.
    harness = AdapterHarness(broker, tmp_path)
    yield harness
    harness.close()


def test_status_pause_resume_and_retry(adapters: AdapterHarness, tmp_path: Path):
    source, out, blocked = tmp_path / "src", tmp_path / "out", tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    component = {
        "global": {
            "stateDir": str(tmp_path / "egress-state"),
            "retry": {"initialBackoffMs": 50, "maxAttempts": 1},
        },
        "instances": [
            {
                "id": "line-1",
                "source": {"path": str(source), "settleSeconds": 0},
                "egress": [
                    {"id": "out", "type": "local", "path": str(out)},
                    {"id": "blocked", "type": "local", "path": str(blocked)},
                ],
            }
        ],
    }
    adapter = adapters.start(FileEgress, adapters.document(component))
    client = adapter.client
    assert client.call("pause", instance="line-1") == {
        "instance": "line-1",
        "paused": True,
        "changed": True,
    }
    data = write_file(source / "a.bin", 1000)
    wait_until(lambda: client.call("status", instance="line-1")["queueTotal"] == 1, 20, "queued")
    status = client.call("status", instance="line-1")
    assert status["paused"] is True
    entry = status["queue"][0]
    assert entry["file"] == "a.bin"
    assert {d: v["state"] for d, v in entry["destinations"].items()} == {
        "out": "pending",
        "blocked": "pending",
    }
    assert client.call("resume", instance="line-1")["changed"] is True

    def states() -> dict[str, str]:
        queue = client.call("status", instance="line-1")["queue"]
        return {d: v["state"] for d, v in queue[0]["destinations"].items()} if queue else {}

    wait_until(lambda: states() == {"out": "verified", "blocked": "failed"}, 20, "one failure")
    assert (out / "a.bin").read_bytes() == data
    assert (source / "a.bin").exists()
    whole = client.call("status")
    assert [i["instance"] for i in whole["instances"]] == ["line-1"]
    assert whole["messaging"]["local"]["connected"] is True
    with pytest.raises(CommandError, match="BAD_ARGS"):
        client.call("retry", {}, instance="line-1")  # a mutating verb needs a requestId
    blocked.unlink()
    reply = client.call("retry", {"requestId": uuid.uuid4().hex}, instance="line-1")
    assert reply == {"instance": "line-1", "requeued": ["a.bin"]}
    # The source goes first, then the record (a crash between the two is settled at start).
    wait_until(
        lambda: client.call("status", instance="line-1")["files"] == {"completed": 1},
        20,
        "completion after sb/retry",
    )
    assert not (source / "a.bin").exists()
    assert (blocked / "a.bin").read_bytes() == data
    with pytest.raises(CommandError, match="NO_SUCH_INSTANCE"):
        client.call("status", instance="line-9")


def test_objectstore_credentials_resolve_from_the_vault(tmp_path: Path):
    from unskit.config.vault import Vault, VaultKey, VaultSecrets
    from unskit.egress.backends.objectrules import credentials
    from unskit.errors import SecretError

    key = VaultKey.generate()
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    vault = Vault(tmp_path / "vault.json", key)
    vault.put("s3", {"accessKeyId": "AKIA1", "secretAccessKey": "shh"})
    vault.put("loose", "just-a-token")
    secrets = VaultSecrets(str(tmp_path / "vault.json"), key_file=str(key_file))
    bundle = credentials({"$secret": "s3"}, secrets)
    assert bundle is not None
    assert bundle["accessKeyId"].reveal() == "AKIA1"
    assert bundle["secretAccessKey"].reveal() == "shh"
    assert bundle["sessionToken"] is None
    fields = credentials({"accessKeyId": "AKIA2", "secretAccessKey": {"$secret": "loose"}}, secrets)
    assert fields is not None
    assert fields["secretAccessKey"].reveal() == "just-a-token"
    assert "just-a-token" not in repr(fields)
    assert credentials(None, secrets) is None  # the ambient provider chain
    with pytest.raises(SecretError):
        credentials({"$secret": "missing"}, secrets)
