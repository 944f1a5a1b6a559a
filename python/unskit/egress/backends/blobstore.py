"""The `blobstore` backend: Azure Blob Storage (and Azurite) through azure-storage-blob, the
only module that imports it. A file up to blocks.thresholdBytes is one Put Blob; a larger
one is staged as blocks of blocks.blockSizeBytes, in parallel, each recorded in the state
store under a deterministic block id, so a restart lists the blob's uncommitted blocks and
stages only the missing ones before it commits the block list.

Verification: a single Put Blob is checked by the MD5 the service computed over what it
stored (in its reply) against the source's. Staged blocks carry their MD5, which the service
checks, over plain HTTP (over HTTPS, TLS already guarantees the bytes arrive as sent); after
the commit the source's CRC32C or SHA-256, stored in the blob's metadata, is compared with
the size and the committed block list, and blocks kept from an earlier attempt (never
checked by this one) are read back and re-hashed against the digests recorded when they
were staged."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import logging
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError
from azure.storage.blob import BlobBlock, BlobClient, BlobServiceClient, ExponentialRetry

from unskit.config.secrets import Secret, SecretResolver
from unskit.egress.backends import Outcome, Transfer
from unskit.egress.backends.objectrules import kept_parts, object_key
from unskit.egress.backends.parts import upload_parts
from unskit.egress.backends.remote import bundle_fields
from unskit.egress.config import (
    DEFAULT_BLOB_BLOCK_BYTES,
    DEFAULT_BLOB_THRESHOLD_BYTES,
    connection_string_key,
)
from unskit.egress.records import Part
from unskit.egress.verify import Algorithm, b64, file_digest, new_digest
from unskit.errors import (
    DestinationError,
    SecretError,
    SourceChangedError,
    TransferInterruptedError,
    VerificationError,
)

__all__ = ["MAX_BLOCKS", "BlobStoreBackend", "block_id", "block_tag", "metadata_key"]

_log = logging.getLogger(__name__)

DEFAULT_CONCURRENT_BLOCKS = 4
#: The service's limit of blocks in one committed blob.
MAX_BLOCKS = 50_000
_QUERY = re.compile(r"\?[^\s'\"()]*")

# The SDK logs every request and response at INFO (headers redacted): one line per block
# would drown the component's log. Quieted unless the operator configured it.
_http_log = logging.getLogger("azure.core.pipeline.policies.http_logging_policy")
if _http_log.level == logging.NOTSET:
    _http_log.setLevel(logging.WARNING)


def metadata_key(algorithm: Algorithm) -> str:
    """The blob metadata name holding the source's digest (base64)."""
    return f"unskit{algorithm.value.lower()}"


def block_tag(size: int, mtime_ns: int, block_size: int, algorithm: Algorithm) -> str:
    """What ties block ids to one version of a source file and one block layout."""
    text = f"{size}:{mtime_ns}:{block_size}:{algorithm.value}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def block_id(tag: str, number: int) -> str:
    """The deterministic id of block `number` (1-based); every id of a blob has one length."""
    return base64.b64encode(f"unskit-{tag}-{number:06d}".encode()).decode("ascii")


def _code(exc: HttpResponseError) -> str:
    code = getattr(exc, "error_code", None)
    if code is None and exc.response is not None:
        code = getattr(exc.response, "headers", {}).get("x-ms-error-code")
    return str(getattr(code, "value", code) or exc.reason or "error")


def _error(action: str, where: str, exc: Exception) -> DestinationError:
    if isinstance(exc, HttpResponseError) and exc.status_code is not None:
        # The first line of the message: the service's reason, without the XML body.
        reason = (exc.message or "").strip().splitlines()
        detail = f" {reason[0]}" if reason else ""
        return DestinationError(f"{action} {where}: {_code(exc)} (HTTP {exc.status_code}){detail}")
    # A connection error quotes the request URL, whose query may hold a SAS signature.
    text = _QUERY.sub("?...", str(exc))
    return DestinationError(f"{action} {where}: {type(exc).__name__}: {text}")


