"""The encrypted local vault that `$secret` references resolve from.

One file holds every secret, encrypted as a whole with AES-256-GCM (authenticated: a wrong
key or a modified byte fails loudly, never decrypts to garbage). The file is JSON::

    {"format": "unskit-vault", "version": 1, "cipher": "AES-256-GCM",
     "keyId": "<16 hex>", "nonce": "<base64>", "ciphertext": "<base64>"}

The header is bound to the ciphertext as associated data. `keyId` is a one-way fingerprint
of the key, so a wrong key is told apart from a tampered file. A secret is a string or a
bundle (an object of string fields, e.g. certPem/keyPem/caPem). Writes go to a temporary
file that is fsynced and renamed over the vault, then the directory is fsynced.

A secret may keep earlier versions (`put(..., keep_versions=n)`): they sit beside the
secrets table in the encrypted payload as ``{"secrets": {...}, "history": {name: [older,
...]}}``, newest first. The header and file version are unchanged: a vault without history
reads as before, and a reader that predates history still reads the current values.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeAlias, final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from unskit.config.secrets import Secret, SecretRef
from unskit.errors import SecretError
from unskit.files import write_atomically

__all__ = [
    "DEFAULT_KEY_ENV",
    "SecretValue",
    "Vault",
    "VaultKey",
    "VaultSecrets",
]

DEFAULT_KEY_ENV = "UNSKIT_VAULT_KEY"
_FORMAT = "unskit-vault"
_VERSION = 1
_CIPHER = "AES-256-GCM"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_NAME = re.compile(r"^[A-Za-z0-9_.:/@-]{1,256}$")

SecretValue: TypeAlias = str | Mapping[str, str]


@final
class VaultKey:
    """A 256-bit vault key; its `repr` shows only the key id."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            raise SecretError(f"a vault key is {_KEY_BYTES} bytes, not {len(key)}")
        self._key = bytes(key)

    @classmethod
    def generate(cls) -> VaultKey:
        """A fresh random key."""
        return cls(AESGCM.generate_key(bit_length=256))

    @classmethod
    def from_text(cls, text: str) -> VaultKey:
        """Parses a key written as base64 (standard or URL-safe alphabet)."""
        cleaned = text.strip().replace("+", "-").replace("/", "_")
        try:
            raw = base64.b64decode(cleaned, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise SecretError("the vault key is not valid base64") from None
        return cls(raw)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> VaultKey:
        """Reads a key file (base64 text, as `unskit vault keygen` writes it)."""
        try:
            text = Path(path).read_text(encoding="ascii")
        except FileNotFoundError:
            raise SecretError(f"vault key file {os.fspath(path)} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretError(f"vault key file {os.fspath(path)} cannot be read: {exc}") from None
        return cls.from_text(text)

    @classmethod
    def from_env(
        cls, name: str = DEFAULT_KEY_ENV, environ: Mapping[str, str] | None = None
    ) -> VaultKey:
        """Reads a key from an environment variable (base64 text)."""
        env = os.environ if environ is None else environ
        text = env.get(name)
        if not text:
            raise SecretError(f"the vault key variable {name} is not set")
        return cls.from_text(text)

    def to_text(self) -> str:
        """The key as URL-safe base64, the form key files hold."""
        return base64.urlsafe_b64encode(self._key).decode("ascii")

    @property
    def key_id(self) -> str:
        """A one-way fingerprint naming the key without revealing it."""
        return hashlib.sha256(b"unskit-vault key id\0" + self._key).hexdigest()[:16]

    def aead(self) -> AESGCM:
        """The cipher keyed with this key."""
        return AESGCM(self._key)

    def __repr__(self) -> str:
        return f"VaultKey(key_id={self.key_id!r})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("a VaultKey cannot be pickled")


class Vault:
    """An encrypted file of named secrets; a missing file is an empty vault."""

    def __init__(self, path: str | os.PathLike[str], key: VaultKey) -> None:
        self.path = Path(path)
        self._key = key

    def __repr__(self) -> str:
        return f"Vault({os.fspath(self.path)!r}, key_id={self._key.key_id!r})"

    def names(self) -> list[str]:
        """The secret names, sorted; never the values."""
        return sorted(self._read())

    def get(self, name: str) -> SecretValue:
        """The stored value (a string or a bundle); raises `SecretError` if absent."""
        secrets = self._read()
        if name not in secrets:
            raise SecretError(f"vault {self.path} has no secret named {name!r}")
        return secrets[name]

    def resolve(self, ref: SecretRef) -> Secret:
        """The value a `$secret` reference names, as a `Secret`."""
        value = self.get(ref.name)
        if ref.field is None:
            if isinstance(value, str):
                return Secret(value)
            fields = ", ".join(sorted(value))
            raise SecretError(
                f"secret {ref.name!r} is a bundle (fields: {fields}); "
                "the reference must name a field"
            )
        if isinstance(value, str):
            raise SecretError(
                f"secret {ref.name!r} is a plain value and has no field {ref.field!r}"
            )
        if ref.field not in value:
            fields = ", ".join(sorted(value))
            raise SecretError(f"secret {ref.name!r} has no field {ref.field!r} (fields: {fields})")
        return Secret(value[ref.field])

    def put(self, name: str, value: SecretValue, *, keep_versions: int = 0) -> None:
        """Stores (or replaces) a secret, rewriting the vault atomically; with
        `keep_versions` > 0 the replaced value is retained (at most that many old ones)."""
        if not _NAME.match(name):
            raise SecretError(
                f"secret name {name!r} must be 1 to 256 letters, digits or . _ : / @ -"
            )
        if keep_versions < 0:
            raise SecretError(f"keep_versions must be 0 or more, not {keep_versions}")
        stored = _check_value(name, value)
        with self._locked():
            secrets, history = self._read_all()
            previous = secrets.get(name)
            older = history.pop(name, [])
            if keep_versions and previous is not None and previous != stored:
                older = [previous, *older]
            if keep_versions:
                older = [old for old in older if old != stored][:keep_versions]
                if older:
                    history[name] = older
            secrets[name] = stored
            self._write(secrets, history)

    def versions(self, name: str) -> list[SecretValue]:
        """The current value and every retained earlier one, newest first."""
        secrets, history = self._read_all()
        if name not in secrets:
            raise SecretError(f"vault {self.path} has no secret named {name!r}")
        return [secrets[name], *history.get(name, [])]

    def retire_versions(self, name: str, *, keep: int = 0) -> int:
        """Drops retained versions beyond the newest `keep`; returns how many went."""
        with self._locked():
            secrets, history = self._read_all()
            older = history.pop(name, [])
            if older[:keep]:
                history[name] = older[:keep]
            removed = len(older) - len(older[:keep])
            if removed:
                self._write(secrets, history)
            return removed

    def delete(self, name: str) -> bool:
        """Removes a secret and its retained versions; returns whether it was there."""
        with self._locked():
            secrets, history = self._read_all()
            if name not in secrets:
                return False
            del secrets[name]
            history.pop(name, None)
            self._write(secrets, history)
            return True

    # -- file format ----------------------------------------------------------------------

    def _read(self) -> dict[str, SecretValue]:
        return self._read_all()[0]

    def _read_all(self) -> tuple[dict[str, SecretValue], dict[str, list[SecretValue]]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}, {}
        except OSError as exc:
            raise SecretError(f"vault {self.path} cannot be read: {exc.strerror}") from None
        try:
            outer = json.loads(raw)
            header = {k: outer[k] for k in ("format", "version", "cipher", "keyId")}
            nonce = base64.b64decode(outer["nonce"], validate=True)
            ciphertext = base64.b64decode(outer["ciphertext"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise SecretError(f"{self.path} is not an unskit vault file (malformed)") from None
        if header["format"] != _FORMAT or header["cipher"] != _CIPHER:
            raise SecretError(f"{self.path} is not an unskit vault file")
        if header["version"] != _VERSION:
            raise SecretError(f"vault {self.path} has unsupported version {header['version']!r}")
        if header["keyId"] != self._key.key_id:
            raise SecretError(
                f"wrong key for vault {self.path}: it was written with key id {header['keyId']}, "
                f"the key given has id {self._key.key_id}"
            )
        try:
            plain = self._key.aead().decrypt(nonce, ciphertext, _associated_data(header))
        except InvalidTag:
            raise SecretError(
                f"vault {self.path} failed authentication: the file was modified or is corrupt"
            ) from None
        payload = json.loads(plain)
        secrets = payload["secrets"]
        if not isinstance(secrets, dict):
            raise SecretError(f"vault {self.path} has no secrets table")
        history = payload.get("history") or {}
        if not isinstance(history, dict):
            raise SecretError(f"vault {self.path} has a malformed history table")
        return secrets, history

    def _write(
        self,
        secrets: Mapping[str, SecretValue],
        history: Mapping[str, list[SecretValue]] | None = None,
    ) -> None:
        header: dict[str, Any] = {
            "format": _FORMAT,
            "version": _VERSION,
            "cipher": _CIPHER,
            "keyId": self._key.key_id,
        }
        nonce = os.urandom(_NONCE_BYTES)
        payload: dict[str, Any] = {"secrets": dict(secrets)}
        if history:
            payload["history"] = dict(history)
        plain = json.dumps(payload, sort_keys=True).encode()
        ciphertext = self._key.aead().encrypt(nonce, plain, _associated_data(header))
        document = {
            **header,
            "nonce": base64.b64encode(nonce).decode("ascii"),
            "ciphertext": base64.b64encode(ciphertext).decode("ascii"),
        }
        data = (json.dumps(document, indent=2) + "\n").encode()
        # 0600 from the first byte: the ciphertext is never world-readable.
        write_atomically(self.path, data, mode=0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Serialises read-modify-write between processes; the directory is locked so the
        # lock survives the rename that replaces the vault file.
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


class VaultSecrets:
    """A `SecretResolver` over the vault a `credentials` section names; the key is read
    and the vault opened on every `resolve`, so nothing is touched before connect time."""

    def __init__(
        self,
        vault_path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        key_env: str = DEFAULT_KEY_ENV,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.vault_path = Path(vault_path)
        self.key_file = None if key_file is None else Path(key_file)
        self.key_env = key_env
        self._environ = environ

    def __repr__(self) -> str:
        return f"VaultSecrets({os.fspath(self.vault_path)!r})"

    def key(self) -> VaultKey:
        """The vault key: from the key file if one is configured, else the variable."""
        if self.key_file is not None:
            return VaultKey.from_file(self.key_file)
        return VaultKey.from_env(self.key_env, self._environ)

    def vault(self) -> Vault:
        """The vault, opened with the configured key."""
        return Vault(self.vault_path, self.key())

    def resolve(self, ref: SecretRef) -> Secret:
        """The value a `$secret` reference names."""
        return self.vault().resolve(ref)

    def versions(self, name: str) -> list[SecretValue]:
        """A secret's current and retained values, newest first."""
        return self.vault().versions(name)


def _associated_data(header: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(header), sort_keys=True, separators=(",", ":")).encode()


def _check_value(name: str, value: object) -> SecretValue:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return dict(value)
    raise SecretError(f"secret {name!r} must be a string or an object of string fields")
