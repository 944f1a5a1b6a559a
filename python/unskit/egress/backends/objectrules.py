"""What the `objectstore` backend decides without its SDK: the object key of a file, the
credentials it signs with, which recorded parts of a multipart upload still count, and
whether what the store reports is the object that was sent."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from unskit.config.secrets import Secret, SecretRef, SecretResolver, resolve_value
from unskit.egress.backends import safe_relative
from unskit.egress.records import Part
from unskit.egress.verify import Algorithm, b64
from unskit.errors import SecretError, VerificationError

__all__ = [
    "CHECKSUM_FIELD",
    "CREDENTIAL_FIELDS",
    "check_put_reply",
    "check_stored",
    "credentials",
    "kept_parts",
    "object_key",
]

#: The request and reply field that carries each flexible checksum.
CHECKSUM_FIELD = {Algorithm.CRC32C: "ChecksumCRC32C", Algorithm.SHA256: "ChecksumSHA256"}
CREDENTIAL_FIELDS = ("accessKeyId", "secretAccessKey", "sessionToken")


def object_key(prefix: str, relative: PurePosixPath) -> str:
    """The object key: the prefix, a '/' unless it ends with one, then the relative path."""
    rel = str(safe_relative(str(relative)))
    if not prefix:
        return rel
    return prefix + rel if prefix.endswith("/") else f"{prefix}/{rel}"


def credentials(value: object, secrets: SecretResolver | None) -> dict[str, Secret | None] | None:
    """The access key fields from `credentials` (a `$secret` bundle or a mapping of
    fields); None for the ambient provider chain."""
    if value is None:
        return None  # the ambient provider chain (environment, profile, instance role)
    ref = SecretRef.parse(value)
    if ref is not None:
        # A bundle secret: each field resolved by name; sessionToken is optional.
        resolved: dict[str, Secret | None] = {}
        for name in CREDENTIAL_FIELDS:
            try:
                resolved[name] = resolve_value(SecretRef(ref.name, name), secrets)
            except SecretError:
                if name == "sessionToken":
                    resolved[name] = None
                    continue
                raise
        return resolved
    assert isinstance(value, Mapping)
    return {
        name: resolve_value(SecretRef.parse(value.get(name)) or value.get(name), secrets)
        for name in CREDENTIAL_FIELDS
    }


def kept_parts(
    recorded: Mapping[int, Part], listed: Mapping[int, tuple[str, int]], count: int
) -> tuple[dict[int, Part], list[int]]:
    """The recorded parts the store lists with the same tag and size (of `count` parts),
    and the numbers of the recorded parts that do not count."""
    kept: dict[int, Part] = {}
    dropped: list[int] = []
    for number, part in recorded.items():
        if listed.get(number) == (part.etag, part.size) and number <= count:
            kept[number] = part
        else:
            dropped.append(number)
    return kept, dropped


def check_put_reply(
    where: str, algorithm: Algorithm, reply: Mapping[str, Any], checksum: bytes, md5: str
) -> None:
    """A single PUT is verified from its reply, without another round trip: the entity
    tag is the MD5 the store computed over the bytes it stored, and the flexible
    checksum, when echoed, is the one it validated."""
    etag = str(reply.get("ETag", "")).strip('"')
    if etag != md5:
        raise VerificationError(f"{where}: entity tag {etag}, the source's MD5 is {md5}")
    echoed = reply.get(CHECKSUM_FIELD[algorithm])
    if echoed is not None and echoed != b64(checksum):
        raise VerificationError(
            f"{where}: stored {algorithm.value} {echoed} differs from the source's {b64(checksum)}"
        )


def check_stored(
    where: str,
    algorithm: Algorithm,
    head: Mapping[str, Any],
    size: int,
    checksum: bytes,
    written_etag: str,
    expected_etag: str | None,
) -> None:
    """VerificationError unless the object's HEAD shows the size, checksum and entity tag
    that were sent."""
    if int(head.get("ContentLength", -1)) != size:
        raise VerificationError(f"{where}: {head.get('ContentLength')} bytes stored, {size} sent")
    stored = head.get(CHECKSUM_FIELD[algorithm])
    if stored is None:
        raise VerificationError(f"{where}: the store reports no {algorithm.value}")
    # A composite value may carry a "-<parts>" suffix; the digest is before it.
    if stored.split("-")[0] != b64(checksum):
        raise VerificationError(
            f"{where}: stored {algorithm.value} {stored} differs from the source's {b64(checksum)}"
        )
    etag = str(head.get("ETag", "")).strip('"')
    if etag != written_etag.strip('"'):
        raise VerificationError(f"{where}: entity tag {etag} is not the one written")
    if expected_etag is not None and etag != expected_etag:
        raise VerificationError(f"{where}: entity tag {etag}, expected {expected_etag}")
