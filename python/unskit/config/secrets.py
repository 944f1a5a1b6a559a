"""`$secret` references, the `Secret` value type and redaction of logged configuration.

A reference is ``{"$secret": "<vault secret name>", "field": "<optional JSON field>"}``; it
may sit anywhere in a document. Loading never resolves one: a `SecretResolver` (the vault,
see `unskit.config.vault`) turns it into a `Secret` at connect time.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, final

from unskit.config._paths import json_path
from unskit.errors import SecretError

__all__ = [
    "FIELD_KEY",
    "REDACTED",
    "SECRET_KEY",
    "Secret",
    "SecretRef",
    "SecretResolver",
    "find_secret_refs",
    "is_secret_object",
    "is_sensitive_key",
    "redact",
    "resolve_value",
    "secret_objects",
]

REDACTED = "***"
SECRET_KEY = "$secret"
FIELD_KEY = "field"

# Key names whose values are credentials wherever they appear (normalised: lower case,
# separators removed). Paths, labels and env-var names (keyPath, keyLabel, pinEnv) are not.
_SENSITIVE_SUFFIXES = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "accountkey",
    "accesskey",
    "privatekey",
    "connectionstring",
    "pem",
)
_SENSITIVE_EXACT = frozenset({"key", "pin", "credential"})
_NON_ALNUM = re.compile(r"[^a-z0-9]")


@final
class Secret:
    """A secret value; `repr`, `str` and formatting show ``***``, only `reveal()` shows it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"a Secret holds a str, not {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        """Returns the secret value; call it only where the value is handed to a connection."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, spec: str) -> str:
        return format(REDACTED, spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        # Constant time, so comparing a guess leaks nothing through timing.
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    # A hash of the value would be a stable fingerprint of it.
    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Secret:
        return self

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        # Pickling would write the value wherever the pickle goes.
        raise TypeError("a Secret cannot be pickled")


@dataclass(frozen=True)
class SecretRef:
    """A `$secret` reference: a vault secret name and optionally one JSON field of it."""

    name: str
    field: str | None = None

    @staticmethod
    def parse(value: object) -> SecretRef | None:
        """Returns the reference when `value` is a well-formed `$secret` object, else None."""
        if not isinstance(value, Mapping) or SECRET_KEY not in value:
            return None
        if set(value) - {SECRET_KEY, FIELD_KEY}:
            return None
        name = value[SECRET_KEY]
        field = value.get(FIELD_KEY)
        if not isinstance(name, str) or not name:
            return None
        if field is not None and (not isinstance(field, str) or not field):
            return None
        return SecretRef(name, field)

    def to_json(self) -> dict[str, str]:
        """The reference as it is written in a document."""
        out = {SECRET_KEY: self.name}
        if self.field is not None:
            out[FIELD_KEY] = self.field
        return out

    def __str__(self) -> str:
        field = f" field {self.field!r}" if self.field is not None else ""
        return f"$secret {self.name!r}{field}"


class SecretResolver(Protocol):
    """Turns a `$secret` reference into its value (at connect time, never during load)."""

    def resolve(self, ref: SecretRef) -> Secret:
        """Returns the referenced value or raises `SecretError`."""
        ...


def resolve_value(
    value: str | Secret | SecretRef | None, resolver: SecretResolver | None
) -> Secret | None:
    """Gives a credential field's value as a `Secret`, resolving a reference if it is one."""
    if value is None or isinstance(value, Secret):
        return value
    if isinstance(value, str):
        return Secret(value)
    if resolver is None:
        raise SecretError(f"{value} cannot be resolved: the configuration has no vault")
    return resolver.resolve(value)


def is_sensitive_key(name: str) -> bool:
    """True for key names that hold credentials (password, token, privateKey, keyPem, ...)."""
    plain = _NON_ALNUM.sub("", name.lower())
    return plain in _SENSITIVE_EXACT or plain.endswith(_SENSITIVE_SUFFIXES)


def is_secret_object(value: object) -> bool:
    """True for any object carrying a `$secret` key, well-formed or not."""
    return isinstance(value, Mapping) and SECRET_KEY in value


def find_secret_refs(document: object) -> list[tuple[str, SecretRef]]:
    """Every well-formed `$secret` reference in a document, with its JSON path."""
    found: list[tuple[str, SecretRef]] = []
    for parts, value in _walk(document, ()):
        ref = SecretRef.parse(value)
        if ref is not None:
            found.append((json_path(parts), ref))
    return found


def secret_objects(document: object) -> Iterator[tuple[tuple[str | int, ...], Mapping[str, Any]]]:
    """Every object carrying a `$secret` key (well-formed or not), with its path parts."""
    for parts, value in _walk(document, ()):
        if is_secret_object(value):
            assert isinstance(value, Mapping)
            yield parts, value


def _walk(
    value: object, parts: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], object]]:
    yield parts, value
    if is_secret_object(value):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, (*parts, str(key)))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(item, (*parts, index))


def redact(document: Any) -> Any:
    """A copy fit for logs: `$secret` references, `Secret`s and credential fields are ``***``."""
    if isinstance(document, Secret) or is_secret_object(document):
        return REDACTED
    if isinstance(document, Mapping):
        out: dict[str, Any] = {}
        for key, value in document.items():
            name = str(key)
            if value is not None and is_sensitive_key(name):
                out[name] = REDACTED
            else:
                out[name] = redact(value)
        return out
    if isinstance(document, (list, tuple)):
        return [redact(item) for item in document]
    return document
