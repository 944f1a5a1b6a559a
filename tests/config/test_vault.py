"""The encrypted vault: round trip, wrong key, tampering, atomic writes."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from unskit.config import SecretRef, Vault, VaultKey, VaultSecrets
from unskit.errors import SecretError, UnskitError

PLAIN = "correct-horse-battery-staple"


@pytest.fixture
def key() -> VaultKey:
    return VaultKey.generate()


@pytest.fixture
def vault(tmp_path: Path, key: VaultKey) -> Vault:
    return Vault(tmp_path / "vault.json", key)


def test_round_trip_through_a_new_instance(vault: Vault, key: VaultKey) -> None:
    vault.put("broker-password", PLAIN)
    vault.put("plc-cert", {"certPem": "CERT", "keyPem": "KEY"})
    reopened = Vault(vault.path, key)
    assert reopened.names() == ["broker-password", "plc-cert"]
    assert reopened.resolve(SecretRef("broker-password")).reveal() == PLAIN
    assert reopened.resolve(SecretRef("plc-cert", "keyPem")).reveal() == "KEY"
    assert reopened.get("plc-cert") == {"certPem": "CERT", "keyPem": "KEY"}


def test_put_replaces_and_delete_removes(vault: Vault) -> None:
    vault.put("a", "1")
    vault.put("a", "2")
    assert vault.resolve(SecretRef("a")).reveal() == "2"
    assert vault.delete("a") is True
    assert vault.delete("a") is False
    assert vault.names() == []


def test_missing_vault_file_is_empty(vault: Vault) -> None:
    assert vault.names() == []
    with pytest.raises(SecretError, match="no secret named 'x'"):
        vault.get("x")


def test_file_holds_no_plaintext_and_is_private(vault: Vault) -> None:
    vault.put("broker-password", PLAIN)
    data = vault.path.read_bytes()
    assert PLAIN.encode() not in data
    assert b"broker-password" not in data  # names are encrypted too
    assert stat.S_IMODE(vault.path.stat().st_mode) == 0o600
    outer = json.loads(data)
    assert outer["format"] == "unskit-vault"
    assert outer["cipher"] == "AES-256-GCM"


def test_wrong_key_fails_clearly(vault: Vault) -> None:
    vault.put("a", PLAIN)
    other = Vault(vault.path, VaultKey.generate())
    with pytest.raises(SecretError, match="wrong key") as caught:
        other.names()
    assert PLAIN not in str(caught.value)


def test_tampered_ciphertext_fails_authentication(vault: Vault) -> None:
    vault.put("a", PLAIN)
    outer = json.loads(vault.path.read_text())
    raw = bytearray(base64.b64decode(outer["ciphertext"]))
    raw[3] ^= 0x01
    outer["ciphertext"] = base64.b64encode(bytes(raw)).decode()
    vault.path.write_text(json.dumps(outer))
    with pytest.raises(SecretError, match="failed authentication: the file was modified"):
        vault.get("a")


def test_tampered_header_fails_authentication(vault: Vault) -> None:
    vault.put("a", PLAIN)
    outer = json.loads(vault.path.read_text())
    outer["nonce"] = base64.b64encode(bytes(12)).decode()
    vault.path.write_text(json.dumps(outer))
    with pytest.raises(SecretError, match="failed authentication"):
        vault.names()


def test_not_a_vault_file(vault: Vault) -> None:
    vault.path.write_text('{"hello": "world"}')
    with pytest.raises(SecretError, match="not an unskit vault file"):
        vault.names()


def test_write_is_atomic_when_replace_fails(vault: Vault, monkeypatch: pytest.MonkeyPatch) -> None:
    vault.put("a", "old")
    before = vault.path.read_bytes()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        vault.put("a", "new")
    monkeypatch.undo()
    assert vault.path.read_bytes() == before
    assert sorted(p.name for p in vault.path.parent.iterdir()) == ["vault.json"]


def test_no_temporary_files_are_left(vault: Vault) -> None:
    for i in range(3):
        vault.put(f"s{i}", "v")
    assert sorted(p.name for p in vault.path.parent.iterdir()) == ["vault.json"]


def test_concurrent_puts_all_land(vault: Vault, key: VaultKey) -> None:
    barrier = threading.Barrier(8)

    def put(i: int) -> None:
        barrier.wait()
        Vault(vault.path, key).put(f"s{i}", str(i))

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert vault.names() == [f"s{i}" for i in range(8)]


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        (SecretRef("bundle"), "is a bundle"),
        (SecretRef("bundle", "nope"), "has no field 'nope'"),
        (SecretRef("plain", "x"), "plain value and has no field"),
        (SecretRef("absent"), "no secret named 'absent'"),
    ],
)
def test_resolve_errors(vault: Vault, ref: SecretRef, words: str) -> None:
    vault.put("bundle", {"certPem": "C"})
    vault.put("plain", PLAIN)
    with pytest.raises(SecretError, match=words) as caught:
        vault.resolve(ref)
    assert PLAIN not in str(caught.value)


@pytest.mark.parametrize("name", ["", "with space", "x" * 257])
def test_bad_secret_names_are_refused(vault: Vault, name: str) -> None:
    with pytest.raises(SecretError, match="secret name"):
        vault.put(name, "v")


def test_bad_secret_values_are_refused(vault: Vault) -> None:
    with pytest.raises(SecretError, match="string or an object of string fields"):
        vault.put("x", {"n": 1})  # type: ignore[dict-item]


def test_key_text_round_trip_and_repr(key: VaultKey, tmp_path: Path) -> None:
    text = key.to_text()
    assert VaultKey.from_text(text).key_id == key.key_id
    assert VaultKey.from_text(text.replace("-", "+").replace("_", "/")).key_id == key.key_id
    path = tmp_path / "k"
    path.write_text(text + "\n")
    assert VaultKey.from_file(path).key_id == key.key_id
    assert text not in repr(key)
    assert key.key_id in repr(key)


@pytest.mark.parametrize(
    ("text", "words"), [("not base64!", "not valid base64"), ("YWJj", "32 bytes, not 3")]
)
def test_bad_key_text(text: str, words: str) -> None:
    with pytest.raises(SecretError, match=words):
        VaultKey.from_text(text)


def test_key_from_environment(key: VaultKey) -> None:
    assert VaultKey.from_env("K", {"K": key.to_text()}).key_id == key.key_id
    with pytest.raises(SecretError, match="UNSKIT_VAULT_KEY is not set"):
        VaultKey.from_env(environ={})


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="does not exist"):
        VaultKey.from_file(tmp_path / "absent.key")


def test_vault_secrets_resolver_reads_key_file_or_env(
    vault: Vault, key: VaultKey, tmp_path: Path
) -> None:
    vault.put("a", PLAIN)
    key_file = tmp_path / "vault.key"
    key_file.write_text(key.to_text())
    by_file = VaultSecrets(vault.path, key_file=key_file)
    assert by_file.resolve(SecretRef("a")).reveal() == PLAIN
    by_env = VaultSecrets(vault.path, key_env="MY_KEY", environ={"MY_KEY": key.to_text()})
    assert by_env.resolve(SecretRef("a")).reveal() == PLAIN


def test_secret_error_is_an_unskit_error() -> None:
    assert issubclass(SecretError, UnskitError)


# -- retained versions (managed trust stores: old and new roots during a rollover) -----------


def test_versions_are_kept_only_when_asked(vault: Vault) -> None:
    vault.put("trust", "root-1")
    vault.put("trust", "root-2")
    assert vault.versions("trust") == ["root-2"], "a plain put replaces"
    vault.put("trust", "root-3", keep_versions=2)
    vault.put("trust", {"caPem": "root-4"}, keep_versions=2)
    assert vault.versions("trust") == [{"caPem": "root-4"}, "root-3", "root-2"]
    vault.put("trust", "root-5", keep_versions=2)
    assert vault.versions("trust") == ["root-5", {"caPem": "root-4"}, "root-3"], "at most 2"
    assert vault.get("trust") == "root-5"


def test_putting_the_same_value_again_keeps_no_duplicate(vault: Vault) -> None:
    vault.put("trust", "root-1")
    vault.put("trust", "root-2", keep_versions=3)
    vault.put("trust", "root-2", keep_versions=3)
    assert vault.versions("trust") == ["root-2", "root-1"]


def test_retire_versions_and_delete(vault: Vault, key: VaultKey) -> None:
    vault.put("trust", "root-1")
    vault.put("trust", "root-2", keep_versions=1)
    assert Vault(vault.path, key).versions("trust") == ["root-2", "root-1"], "persisted"
    assert vault.retire_versions("trust") == 1
    assert vault.retire_versions("trust") == 0
    assert vault.versions("trust") == ["root-2"]
    vault.put("trust", "root-3", keep_versions=1)
    assert vault.delete("trust")
    vault.put("trust", "root-4")
    assert vault.versions("trust") == ["root-4"], "delete drops the history too"
    with pytest.raises(SecretError, match="no secret named"):
        vault.versions("nothing")
    with pytest.raises(SecretError, match="keep_versions"):
        vault.put("trust", "x", keep_versions=-1)


def test_a_vault_written_before_versions_reads_and_gains_history(
    vault: Vault, key: VaultKey
) -> None:
    # The format before versions: {"secrets": {...}} only, same header and file version.
    header = {"format": "unskit-vault", "version": 1, "cipher": "AES-256-GCM", "keyId": key.key_id}
    nonce = os.urandom(12)
    aad = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    plain = json.dumps({"secrets": {"trust": "root-1"}}).encode()
    sealed = key.aead().encrypt(nonce, plain, aad)
    document = {
        **header,
        "nonce": base64.b64encode(nonce).decode(),
        "ciphertext": base64.b64encode(sealed).decode(),
    }
    vault.path.write_text(json.dumps(document))
    assert vault.versions("trust") == ["root-1"]
    vault.put("trust", "root-2", keep_versions=1)
    assert vault.versions("trust") == ["root-2", "root-1"]
    outer = json.loads(vault.path.read_text())
    assert outer["version"] == 1, "the file version is unchanged"
    payload = json.loads(
        key.aead().decrypt(
            base64.b64decode(outer["nonce"]),
            base64.b64decode(outer["ciphertext"]),
            json.dumps(
                {k: outer[k] for k in header}, sort_keys=True, separators=(",", ":")
            ).encode(),
        )
    )
    assert payload["secrets"] == {"trust": "root-2"}, "an older reader still finds the value"
