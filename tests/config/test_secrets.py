"""`$secret` references and the `Secret` type: resolved at connect time, never shown."""

from __future__ import annotations

import copy
import json
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

from unskit import cli
from unskit.config import (
    ConfigLoader,
    Platform,
    Secret,
    SecretRef,
    Vault,
    VaultKey,
    find_secret_refs,
    load_config,
    redact,
    resolve_config,
    resolve_value,
)
from unskit.config.secrets import is_sensitive_key
from unskit.errors import ConfigError, SecretError

from .documents import ANY_COMPONENT_SCHEMA, THING, TOKEN, patched

ANY = ("--schema", ANY_COMPONENT_SCHEMA)

VAULT_SECRET = "vault-held-s3cr3t-value"
INLINE_SECRET = "inline-pl4intext-password"


def test_secret_never_shows_its_value() -> None:
    secret = Secret(VAULT_SECRET)
    shown = [repr(secret), str(secret), f"{secret}", f"{secret!r}", f"{secret:>40}", format(secret)]
    assert all(VAULT_SECRET not in text for text in shown)
    assert str(secret) == "***"
    assert secret.reveal() == VAULT_SECRET
    assert VAULT_SECRET not in repr([secret, {"k": secret}])


def test_secret_compares_by_value_but_cannot_be_hashed_or_pickled() -> None:
    assert Secret("a") == Secret("a")
    assert Secret("a") != Secret("b")
    with pytest.raises(TypeError):
        hash(Secret("a"))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(Secret("a"))
    assert copy.deepcopy(Secret("a")).reveal() == "a"


def test_secret_holds_only_text() -> None:
    with pytest.raises(TypeError):
        Secret(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "sensitive"),
    [
        ("password", True),
        ("passphrase", True),
        ("bearerToken", True),
        ("accessToken", True),
        ("accountKey", True),
        ("connectionString", True),
        ("privateKey", True),
        ("keyPem", True),
        ("client_secret", True),
        ("pin", True),
        ("key", True),
        ("keyPath", False),
        ("keyFile", False),
        ("keyLabel", False),
        ("pinEnv", False),
        ("username", False),
        ("caPath", False),
        ("credentials", False),
        ("host", False),
    ],
)
def test_sensitive_key_names(name: str, sensitive: bool) -> None:
    assert is_sensitive_key(name) is sensitive


def test_redact_replaces_references_and_credential_fields() -> None:
    document = {
        "messaging": {
            "local": {
                "credentials": {
                    "caPath": "/ca.pem",
                    "keyPath": "/k.pem",
                    "username": "u",
                    "password": INLINE_SECRET,
                }
            }
        },
        "component": {
            "instances": [{"cert": {"$secret": "plc", "field": "certPem"}, "pin": 1234}],
            "egress": {"credentials": {"$secret": "s3"}},
            "opaque": Secret(VAULT_SECRET),
            "nothing": {"password": None},
        },
    }
    redacted = redact(document)
    creds = redacted["messaging"]["local"]["credentials"]
    assert creds == {"caPath": "/ca.pem", "keyPath": "/k.pem", "username": "u", "password": "***"}
    assert redacted["component"]["instances"] == [{"cert": "***", "pin": "***"}]
    assert redacted["component"]["egress"] == {"credentials": "***"}
    assert redacted["component"]["opaque"] == "***"
    assert redacted["component"]["nothing"] == {"password": None}
    assert document["messaging"]["local"]["credentials"]["password"] == INLINE_SECRET
    text = json.dumps(redacted)
    assert INLINE_SECRET not in text
    assert "plc" not in text


def test_find_secret_refs_names_paths() -> None:
    document = {
        "a": {"$secret": "one"},
        "b": [{"c": {"$secret": "two", "field": "f"}}],
        "d": {"$secret": "", "junk": 1},
    }
    assert find_secret_refs(document) == [
        ("$.a", SecretRef("one")),
        ("$.b[0].c", SecretRef("two", "f")),
    ]


def test_resolve_value() -> None:
    class Resolver:
        def resolve(self, ref: SecretRef) -> Secret:
            return Secret(f"value-of-{ref.name}")

    assert resolve_value(None, None) is None
    assert resolve_value("plain", None) == Secret("plain")
    assert resolve_value(Secret("s"), None) == Secret("s")
    assert resolve_value(SecretRef("n"), Resolver()) == Secret("value-of-n")
    with pytest.raises(SecretError, match="has no vault"):
        resolve_value(SecretRef("n"), None)


