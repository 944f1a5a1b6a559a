"""The `http` backend through requests (the only module that imports it).

PUT (resumable, the default): the file goes to `url` + the percent-encoded source-relative
path in `chunkBytes` requests, the first a plain PUT (it creates or truncates the object),
each later one a PUT with `Content-Range: bytes a-b/size` (the ranged-upload convention
Apache mod_dav_fs honours); the offset is recorded after each. A resumed delivery asks the
server how much it holds (HEAD, Content-Length) and continues from the smaller of that and
the recorded offset. A server that refuses ranged PUTs, or answers one but does not grow
the object, gets whole-file PUTs from then on (logged once). POST (and `resumable: false`)
sends the file in one request. The copy is verified against the source's digest: a
`Repr-Digest`/`Digest` header of the algorithm when the server gives one, else a ranged GET
read back and re-hashed.

This module holds `HttpBackend`; what it decides without requests is in `httprules.py` and
the bytes of a delivery (request body, read-back) in `httpstreams.py`; `target_url` is
re-exported here."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from unskit.config.secrets import Secret, SecretRef, SecretResolver, resolve_value
from unskit.egress.backends import Outcome, Transfer
from unskit.egress.backends.httprules import (
    _DIGEST_NAMES,
    _reported_digest,
    _traits_for,
    target_url,
)
from unskit.egress.backends.httpstreams import _Body, _ReadBack, _Sent
from unskit.egress.backends.remote import CHUNK, bundle_fields, hash_prefix
from unskit.egress.verify import Algorithm, Digest, new_digest
from unskit.errors import DestinationError, EgressError, VerificationError

__all__ = ["DEFAULT_CHUNK_BYTES", "HttpBackend", "target_url"]

_log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
#: Connect timeout, and the longest wait for a byte of a reply, seconds.
TIMEOUT = 30.0
_CREDENTIAL_FIELDS = ("bearerToken", "username", "password")
#: Answers to a ranged PUT that mean the server cannot write at an offset (RFC 9110 says
#: 400 for a Content-Range it does not support).
_NO_RANGES = frozenset({400, 411, 416, 501})
#: Socket send size: urllib3's 16 KiB default costs a Python call per 16 KiB.
_BLOCK = 256 * 1024


class _BlockAdapter(HTTPAdapter):
    """requests' adapter with a larger socket send size for request bodies."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("blocksize", _BLOCK)
        super().init_poolmanager(*args, **kwargs)


