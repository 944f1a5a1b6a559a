"""What a configuration document is: a JSON (or YAML) object of sections, parsed strictly
(no duplicate keys, no nesting past the depth limit, UTF-8 only), every failure a
`ConfigError` that names the document."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unskit.config.values import MAX_DEPTH
from unskit.errors import ConfigError, ConfigIssue

__all__ = ["parse_document", "read_document"]

_YAML_SUFFIXES = (".yaml", ".yml")
_DOCUMENT_SUFFIXES = (".json", *_YAML_SUFFIXES)


def parse_document(text: str | bytes, name: str = "<document>") -> dict[str, Any]:
    """Parses JSON (YAML when `name` ends in .yaml/.yml); duplicate keys are refused."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise _error("$", f"is not UTF-8 text (byte {exc.start})", name) from None
    try:
        if name.lower().endswith(_YAML_SUFFIXES):
            document = _parse_yaml(text, name)
        else:
            document = _parse_json(text, name)
    except RecursionError:
        # Both parsers recurse per level; a document this deep is no configuration.
        raise _error("$", f"nests deeper than {MAX_DEPTH} levels", name) from None
    if not isinstance(document, dict):
        kind = "empty" if document is None else f"a {type(document).__name__}"
        raise _error("$", f"must be an object (a document of sections), not {kind}", name)
    return document


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKeyError as exc:
        raise _error(
            "$", f"malformed JSON: key {exc.key!r} appears twice in one object", name
        ) from None
    except json.JSONDecodeError as exc:
        # exc.msg and the position only: the offending text may be a secret.
        hint = (
            " (this looks like YAML: the file name's suffix chooses the parser, so name it "
            ".yaml or .yml)"
            if _looks_like_yaml(text)
            else ""
        )
        raise _error(
            "$", f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}", name
        ) from None


# A YAML mapping line: `key:` at the start, then a value or nothing.
_YAML_KEY_LINE = re.compile(r"^[A-Za-z_$][\w.$-]*:(\s|$)")


def _looks_like_yaml(text: str) -> bool:
    """True when the first meaningful line is a YAML ``key:`` line or document marker."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        return stripped == "---" or bool(_YAML_KEY_LINE.match(stripped))
    return False


def _parse_yaml(text: str, name: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise _error(
            "$", "is YAML, which needs the PyYAML package (pip install pyyaml)", name
        ) from None

    class Loader(yaml.SafeLoader):
        """SafeLoader that keeps dates as strings and refuses duplicate keys."""

    # Only JSON types: a bare 2024-01-01 stays a string, as it would in JSON.
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def mapping(loader: Loader, node: yaml.MappingNode) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, "object keys must be strings", key_node.start_mark
                )
            if key in out:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one object", key_node.start_mark
                )
            out[key] = loader.construct_object(value_node, deep=True)
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise _error("$", f"malformed YAML{where}: {exc.problem}", name) from None
    except yaml.YAMLError:
        raise _error("$", "malformed YAML", name) from None


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads and parses one document file."""
    location = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise _error("$", "the configuration file does not exist", location) from None
    except IsADirectoryError:
        raise _error("$", "is a directory, not a configuration file", location) from None
    except OSError as exc:
        raise _error("$", f"cannot be read: {exc.strerror}", location) from None
    return parse_document(data, location)


def _plain(document: Mapping[str, Any]) -> dict[str, Any]:
    """A private deep copy, so a provider's later mutation cannot change a loaded config."""

    def copy(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): copy(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [copy(item) for item in value]
        return value

    return {str(k): copy(v) for k, v in document.items()}


def _error(path: str, message: str, source: str) -> ConfigError:
    return ConfigError([ConfigIssue(path, message)], source=source)


# -- sources ---------------------------------------------------------------------------------
