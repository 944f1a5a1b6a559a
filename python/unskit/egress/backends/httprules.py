"""What the `http` backend decides without requests: the URL a file goes to (the
source-relative path percent-encoded onto the destination's), the digest a reply's
`Repr-Digest` or `Digest` header reports, and what a destination's backends learned of its
server (whether it writes at an offset, whether a HEAD reports the digest), shared by its
workers so that one finding applies to every connection."""

from __future__ import annotations

import base64
import contextlib
import threading
import weakref
from collections.abc import Mapping
from pathlib import PurePosixPath
from urllib.parse import quote, urlsplit, urlunsplit

from unskit.egress.backends import safe_relative
from unskit.egress.verify import Algorithm

__all__ = ["target_url"]

#: The digest-field names of each algorithm (RFC 9530 and RFC 3230 share them).
_DIGEST_NAMES = {Algorithm.SHA256: "sha-256", Algorithm.CRC32C: "crc32c"}


def target_url(base: str, relative: PurePosixPath) -> str:
    """`base` with the source-relative path joined onto its path, each segment
    percent-encoded ('..' and absolute paths refused)."""
    rel = str(safe_relative(str(relative)))
    parts = urlsplit(base)
    encoded = "/".join(quote(segment, safe="") for segment in rel.split("/"))
    path = parts.path.rstrip("/") + "/" + encoded
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _reported_digest(headers: Mapping[str, str], algorithm: Algorithm) -> bytes | None:
    """The digest of `algorithm` a `Repr-Digest` (RFC 9530) or `Digest` (RFC 3230) header
    carries, or None."""
    wanted = _DIGEST_NAMES[algorithm]
    for header in ("Repr-Digest", "Digest"):
        for item in (headers.get(header) or "").split(","):
            name, _, value = item.strip().partition("=")
            if name.strip().lower() != wanted:
                continue
            with contextlib.suppress(ValueError):
                return base64.b64decode(value.strip().strip(":"), validate=True)
    return None


class _ServerTraits:
    """What a destination's backends learned of its server, shared by its workers
    (maxConcurrentFiles): one finding, logged once, applies to every connection."""

    def __init__(self, ranges: bool) -> None:
        self.lock = threading.Lock()
        #: False once the server showed it cannot write at an offset: whole-file PUTs.
        self.ranges = ranges
        #: Whether a HEAD reports the digest (None: not known yet); False skips that HEAD.
        self.head_digests: bool | None = None


_TRAITS: weakref.WeakValueDictionary[tuple[str, str, bool], _ServerTraits] = (
    weakref.WeakValueDictionary()
)
_TRAITS_LOCK = threading.Lock()


def _traits_for(url: str, method: str, resumable: bool) -> _ServerTraits:
    with _TRAITS_LOCK:
        traits = _TRAITS.get((url, method, resumable))
        if traits is None:
            traits = _ServerTraits(resumable)
            _TRAITS[(url, method, resumable)] = traits
        return traits