class HttpBackend:
    """Delivers to one HTTP(S) endpoint by PUT (resumable) or POST (single shot)."""

    def __init__(self, settings: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.url: str = settings["url"]
        parts = urlsplit(self.url)
        # Host and port only: never the user information a URL could carry.
        port = f":{parts.port}" if parts.port else ""
        self.where = f"{parts.scheme}://{parts.hostname}{port}"
        self.method: str = settings.get("method", "PUT")
        self.resumable = bool(settings.get("resumable", True)) and self.method == "PUT"
        self.chunk_bytes = int(settings.get("chunkBytes", DEFAULT_CHUNK_BYTES))
        self.algorithm = Algorithm(settings.get("checksumAlgorithm", Algorithm.CRC32C))
        credentials = bundle_fields(settings, secrets, _CREDENTIAL_FIELDS)
        self._headers: dict[str, Secret] = {}
        for name, value in (settings.get("headers") or {}).items():
            resolved = resolve_value(SecretRef.parse(value) or value, secrets)
            if resolved is not None:
                self._headers[name] = resolved
        token = credentials["bearerToken"]
        if token is not None:
            self._headers["Authorization"] = Secret(f"Bearer {token.reveal()}")
        username = credentials["username"]
        password = credentials["password"]
        self._basic: tuple[Secret, Secret] | None = None
        if username is not None:
            self._basic = (username, password or Secret(""))
        self._session: requests.Session | None = None
        self._reader: requests.Session | None = None
        self._traits = _traits_for(self.url, self.method, self.resumable)
        #: Collections made (or found) by MKCOL; forgotten when a PUT finds one missing.
        self._collections: set[str] = set()

    def __repr__(self) -> str:
        return f"HttpBackend({self.where}, method={self.method}, resumable={self._traits.ranges})"

    # -- connection ------------------------------------------------------------------------

    def _new_session(self) -> requests.Session:
        session = requests.Session()
        session.mount("http://", _BlockAdapter())
        session.mount("https://", _BlockAdapter())
        session.trust_env = False  # no proxy or .netrc credentials from the environment
        if self._basic is not None:
            session.auth = (self._basic[0].reveal(), self._basic[1].reveal())
        return session

    def _connect(self, *, reader: bool = False) -> requests.Session:
        """The uploads' session, or with `reader` the one the read-back thread uses."""
        if reader:
            if self._reader is None:
                self._reader = self._new_session()
            return self._reader
        if self._session is None:
            self._session = self._new_session()
        return self._session

    def close(self) -> None:
        """Closes the pooled connections."""
        sessions = (self._session, self._reader)
        self._session = self._reader = None
        for session in sessions:
            if session is not None:
                with contextlib.suppress(Exception):
                    session.close()

    def _request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        reader: bool = False,
        **kwargs: Any,
    ) -> requests.Response:
        merged = {name: value.reveal() for name, value in self._headers.items()}
        merged.update(headers or {})
        session = self._connect(reader=reader)
        return session.request(method, url, headers=merged, timeout=TIMEOUT, **kwargs)

    def _fail(self, response: requests.Response, what: str, path: str) -> DestinationError:
        status = response.status_code
        if status == 409 and what == "PUT":
            # A collection above the target is gone: the next attempt makes it again.
            self._collections.clear()
            return DestinationError(
                f"{self.where}: {path}: PUT refused: HTTP 409 {response.reason} "
                "(a parent collection is missing)"
            )
        hint = " (check the credentials)" if status in (401, 403) else ""
        return DestinationError(
            f"{self.where}: {path}: {what} refused: HTTP {status} {response.reason}{hint}"
        )

    # -- delivery --------------------------------------------------------------------------

    def deliver(self, transfer: Transfer) -> Outcome:
        """Sends what is missing, then verifies the whole copy against the source."""
        url = target_url(self.url, transfer.relative)
        path = urlsplit(url).path
        transfer.check_source()
        try:
            if self.method == "POST":
                return self._post(transfer, url, path)
            return self._put(transfer, url, path)
        except EgressError:
            raise
        except requests.RequestException as exc:
            # A dropped connection leaves the pool in an unknown state: start afresh.
            self.close()
            raise DestinationError(f"{self.where}: {path}: {type(exc).__name__}: {exc}") from exc

    def _head(self, url: str, path: str) -> int | None:
        """The size the server reports for `url`; None when it has nothing there."""
        with self._request("HEAD", url) as response:
            if response.status_code == 404:
                return None
            if response.status_code in (401, 403) or response.status_code >= 500:
                raise self._fail(response, "HEAD", path)
            if not response.ok:
                return None
            length = response.headers.get("Content-Length")
            return int(length) if length is not None and length.isdigit() else None

    def _make_collections(self, transfer: Transfer) -> None:
        """Creates the WebDAV collections above the target (MKCOL), each once per backend;
        a server without WebDAV answers 405 or 501 and is expected to create parents."""
        parents = list(transfer.relative.parents)[:-1]  # without the root '.'
        for parent in reversed(parents):
            url = target_url(self.url, parent) + "/"
            if url in self._collections:
                continue
            with self._request("MKCOL", url) as response:
                if response.status_code in (401, 403) or response.status_code >= 500:
                    raise self._fail(response, "MKCOL", urlsplit(url).path)
            self._collections.add(url)

    def _put(self, transfer: Transfer, url: str, path: str) -> Outcome:
        # Only a resumed delivery asks what the server holds: a fresh one starts at 0.
        remote = self._head(url, path) if self._traits.ranges and transfer.offset > 0 else None
        self._make_collections(transfer)
        offset = 0
        if self._traits.ranges and transfer.offset > 0 and remote is not None:
            if remote > transfer.size:
                _log.warning(
                    "%s: %s: the server reports %d bytes, more than the file's %d; starting over",
                    self.where,
                    path,
                    remote,
                    transfer.size,
                )
            else:
                offset = min(transfer.offset, remote)
        with open(transfer.source, "rb", buffering=0) as source:
            digest = new_digest(self.algorithm)
            hash_prefix(source, digest, offset, transfer)
            if self._traits.ranges:
                sent = self._put_ranges(transfer, source, digest, url, path, offset)
            else:
                sent = self._put_whole(transfer, source, digest, url, path)
        self._verify(transfer, url, path, sent.digest.digest(), sent.headers, sent.readback)
        return Outcome(sent.resumed_from, sent.bytes, {"url": url})

    def _put_whole(
        self, transfer: Transfer, source: BinaryIO, digest: Digest, url: str, path: str
    ) -> _Sent:
        """One PUT of the whole file."""
        body = _Body(source, transfer.size, digest, transfer)
        with self._request("PUT", url, data=body) as response:
            if not response.ok:
                raise self._fail(response, "PUT", path)
            return _Sent(0, transfer.size, response.headers, digest)

    def _put_ranges(
        self,
        transfer: Transfer,
        source: BinaryIO,
        digest: Digest,
        url: str,
        path: str,
        offset: int,
    ) -> _Sent:
        """PUTs of `chunkBytes` from `offset`, the offset recorded after each; the object is
        read back behind them unless the server reports digests."""
        readback: list[_ReadBack] = []
        try:
            sent = self._put_chunks(transfer, source, digest, url, path, offset, readback=readback)
        except BaseException:
            for reader in readback:
                reader.stop()
            raise
        if readback and sent.readback is None:  # went whole: verified after the upload
            readback[0].stop()
        return sent

    def _put_chunks(
        self,
        transfer: Transfer,
        source: BinaryIO,
        digest: Digest,
        url: str,
        path: str,
        offset: int,
        *,
        readback: list[_ReadBack],
    ) -> _Sent:
        position = offset
        checked = False
        headers: Mapping[str, str] = {}
        first = True
        # One request even for an empty file; none when everything is there already.
        while position < transfer.size or (first and transfer.size == 0):
            step = min(self.chunk_bytes, transfer.size - position)
            body = _Body(source, step, digest, transfer)
            ranged: dict[str, str] = {}
            if position > 0:
                ranged["Content-Range"] = f"bytes {position}-{position + step - 1}/{transfer.size}"
            with self._request("PUT", url, ranged, data=body) as response:
                if ranged and response.status_code in _NO_RANGES:
                    reason = f"a ranged PUT was answered HTTP {response.status_code}"
                    return self._restart(transfer, source, url, path, reason)
                if not response.ok:
                    raise self._fail(response, "PUT", path)
                headers = response.headers
            position += step
            if ranged and not checked:
                # A server that ignores Content-Range replaces the object with the chunk:
                # the first ranged PUT of a delivery is checked once.
                checked = True
                size = self._head(url, path)
                if size is None or size < position:
                    reason = f"after a ranged PUT up to {position} it reports {size} bytes"
                    return self._restart(transfer, source, url, path, reason)
            transfer.journal.offset(position)
            if first and position < transfer.size and self._reads_back(headers):
                readback.append(_ReadBack(self, url, path, transfer.size))
            if readback:
                readback[0].advance(position)
            first = False
        return _Sent(offset, position - offset, headers, digest, readback[0] if readback else None)

    def _reads_back(self, headers: Mapping[str, str]) -> bool:
        """Whether verification will read the copy back (no digest from the server)."""
        return (
            self._traits.head_digests is not True
            and _reported_digest(headers, self.algorithm) is None
        )

    def _restart(
        self,
        transfer: Transfer,
        source: BinaryIO,
        url: str,
        path: str,
        reason: str,
    ) -> _Sent:
        """The server cannot resume: this and every later file is sent whole from 0."""
        traits = self._traits
        with traits.lock:
            first = traits.ranges
            traits.ranges = False
        if first:
            _log.warning(
                "%s: the server cannot resume uploads (%s); files are sent whole from now on",
                self.where,
                reason,
            )
        transfer.journal.offset(0)
        source.seek(0)
        # A fresh digest: the abandoned attempt's bytes went into the caller's.
        return self._put_whole(transfer, source, new_digest(self.algorithm), url, path)

    def _post(self, transfer: Transfer, url: str, path: str) -> Outcome:
        digest = new_digest(self.algorithm)
        with open(transfer.source, "rb", buffering=0) as source:
            body = _Body(source, transfer.size, digest, transfer)
            with self._request("POST", url, data=body) as response:
                if not response.ok:
                    raise self._fail(response, "POST", path)
                headers = response.headers
        self._verify(transfer, url, path, digest.digest(), headers)
        return Outcome(0, transfer.size, {"url": url})

    # -- verification ----------------------------------------------------------------------

    def _verify(
        self,
        transfer: Transfer,
        url: str,
        path: str,
        expected: bytes,
        headers: Mapping[str, str],
        readback: _ReadBack | None = None,
    ) -> None:
        reported = _reported_digest(headers, self.algorithm)
        source = "reported by the server"
        if readback is not None:
            if reported is None:
                reported = readback.finish()
                source = "read back"
            else:
                readback.stop()
        transfer.check_source()
        if reported is None and self._traits.head_digests is not False:
            want = _DIGEST_NAMES[self.algorithm]
            with self._request(
                "HEAD", url, {"Want-Repr-Digest": f"{want}=9", "Want-Digest": want}
            ) as response:
                if response.ok:
                    reported = _reported_digest(response.headers, self.algorithm)
                    self._traits.head_digests = reported is not None
                    source = "reported by the server"
        if reported is None:
            reported = self._read_back(transfer, url, path)
            source = "read back"
        if reported != expected:
            raise VerificationError(
                f"{self.where}: {path}: the copy's {self.algorithm.value} ({source}) differs "
                "from the source's"
            )

    def _read_back(self, transfer: Transfer, url: str, path: str) -> bytes:
        """The digest of the remote object, read back with one ranged GET."""
        digest = new_digest(self.algorithm)
        self.read_range(url, path, 0, transfer.size, transfer.size, digest, reader=False)
        return digest.digest()

    def read_range(
        self,
        url: str,
        path: str,
        start: int,
        end: int,
        size: int,
        digest: Digest,
        *,
        reader: bool,
    ) -> bool:
        """Feeds bytes start..end-1 of the remote object to `digest` (a ranged GET); False
        when the server answered a part with the whole object (nothing fed). Raises
        VerificationError unless exactly those bytes come back and the object holds `size`
        bytes (a range reaching `size`) or at least `end` (an earlier one)."""
        headers = {"Accept-Encoding": "identity"}
        if end > start:
            headers["Range"] = f"bytes={start}-{end - 1}"
        read = 0
        with self._request("GET", url, headers, reader=reader, stream=True) as response:
            if response.status_code == 404:
                raise VerificationError(f"{self.where}: {path}: the copy is not there")
            if response.status_code == 416:
                raise VerificationError(f"{self.where}: {path} holds fewer than {end} bytes")
            if not response.ok:
                raise self._fail(response, "GET", path)
            if response.status_code == 206:
                first, _, total = response.headers.get("Content-Range", "").partition("/")
                held = int(total) if total.isdigit() else None
                if not first.strip().startswith(f"bytes {start}-"):
                    raise VerificationError(
                        f"{self.where}: {path}: asked for bytes from {start}, got {first!r}"
                    )
                if held is not None and (held < end or (end == size and held != size)):
                    raise VerificationError(
                        f"{self.where}: {path} holds {held} bytes, {size} were sent"
                    )
            elif start > 0 or end < size:
                return False  # a 200 is the whole object, not the range asked for
            for block in response.iter_content(CHUNK):
                digest.update(block)
                read += len(block)
        if read != end - start:
            raise VerificationError(
                f"{self.where}: {path} holds {start + read} bytes, {size} were sent"
            )
        return True

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Deletes the partial or failed copy of an abandoned delivery (best effort)."""
        with contextlib.suppress(EgressError, requests.RequestException):
            url = target_url(self.url, relative)
            with self._request("DELETE", url):
                pass