@pytest.fixture
def vault_setup(tmp_path: Path) -> dict[str, Any]:
    key = VaultKey.generate()
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    vault_path = tmp_path / "vault.json"
    Vault(vault_path, key).put("broker", {"username": "svc", "password": VAULT_SECRET})
    document = patched(
        {
            "credentials": {"vaultPath": str(vault_path), "keyFile": str(key_file)},
            "messaging": {
                "local": {
                    "credentials": {
                        "username": {"$secret": "broker", "field": "username"},
                        "password": {"$secret": "broker", "field": "password"},
                    }
                },
            },
            # An inline secret beside the references (spec 1 refuses a password on the
            # northbound link, where it used to sit).
            "component": {"login": {"user": "nb", "password": INLINE_SECRET}},
        }
    )
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(document))
    return {"config": config_path, "key_file": key_file, "vault": vault_path}


def test_references_resolve_at_connect_time_not_during_load(
    vault_setup: dict[str, Any],
) -> None:
    vault_setup["key_file"].unlink()  # loading must not need the key at all
    config = load_config(vault_setup["config"], thing=THING, platform=Platform.HOST)
    local = config.messaging.local
    assert local is not None
    password = local.credentials.password
    assert password == SecretRef("broker", "password")
    with pytest.raises(SecretError, match="does not exist"):
        config.secrets().resolve(SecretRef("broker", "password"))


def test_references_resolve_from_the_configured_vault(vault_setup: dict[str, Any]) -> None:
    config = load_config(vault_setup["config"], thing=THING, platform=Platform.HOST)
    local = config.messaging.local
    assert local is not None
    resolver = config.secrets()
    assert resolve_value(local.credentials.password, resolver) == Secret(VAULT_SECRET)
    username = local.credentials.username
    assert isinstance(username, SecretRef)
    assert resolver.resolve(username).reveal() == "svc"
    assert [path for path, _ in config.secret_refs()] == [
        "$.messaging.local.credentials.username",
        "$.messaging.local.credentials.password",
    ]


def test_secrets_without_vault_section_raise() -> None:
    config = resolve_config(
        patched({}), thing=THING, platform=Platform.HOST, default_component=TOKEN
    )
    with pytest.raises(SecretError, match="no credentials section"):
        config.secrets()


def test_secrets_never_reach_logs_output_or_reprs(
    vault_setup: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with caplog.at_level(logging.DEBUG):
        loader = ConfigLoader(vault_setup["config"], thing=THING, platform=Platform.HOST)
        config = loader.load()
        resolved = config.secrets().resolve(SecretRef("broker", "password"))
        logging.getLogger("test").info("resolved %s, config %r", resolved, config)
        print(config.describe(), config.redacted(), repr(config), config.messaging, resolved)
        assert cli.main(["validate", "-c", str(vault_setup["config"]), "-t", THING, *ANY]) == 0
    out = capsys.readouterr()
    assert "configuration loaded" in caplog.text  # the configuration was logged ...
    assert '"password": "***"' in caplog.text  # ... with its secrets masked
    for text in (caplog.text, out.out, out.err, repr(config), str(config.messaging)):
        assert VAULT_SECRET not in text
        assert INLINE_SECRET not in text
    assert resolved.reveal() == VAULT_SECRET


@pytest.mark.parametrize(
    "patch",
    [
        {"messaging": {"local": {"credentials": {"password": 987654321}}}},
        {"messaging": {"local": {"credentials": {"password": ["hunter2-as-list"]}}}},
        {"messaging": {"local": {"credentials": {"password": {"$secret": 987654321}}}}},
        {"component": {"cert": {"$secret": "x", "junk": "hunter2-as-junk"}}},
        {"messaging": {"local": {"clientId": 987654321}}},
        {"messaging": {"local": {"port": "hunter2-port"}}},
        {"health": {"port": 987654321}},
        {"tags": {"site": "hunter2-in-tag"}},
        {"tags": {"owner": ["hunter2-in-list"]}},
        {"identity": {"site": "hunter2/with/slash"}},
        {"logging": {"level": "hunter2-level"}},
        {"metricEmission": {"targetConfig": {"topic": "hunter2-topic"}}},
    ],
)
def test_validation_errors_never_echo_values(
    patch: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document = patched({"credentials": {"vaultPath": "v"}, **patch})
    with pytest.raises(ConfigError) as caught:
        resolve_config(document, thing=THING, platform=Platform.HOST)
    text = str(caught.value) + repr(caught.value.issues)
    assert "987654321" not in text
    assert "hunter2" not in text
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    assert cli.main(["validate", "-c", str(path), *ANY]) == 2
    out = capsys.readouterr()
    assert "hunter2" not in out.err + out.out
    assert "987654321" not in out.err + out.out
