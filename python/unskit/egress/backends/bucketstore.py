"""The `bucketstore` backend: Google Cloud Storage's JSON API through `requests` (the only
module that imports it). A file up to chunkBytes is one media upload; a larger one a
resumable upload whose session URI is recorded before the first byte goes out and whose
committed offset is recorded after every chunk, so a restart asks the server how far the
session got and continues it. Verified by comparing the source's CRC32C with the object's
crc32c metadata (and, with SHA256, by reading the object back and hashing it)."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import secrets
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import requests

from unskit.config.secrets import Secret, SecretRef, SecretResolver, resolve_value
from unskit.egress.backends import Outcome, Transfer
from unskit.egress.backends.objectrules import object_key
from unskit.egress.backends.remote import hash_prefix
from unskit.egress.verify import HASH_CHUNK, Algorithm, Digest, b64, new_digest
from unskit.errors import (
    DestinationError,
    SourceChangedError,
    TransferInterruptedError,
    VerificationError,
)

__all__ = [
    "CHUNK_UNIT",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_ENDPOINT",
    "BucketStoreBackend",
    "chunk_bytes",
    "committed_offset",
]

_log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
#: Resumable chunks other than the last must be a multiple of this (the API's rule).
CHUNK_UNIT = 256 * 1024
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
#: Connect and read timeout of every request, seconds.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 120.0
RESUME_INCOMPLETE = 308
# The session URI is a bearer capability for the upload: never in a message or a log.
_SESSION_ID = re.compile(r"(upload_id=)[^&\s'\")]+")


def chunk_bytes(value: int | None) -> int:
    """chunkBytes rounded down to a multiple of 256 KiB (at least one unit)."""
    wanted = DEFAULT_CHUNK_BYTES if value is None else int(value)
    return max(CHUNK_UNIT, wanted - wanted % CHUNK_UNIT)


def committed_offset(reply: requests.Response) -> int:
    """The bytes a 308 reply says the session holds (its Range header; none means 0)."""
    header = reply.headers.get("Range")
    if not header:
        return 0
    match = re.fullmatch(r"bytes=0-(\d+)", header.strip())
    if match is None:
        raise DestinationError(f"the server sent an unreadable Range header {header!r}")
    return int(match.group(1)) + 1


def _redact(text: str) -> str:
    return _SESSION_ID.sub(r"\1***", text)


def _reason(reply: requests.Response) -> str:
    """Status, reason and the API's error message of a failed reply (bounded)."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        message = str(reply.json()["error"]["message"])
    if not message:
        message = reply.text[:200].strip()
    text = f"{reply.status_code} {reply.reason}"
    return _redact(f"{text}: {message}" if message else text)


@dataclass
class _Stored:
    """What the server reports of a finished object."""

    size: int
    crc32c: str | None
    generation: str | None