def _account_key(settings: Mapping[str, Any], secrets: SecretResolver | None) -> Secret | None:
    fields = bundle_fields(settings, secrets, ("accountKey", "connectionString"))
    if fields["accountKey"] is not None:
        return fields["accountKey"]
    text = fields["connectionString"]
    if text is None:
        return None  # anonymous: a public container, or a SAS in endpointUrl
    key = connection_string_key(text.reveal())
    if key is None:
        raise SecretError("the blobstore connectionString holds no AccountKey=...")
    return Secret(key)


class BlobStoreBackend:
    """Delivers into one container (under `prefix`) of one storage account."""

    def __init__(self, settings: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.account: str = settings["account"]
        self.container: str = settings["container"]
        self.prefix: str = settings.get("prefix", "")
        self.algorithm = Algorithm(settings.get("checksumAlgorithm", "CRC32C"))
        blocks = settings.get("blocks") or {}
        self.threshold = int(blocks.get("thresholdBytes", DEFAULT_BLOB_THRESHOLD_BYTES))
        self.block_size = int(blocks.get("blockSizeBytes", DEFAULT_BLOB_BLOCK_BYTES))
        self.concurrency = int(blocks.get("maxConcurrentBlocks", DEFAULT_CONCURRENT_BLOCKS))
        endpoint = settings.get("endpointUrl") or f"https://{self.account}.blob.core.windows.net"
        self._block_md5 = not endpoint.lower().startswith("https://")
        key = _account_key(settings, secrets)
        credential = (
            None if key is None else {"account_name": self.account, "account_key": key.reveal()}
        )
        # A few quick retries inside one request ride out a blip; the destination's own
        # backoff (the pipeline's retry policy) handles anything longer.
        retry = ExponentialRetry(
            initial_backoff=1, increment_base=2, retry_total=2, random_jitter_range=1
        )
        try:
            self._service = BlobServiceClient(
                endpoint,
                credential=credential,
                retry_policy=retry,
                # Put Blob for everything up to the threshold: the SDK must not split it.
                max_single_put_size=max(self.threshold, 64 * 1024 * 1024),
                connection_timeout=20,
                read_timeout=120,
                # A private CA (Azure Stack Edge, an emulator with its own certificate);
                # the certificate and host name are always verified.
                connection_verify=settings.get("caPath", True),
            )
        except (AzureError, ValueError) as exc:
            raise _error("blobstore", self._where(""), exc) from exc
        self._client = self._service.get_container_client(self.container)
        self._metadata = metadata_key(self.algorithm)
        self._hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="egress-hash")

    def __repr__(self) -> str:
        return f"BlobStoreBackend(account={self.account!r}, container={self.container!r})"

    def _where(self, name: str) -> str:
        # Never the endpoint URL: it may carry a SAS token.
        return f"blob {self.account}/{self.container}/{name}"

    def _call(self, action: str, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except AzureError as exc:
            raise _error(action, self._where(name), exc) from exc

    def deliver(self, transfer: Transfer) -> Outcome:
        """One Put Blob up to thresholdBytes, else resumable staged blocks; then verified."""
        name = object_key(self.prefix, transfer.relative)
        transfer.check_source()
        blob = self._client.get_blob_client(name)
        if transfer.size <= self.threshold:
            return self._put(transfer, blob, name)
        return self._staged(transfer, blob, name)

    # -- single put ------------------------------------------------------------------------

    def _put(self, transfer: Transfer, blob: BlobClient, name: str) -> Outcome:
        with open(transfer.source, "rb") as source:
            data = source.read(transfer.size + 1)
        if len(data) != transfer.size:
            raise SourceChangedError(f"{transfer.relative}: read {len(data)} of {transfer.size}")
        digest = new_digest(self.algorithm)
        digest.update(data)
        checksum = b64(digest.digest())
        if not transfer.throttle.acquire(len(data)):
            raise TransferInterruptedError(f"{transfer.relative}: interrupted")
        # Hashed while the request is in flight (hashlib releases the GIL).
        md5 = self._hasher.submit(hashlib.md5, data, usedforsecurity=False)
        reply = self._call(
            "put",
            name,
            blob.upload_blob,
            data,
            length=len(data),
            overwrite=True,
            metadata={self._metadata: checksum},
        )
        transfer.journal.sent(len(data))
        transfer.check_source()
        # Put Blob answers with the MD5 the service computed over what it stored: compared
        # with the source's, it proves the content end to end without another request.
        stored = reply.get("content_md5")
        expected = md5.result().digest()
        try:
            if stored is None:
                self._check_properties(blob, name, transfer.size, checksum)
            elif bytes(stored) != expected:
                raise VerificationError(
                    f"{self._where(name)}: the stored MD5 {b64(bytes(stored))} differs from "
                    f"the source's {b64(expected)}"
                )
        except VerificationError:
            self._delete_written(blob, reply)
            raise
        return Outcome(0, len(data), {"blob": name, "container": self.container})

    # -- staged blocks ---------------------------------------------------------------------

    def _staged(self, transfer: Transfer, blob: BlobClient, name: str) -> Outcome:
        count = -(-transfer.size // self.block_size)
        if count > MAX_BLOCKS:
            raise DestinationError(
                f"{self._where(name)}: {transfer.size} bytes need {count} blocks of "
                f"{self.block_size}, over the service's {MAX_BLOCKS}; raise blocks.blockSizeBytes"
            )
        tag = block_tag(transfer.size, transfer.mtime_ns, self.block_size, self.algorithm)
        ids = [block_id(tag, n) for n in range(1, count + 1)]
        recorded: Mapping[int, Part] = transfer.parts
        if transfer.upload_id != tag:
            if transfer.upload_id is not None or recorded:
                transfer.journal.upload(None)  # another layout or version: its parts are void
            recorded = {}
            transfer.journal.upload(tag)
        whole = self._hasher.submit(file_digest, transfer.source, self.algorithm)
        listed: dict[int, tuple[str, int]] = {}
        if recorded:
            committed, uncommitted = self._block_lists(blob, name)
            if not uncommitted and self._committed_matches(committed, ids, recorded, count):
                done = self._completed_before(transfer, blob, name, count, whole.result())
                if done is not None:
                    return done
            numbers = {bid: n for n, bid in enumerate(ids, 1)}
            for block in uncommitted:
                if block["id"] in numbers:
                    listed[numbers[block["id"]]] = (block["id"], int(block["size"]))
        parts, dropped = kept_parts(recorded, listed, count)
        for number in dropped:
            transfer.journal.forget_part(number)
        resumed = sum(part.size for part in parts.values())
        kept = sorted(parts)
        if parts:
            _log.info("%s: resuming with %d of %d blocks already staged", name, len(parts), count)
        todo = [n for n in range(1, count + 1) if n not in parts]

        def stage(number: int, data: bytes, _checksum: bytes) -> str:
            self._call(
                f"block {number}",
                name,
                blob.stage_block,
                ids[number - 1],
                data,
                length=len(data),
                validate_content=self._block_md5,
            )
            return ids[number - 1]

        sent = upload_parts(
            transfer,
            parts,
            todo,
            part_size=self.block_size,
            algorithm=self.algorithm,
            concurrency=self.concurrency,
            thread_prefix="egress-block",
            put=stage,
        )
        transfer.check_source()
        checksum = b64(whole.result())
        reply = self._call(
            "commit",
            name,
            blob.commit_block_list,
            [BlobBlock(block_id=i) for i in ids],
            metadata={self._metadata: checksum},
        )
        try:
            self._verify(transfer, blob, name, ids, parts, kept, checksum)
        except VerificationError:
            self._delete_written(blob, reply)
            raise
        return Outcome(
            resumed,
            sent,
            {
                "blob": name,
                "container": self.container,
                "blocks": count,
                "blocksResumed": len(kept),
            },
        )

    @staticmethod
    def _delete_written(blob: BlobClient, reply: Mapping[str, Any]) -> None:
        """Never leaves a copy known to be wrong in place (only the version just written)."""
        with contextlib.suppress(AzureError):
            blob.delete_blob(etag=reply.get("etag"), match_condition=MatchConditions.IfNotModified)

    def _block_lists(self, blob: BlobClient, name: str) -> tuple[list[BlobBlock], list[BlobBlock]]:
        try:
            committed, uncommitted = blob.get_block_list("all")
        except ResourceNotFoundError as exc:
            if _code(exc) == "BlobNotFound":
                return [], []
            raise _error("list blocks", self._where(name), exc) from exc
        except AzureError as exc:
            raise _error("list blocks", self._where(name), exc) from exc
        return list(committed), list(uncommitted)

    @staticmethod
    def _committed_matches(
        committed: list[BlobBlock], ids: list[str], recorded: Mapping[int, Part], count: int
    ) -> bool:
        if sorted(recorded) != list(range(1, count + 1)):
            return False
        return [(b["id"], int(b["size"])) for b in committed] == [
            (ids[n - 1], recorded[n].size) for n in range(1, count + 1)
        ]

    def _completed_before(
        self, transfer: Transfer, blob: BlobClient, name: str, count: int, whole: bytes
    ) -> Outcome | None:
        """Every block was recorded and the blob holds exactly them, committed: a crash after
        the commit and before the verification was recorded. It counts if it verifies."""
        ids = [transfer.parts[n].etag for n in range(1, count + 1)]
        try:
            self._verify(
                transfer,
                blob,
                name,
                ids,
                dict(transfer.parts),
                list(range(1, count + 1)),
                b64(whole),
            )
        except (VerificationError, DestinationError) as error:
            _log.info("%s: not the committed upload (%s); sending again", name, error)
            return None
        return Outcome(
            transfer.size,
            0,
            {
                "blob": name,
                "container": self.container,
                "blocks": count,
                "blocksResumed": count,
                "alreadyDelivered": True,
            },
        )

    # -- verification ----------------------------------------------------------------------

    def _check_properties(self, blob: BlobClient, name: str, size: int, checksum: str) -> None:
        props = self._call("verify", name, blob.get_blob_properties)
        where = self._where(name)
        if int(props.size) != size:
            raise VerificationError(f"{where}: {props.size} bytes stored, {size} sent")
        stored = (props.metadata or {}).get(self._metadata)
        if stored != checksum:
            raise VerificationError(
                f"{where}: stored {self.algorithm.value} {stored} differs from the source's "
                f"{checksum}"
            )

    def _verify(
        self,
        transfer: Transfer,
        blob: BlobClient,
        name: str,
        ids: list[str],
        parts: Mapping[int, Part],
        reread: list[int],
        checksum: str,
    ) -> None:
        where = self._where(name)
        self._check_properties(blob, name, transfer.size, checksum)
        committed, _ = self._block_lists(blob, name)
        want = [(ids[n - 1], parts[n].size) for n in range(1, len(ids) + 1)]
        if [(b["id"], int(b["size"])) for b in committed] != want:
            raise VerificationError(f"{where}: the committed block list is not the one sent")
        for number in reread:
            part = parts[number]
            start = (number - 1) * self.block_size
            stream = self._call(
                f"read block {number}", name, blob.download_blob, offset=start, length=part.size
            )
            data = self._call(f"read block {number}", name, stream.readall)
            digest = new_digest(self.algorithm)
            digest.update(data)
            if digest.digest() != part.checksum:
                raise VerificationError(
                    f"{where}: block {number} (bytes {start}..{start + part.size}) differs from "
                    "the source"
                )

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Drops the staged blocks of an abandoned delivery when no committed blob holds the
        name (committing an empty list, then deleting it); else the next commit drops them."""
        if upload_id is None:
            return
        with contextlib.suppress(AzureError, ValueError):
            blob = self._client.get_blob_client(object_key(self.prefix, relative))
            try:
                blob.get_blob_properties()
                return
            except ResourceNotFoundError:
                pass
            blob.commit_block_list([])
            blob.delete_blob()

    def close(self) -> None:
        """Closes the client's connection pool."""
        self._hasher.shutdown(wait=False)
        with contextlib.suppress(Exception):
            self._service.close()
