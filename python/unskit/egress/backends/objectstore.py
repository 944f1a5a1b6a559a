"""The `objectstore` backend: S3 and S3-compatible stores through boto3 (the only module
that imports it). Small files are one PUT; larger ones a multipart upload whose parts are
recorded as they finish, so a restart lists the upload's parts and sends only the missing
ones. Verified by the flexible checksum (CRC32C or SHA-256, composite for multipart) and
the entity tag."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from unskit.config.secrets import Secret, SecretResolver
from unskit.egress.backends import Outcome, Transfer
from unskit.egress.backends.objectrules import (
    CHECKSUM_FIELD,
    check_put_reply,
    check_stored,
    credentials,
    kept_parts,
    object_key,
)
from unskit.egress.backends.parts import upload_parts
from unskit.egress.config import DEFAULT_MULTIPART_BYTES
from unskit.egress.verify import Algorithm, b64, composite, md5_hex, multipart_etag, new_digest
from unskit.errors import (
    DestinationError,
    SourceChangedError,
    TransferInterruptedError,
    VerificationError,
)

__all__ = ["ObjectStoreBackend", "object_key"]

_log = logging.getLogger(__name__)

DEFAULT_CONCURRENT_PARTS = 4


def _reveal(secret: Secret | None) -> str | None:
    return None if secret is None else secret.reveal()


def _error(action: str, exc: Exception) -> DestinationError:
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        return DestinationError(f"{action}: {error.get('Code')} {error.get('Message')}")
    return DestinationError(f"{action}: {type(exc).__name__}: {exc}")


class ObjectStoreBackend:
    """Delivers into one bucket (under `prefix`)."""

    def __init__(self, settings: Mapping[str, Any], secrets: SecretResolver | None) -> None:
        self.bucket: str = settings["bucket"]
        self.prefix: str = settings.get("prefix", "")
        self.algorithm = Algorithm(settings.get("checksumAlgorithm", "CRC32C"))
        multipart = settings.get("multipart") or {}
        self.threshold = int(multipart.get("thresholdBytes", DEFAULT_MULTIPART_BYTES))
        self.part_size = int(multipart.get("partSizeBytes", DEFAULT_MULTIPART_BYTES))
        self.concurrency = int(multipart.get("maxConcurrentParts", DEFAULT_CONCURRENT_PARTS))
        self.sse: str | None = settings.get("sse")
        self.extra: dict[str, str] = {}
        if "storageClass" in settings:
            self.extra["StorageClass"] = settings["storageClass"]
        if self.sse is not None:
            self.extra["ServerSideEncryption"] = self.sse
        if "kmsKeyId" in settings:
            self.extra["SSEKMSKeyId"] = settings["kmsKeyId"]
        keys = credentials(settings.get("credentials"), secrets)
        config = botocore.config.Config(
            region_name=settings.get("region"),
            max_pool_connections=max(10, self.concurrency + 2),
            # Our own checksum is always sent, so botocore need not compute another.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"mode": "standard", "max_attempts": 3},
            s3={
                "use_accelerate_endpoint": bool(settings.get("accelerate", False)),
                # Unsigned payloads skip the SHA-256 of every body; botocore only does so
                # over TLS (plain HTTP is always signed).
                "payload_signing_enabled": not settings.get("unsignedPayload", False),
            },
        )
        session_args: dict[str, Any] = {}
        if keys is not None:
            session_args = {
                "aws_access_key_id": _reveal(keys["accessKeyId"]),
                "aws_secret_access_key": _reveal(keys["secretAccessKey"]),
                "aws_session_token": _reveal(keys["sessionToken"]),
            }
        try:
            session = boto3.session.Session(**session_args)
            self._s3 = session.client("s3", endpoint_url=settings.get("endpointUrl"), config=config)
        except botocore.exceptions.BotoCoreError as exc:
            raise _error(f"objectstore {self.bucket}", exc) from exc
        self._checksum_field = CHECKSUM_FIELD[self.algorithm]
        self._hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="egress-md5")

    def _call(self, action: str, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._s3, method)(**kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _error(f"{action} s3://{self.bucket}/{kwargs.get('Key', '')}", exc) from exc

    def deliver(self, transfer: Transfer) -> Outcome:
        """One PUT up to thresholdBytes, else a resumable multipart upload; then verified."""
        key = object_key(self.prefix, transfer.relative)
        transfer.check_source()
        if transfer.size <= self.threshold:
            return self._put(transfer, key)
        return self._multipart(transfer, key)

    # -- single PUT ------------------------------------------------------------------------

    def _put(self, transfer: Transfer, key: str) -> Outcome:
        with open(transfer.source, "rb") as source:
            data = source.read(transfer.size + 1)
        if len(data) != transfer.size:
            raise SourceChangedError(f"{transfer.relative}: read {len(data)} of {transfer.size}")
        digest = new_digest(self.algorithm)
        digest.update(data)
        checksum = digest.digest()
        if not transfer.throttle.acquire(len(data)):
            raise TransferInterruptedError(f"{transfer.relative}: interrupted")
        # The MD5 the entity tag is checked against is computed while the PUT is in flight
        # (hashlib releases the GIL), so it costs no time per file.
        md5 = self._hasher.submit(md5_hex, data) if self.sse != "aws:kms" else None
        reply = self._call(
            "put",
            "put_object",
            Bucket=self.bucket,
            Key=key,
            Body=data,
            ChecksumAlgorithm=self.algorithm.value,
            **{self._checksum_field: b64(checksum)},
            **self.extra,
        )
        transfer.journal.sent(len(data))
        transfer.check_source()
        if md5 is None:
            # A KMS entity tag is not the content's MD5: ask the store for its checksum.
            self._verify(transfer, key, checksum, reply.get("ETag", ""), None)
        else:
            where = f"s3://{self.bucket}/{key}"
            check_put_reply(where, self.algorithm, reply, checksum, md5.result())
        return Outcome(0, len(data), {"key": key, "bucket": self.bucket})

    # -- multipart -------------------------------------------------------------------------

    def _multipart(self, transfer: Transfer, key: str) -> Outcome:
        count = -(-transfer.size // self.part_size)
        upload_id = transfer.upload_id
        listed: dict[int, tuple[str, int]] = {}
        if upload_id is not None:
            try:
                listed = self._list_parts(key, upload_id)
            except DestinationError as error:
                if "NoSuchUpload" not in str(error):
                    raise
                done = self._completed_before(transfer, key, count)
                if done is not None:
                    return done
                _log.info("%s: upload %s is gone; starting a new one", key, upload_id)
                upload_id = None
                transfer.journal.upload(None)
        if upload_id is None:
            reply = self._call(
                "create upload",
                "create_multipart_upload",
                Bucket=self.bucket,
                Key=key,
                ChecksumAlgorithm=self.algorithm.value,
                **self.extra,
            )
            upload_id = str(reply["UploadId"])
            transfer.journal.upload(upload_id)
        # A recorded part counts only if the store lists it with the same tag and size.
        parts, dropped = kept_parts(transfer.parts, listed, count)
        for number in dropped:
            transfer.journal.forget_part(number)
        resumed = sum(part.size for part in parts.values())
        if parts:
            _log.info(
                "%s: resuming upload with %d of %d parts already there", key, len(parts), count
            )
        todo = [n for n in range(1, count + 1) if n not in parts]

        def upload(number: int, data: bytes, checksum: bytes) -> str:
            reply = self._call(
                f"part {number}",
                "upload_part",
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm=self.algorithm.value,
                **{self._checksum_field: b64(checksum)},
            )
            return str(reply["ETag"])

        sent = upload_parts(
            transfer,
            parts,
            todo,
            part_size=self.part_size,
            algorithm=self.algorithm,
            concurrency=self.concurrency,
            thread_prefix="egress-part",
            put=upload,
        )
        transfer.check_source()
        ordered = [parts[n] for n in range(1, count + 1)]
        reply = self._call(
            "complete upload",
            "complete_multipart_upload",
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={
                "Parts": [
                    {"PartNumber": p.number, "ETag": p.etag, self._checksum_field: b64(p.checksum)}
                    for p in ordered
                ]
            },
        )
        transfer.journal.upload(None)
        expected = composite(self.algorithm, (p.checksum for p in ordered))
        etag = multipart_etag(p.etag for p in ordered) if self.sse != "aws:kms" else None
        self._verify(transfer, key, expected, reply.get("ETag", ""), etag)
        return Outcome(
            resumed,
            sent,
            {"key": key, "bucket": self.bucket, "parts": count, "partsResumed": count - len(todo)},
        )

    def _completed_before(self, transfer: Transfer, key: str, count: int) -> Outcome | None:
        """Every part was recorded and the upload is gone: a crash after the completion and
        before the verification was recorded. The object counts if it verifies against
        the recorded parts."""
        if sorted(transfer.parts) != list(range(1, count + 1)):
            return None
        ordered = [transfer.parts[n] for n in range(1, count + 1)]
        expected = composite(self.algorithm, (p.checksum for p in ordered))
        etag = multipart_etag(p.etag for p in ordered)
        try:
            self._verify(transfer, key, expected, etag, etag if self.sse != "aws:kms" else None)
        except (VerificationError, DestinationError) as error:
            _log.info("%s: not the completed upload (%s); sending again", key, error)
            return None
        transfer.journal.upload(None)
        return Outcome(
            transfer.size,
            0,
            {
                "key": key,
                "bucket": self.bucket,
                "parts": count,
                "partsResumed": count,
                "alreadyDelivered": True,
            },
        )

    def _list_parts(self, key: str, upload_id: str) -> dict[int, tuple[str, int]]:
        listed: dict[int, tuple[str, int]] = {}
        marker = 0
        while True:
            reply = self._call(
                "list parts",
                "list_parts",
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumberMarker=marker,
            )
            for part in reply.get("Parts", []):
                listed[int(part["PartNumber"])] = (str(part["ETag"]), int(part["Size"]))
            if not reply.get("IsTruncated"):
                return listed
            marker = int(reply["NextPartNumberMarker"])

    # -- verification ----------------------------------------------------------------------

    def _verify(
        self,
        transfer: Transfer,
        key: str,
        checksum: bytes,
        written_etag: str,
        expected_etag: str | None,
    ) -> None:
        head = self._call(
            "verify", "head_object", Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"
        )
        where = f"s3://{self.bucket}/{key}"
        check_stored(
            where, self.algorithm, head, transfer.size, checksum, written_etag, expected_etag
        )

    def discard(self, relative: PurePosixPath, upload_id: str | None) -> None:
        """Aborts an abandoned multipart upload (best effort)."""
        if upload_id is None:
            return
        with contextlib.suppress(DestinationError, ValueError):
            self._call(
                "abort upload",
                "abort_multipart_upload",
                Bucket=self.bucket,
                Key=object_key(self.prefix, relative),
                UploadId=upload_id,
            )

    def close(self) -> None:
        """Closes the client's connection pool."""
        self._hasher.shutdown(wait=False)
        with contextlib.suppress(Exception):
            self._s3.close()