class BucketStoreBackend:
    """Delivers into one Cloud Storage bucket (under `prefix`)."""

    def __init__(self, settings: Mapping[str, Any], vault: SecretResolver | None) -> None:
        self.bucket: str = settings["bucket"]
        self.prefix: str = settings.get("prefix", "")
        self.endpoint = str(settings.get("endpointUrl") or DEFAULT_ENDPOINT).rstrip("/")
        self.algorithm = Algorithm(settings.get("checksumAlgorithm", "CRC32C"))
        self.chunk = chunk_bytes(settings.get("chunkBytes"))
        self.anonymous = bool(settings.get("anonymous", False))
        self._token: Secret | None = None
        if not self.anonymous:
            ref = SecretRef.parse(settings.get("credentials"))
            if ref is not None:
                # The field the reference names, else the bundle's accessToken.
                field = ref if ref.field else SecretRef(ref.name, "accessToken")
                self._token = resolve_value(field, vault)
            else:
                value = settings.get("accessToken")
                self._token = resolve_value(SecretRef.parse(value) or value, vault)
        self._http = requests.Session()
        # No proxy or .netrc credentials from the environment: requests go to endpointUrl
        # with our Authorization only. (A Session's adapters do not retry: the pipeline
        # retries, with its backoff.)
        self._http.trust_env = False

    def __repr__(self) -> str:
        return f"BucketStoreBackend(gs://{self.bucket}/{self.prefix}, {self.endpoint})"

    # -- HTTP --------------------------------------------------------------------------------

    def _headers(self, url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        # The token goes only to the configured endpoint, not to a session URI elsewhere.
        if self._token is not None and url.startswith(self.endpoint + "/"):
            headers["Authorization"] = f"Bearer {self._token.reveal()}"
        return headers

    def _request(
        self,
        action: str,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        stream: bool = False,
    ) -> requests.Response:
        try:
            return self._http.request(
                method,
                url,
                headers=self._headers(url, headers),
                data=data,
                stream=stream,
                timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise DestinationError(
                _redact(f"{action} {self._where_bucket()}: {type(exc).__name__}: {exc}")
            ) from exc

    def _where_bucket(self) -> str:
        return f"gs://{self.bucket}"

    def _fail(self, action: str, name: str, reply: requests.Response) -> DestinationError:
        where = f"gs://{self.bucket}/{name}"
        if reply.status_code in (401, 403):
            return DestinationError(
                f"{action} {where}: the credentials were refused ({_reason(reply)})"
            )
        if reply.status_code == 404 and action in ("upload", "start session"):
            return DestinationError(
                f"{action} {where}: bucket {self.bucket!r} not found ({_reason(reply)})"
            )
        return DestinationError(f"{action} {where}: {_reason(reply)}")

    def _upload_url(self, kind: str, name: str) -> str:
        bucket = urllib.parse.quote(self.bucket, safe="")
        query = urllib.parse.urlencode(
            {"uploadType": kind} if kind == "multipart" else {"uploadType": kind, "name": name}
        )
        return f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?{query}"

    def _object_url(self, name: str) -> str:
        bucket = urllib.parse.quote(self.bucket, safe="")
        return f"{self.endpoint}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, transfer: Transfer) -> Outcome:
        """One media upload up to chunkBytes, else a resumable session; then verified."""
        name = object_key(self.prefix, transfer.relative)
        transfer.check_source()
        if transfer.upload_id is None and transfer.size <= self.chunk:
            return self._single(transfer, name)
        return self._resumable(transfer, name)

    def _single(self, transfer: Transfer, name: str) -> Outcome:
        with open(transfer.source, "rb") as source:
            data = source.read(transfer.size + 1)
        if len(data) != transfer.size:
            raise SourceChangedError(f"{transfer.relative}: read {len(data)} of {transfer.size}")
        crc = new_digest(Algorithm.CRC32C)
        crc.update(data)
        digest = self._second_digest()
        if digest is not None:
            digest.update(data)
        if not transfer.throttle.acquire(len(data)):
            raise TransferInterruptedError(f"{transfer.relative}: interrupted")
        # A multipart upload: the metadata carries the CRC32C, so the server refuses an
        # object whose bytes arrived changed (and, unlike a media upload, it takes 0 bytes).
        boundary = secrets.token_hex(16)
        metadata = json.dumps({"name": name, "crc32c": b64(crc.digest())})
        body = b"".join(
            (
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                f"{metadata}\r\n--{boundary}\r\n"
                "Content-Type: application/octet-stream\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            )
        )
        reply = self._request(
            "upload",
            "POST",
            self._upload_url("multipart", name),
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
            data=body,
        )
        if reply.status_code not in (200, 201):
            raise self._fail("upload", name, reply)
        transfer.journal.sent(len(data))
        transfer.check_source()
        self._verify(transfer, name, self._stored(reply, name), crc.digest(), digest)
        return Outcome(0, len(data), {"bucket": self.bucket, "object": name})

    def _second_digest(self) -> Digest | None:
        return new_digest(Algorithm.SHA256) if self.algorithm is Algorithm.SHA256 else None

    def _resumable(self, transfer: Transfer, name: str) -> Outcome:
        session = transfer.upload_id
        offset = 0
        if session is not None:
            reply = self._query(session, transfer.size, name)
            if reply is None:
                done = self._finished_before(transfer, name)
                if done is not None:
                    return done
                # An expired session, or a server that lost it (restarted): its bytes are gone.
                _log.warning(
                    "%s: the resumable session is no longer known to the server; "
                    "starting the upload again from 0",
                    name,
                )
                session = None
                transfer.journal.upload(None)
                transfer.journal.offset(0)
            elif reply.status_code in (200, 201):
                return self._completed_before(transfer, name, reply)
            else:
                offset = self._committed(transfer, reply)
                if offset > transfer.size:
                    self._forget(transfer)
                    raise DestinationError(
                        f"resume gs://{self.bucket}/{name}: the server reports {offset} bytes "
                        f"committed of a {transfer.size}-byte file; starting a new session"
                    )
                if offset:
                    _log.info(
                        "%s: resuming the session at %d of %d bytes", name, offset, transfer.size
                    )
        if session is None:
            session = self._start(name, transfer.size)
            transfer.journal.upload(session)
        crc = new_digest(Algorithm.CRC32C)
        digest = self._second_digest()
        both = _Both(crc, digest)
        resumed = offset
        sent = 0
        with open(transfer.source, "rb", buffering=0) as source:
            if offset:
                hash_prefix(source, both, offset, transfer)
            while True:
                if transfer.cancel.is_set():
                    raise TransferInterruptedError(f"{transfer.relative}: interrupted")
                step = min(self.chunk, transfer.size - offset)
                data = os.pread(source.fileno(), step, offset)
                if len(data) != step:
                    raise SourceChangedError(f"{transfer.relative} shrank while it was sent")
                both.update(data)
                end = offset + step
                last = end == transfer.size
                headers = {
                    "Content-Range": f"bytes {offset}-{end - 1}/{transfer.size}"
                    if step
                    else f"bytes */{transfer.size}"
                }
                if last:
                    # The server refuses to finish the object if the whole differs.
                    headers["X-Goog-Hash"] = f"crc32c={b64(crc.digest())}"
                if not transfer.throttle.acquire(step):
                    raise TransferInterruptedError(f"{transfer.relative}: interrupted")
                reply = self._request("upload chunk", "PUT", session, headers=headers, data=data)
                transfer.journal.sent(step)
                sent += step
                if reply.status_code in (200, 201):
                    if not last:
                        self._forget(transfer)
                        raise DestinationError(
                            f"upload gs://{self.bucket}/{name}: the server finished the object "
                            f"at {end} of {transfer.size} bytes; starting a new session"
                        )
                    break
                if reply.status_code != RESUME_INCOMPLETE:
                    self._chunk_refused(transfer, name, reply)
                committed = self._committed(transfer, reply)
                if not offset <= committed <= end:
                    # Neither what it held before nor what it was sent: the session cannot
                    # be trusted to assemble the file.
                    self._forget(transfer)
                    raise DestinationError(
                        f"upload gs://{self.bucket}/{name}: the server reports {committed} bytes "
                        f"committed after bytes {offset}-{end - 1}; starting a new session"
                    )
                transfer.journal.offset(committed)
                if committed < end:
                    # It kept part of the chunk: the next attempt asks and continues there.
                    raise DestinationError(
                        f"upload gs://{self.bucket}/{name}: the server kept {committed} of "
                        f"{end} bytes; resuming the session"
                    )
                offset = committed
        transfer.check_source()
        stored = self._stored(reply, name)
        transfer.journal.upload(None)
        self._verify(transfer, name, stored, crc.digest(), digest)
        return Outcome(resumed, sent, {"bucket": self.bucket, "object": name})

    def _chunk_refused(self, transfer: Transfer, name: str, reply: requests.Response) -> None:
        if reply.status_code in (404, 410):
            self._forget(transfer)
            raise DestinationError(
                f"upload gs://{self.bucket}/{name}: the session is gone ({_reason(reply)}); "
                "starting a new one"
            )
        if 400 <= reply.status_code < 500 and reply.status_code not in (401, 403, 408, 429):
            # A refused chunk (a wrong offset, a bad range): the session cannot continue.
            self._forget(transfer)
            raise DestinationError(
                f"upload gs://{self.bucket}/{name}: chunk refused ({_reason(reply)}); "
                "starting a new session"
            )
        # Credentials, throttling and server errors: the session stays for the next attempt.
        raise self._fail("upload chunk", name, reply)

    def _committed(self, transfer: Transfer, reply: requests.Response) -> int:
        try:
            return committed_offset(reply)
        except DestinationError as error:
            self._forget(transfer)
            raise DestinationError(
                f"{transfer.relative} to gs://{self.bucket}: {error}; starting a new session"
            ) from error

    def _forget(self, transfer: Transfer) -> None:
        transfer.journal.upload(None)
        transfer.journal.offset(0)

    def _start(self, name: str, size: int) -> str:
        reply = self._request(
            "start session",
            "POST",
            self._upload_url("resumable", name),
            headers={
                "Content-Type": "application/json; charset=UTF-8",
                "X-Upload-Content-Type": "application/octet-stream",
                "X-Upload-Content-Length": str(size),
            },
            data=b"{}",
        )
        location = reply.headers.get("Location")
        if reply.status_code not in (200, 201) or not location:
            raise self._fail("start session", name, reply)
        return location

    def _query(self, session: str, size: int, name: str) -> requests.Response | None:
        """The session's status (308 with its committed range, or 200/201 when finished);
        None when the server no longer knows it."""
        reply = self._request(
            "query session",
            "PUT",
            session,
            headers={"Content-Range": f"bytes */{size}"},
            data=b"",
        )
        if reply.status_code in (404, 410):
            return None
        if reply.status_code not in (200, 201, RESUME_INCOMPLETE):
            raise self._fail("query session", name, reply)
        return reply

    def _completed_before(self, transfer: Transfer, name: str, reply: requests.Response) -> Outcome:
        """The session finished before a crash recorded it: verified, not sent again."""
        crc = new_digest(Algorithm.CRC32C)
        digest = self._second_digest()
        with open(transfer.source, "rb", buffering=0) as source:
            hash_prefix(source, _Both(crc, digest), transfer.size, transfer)
        transfer.check_source()
        stored = self._stored(reply, name)
        transfer.journal.upload(None)
        self._verify(transfer, name, stored, crc.digest(), digest)
        detail = {"bucket": self.bucket, "object": name, "alreadyDelivered": True}
        return Outcome(transfer.size, 0, detail)

    def _finished_before(self, transfer: Transfer, name: str) -> Outcome | None:
        """A session the server no longer knows may have finished the object before a
        crash recorded it (a finished session can be forgotten): the object counts if it
        verifies against the source."""
        reply = self._request("read metadata", "GET", self._object_url(name))
        with reply:
            if reply.status_code == 404:
                return None
            if reply.status_code != 200:
                raise self._fail("read metadata", name, reply)
            try:
                return self._completed_before(transfer, name, reply)
            except VerificationError as error:
                _log.info("%s: not the finished upload (%s); sending again", name, error)
                return None

    # -- verification ------------------------------------------------------------------------

    def _stored(self, reply: requests.Response, name: str) -> _Stored:
        try:
            resource = reply.json()
            return _Stored(
                int(resource["size"]), resource.get("crc32c"), resource.get("generation")
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DestinationError(
                f"upload gs://{self.bucket}/{name}: the reply is not an object resource"
            ) from exc

    def _verify(
        self,
        transfer: Transfer,
        name: str,
        stored: _Stored,
        crc: bytes,
        digest: Digest | None,
    ) -> None:
        where = f"gs://{self.bucket}/{name}"
        if stored.size != transfer.size:
            raise VerificationError(
                f"{where} holds {stored.size} bytes, the source {transfer.size}: "
                "the copy differs from the source"
            )
        if stored.crc32c is None:
            raise VerificationError(f"{where}: the server reports no crc32c for the object")
        expected = base64.b64encode(crc).decode("ascii")
        if stored.crc32c != expected:
            raise VerificationError(
                f"{where}: crc32c {stored.crc32c} differs from the source's {expected}: "
                "the copy differs from the source"
            )
        if digest is not None:
            read = self._read_back(name, stored)
            if read != digest.digest():
                raise VerificationError(
                    f"{where}: SHA256 of the object read back differs from the source's"
                )

    def _read_back(self, name: str, stored: _Stored) -> bytes:
        """SHA-256 of the object as the server returns it (the generation just written)."""
        url = self._object_url(name) + "?alt=media"
        if stored.generation:
            url += f"&generation={stored.generation}"
        digest = new_digest(Algorithm.SHA256)
        with self._request("read back", "GET", url, stream=True) as reply:
            if reply.status_code != 200:
                raise self._fail("read back", name, reply)
            try:
                for block in reply.iter_content(HASH_CHUNK):
                    digest.update(block)
            except requests.RequestException as exc:
                raise DestinationError(
                    f"read back gs://{self.bucket}/{name}: {type(exc).__name__}: {exc}"
                ) from exc
        return digest.digest()

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Cancels an abandoned resumable session (best effort)."""
        if upload_id is None:
            return
        with contextlib.suppress(DestinationError):
            self._request("cancel session", "DELETE", upload_id).close()

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()


class _Both:
    """Feeds the CRC32C and, when there is one, the second digest together."""

    def __init__(self, crc: Digest, other: Digest | None) -> None:
        self.crc = crc
        self.other = other

    def update(self, data: bytes | memoryview) -> None:
        self.crc.update(data)
        if self.other is not None:
            self.other.update(data)

    def digest(self) -> bytes:
        return self.crc.digest()
