"""The S3 object store: AWS S3 or any S3-compatible endpoint (MinIO, ...) through boto3.

Invariants:

- One boto3 client, created once from its own ``Session`` and shared by all threads (boto3 clients
  are thread-safe; the default session is not, so it is never used). ``check`` uses a second
  client whose timeouts and retries bound it to about 15 s when the endpoint does not answer.
- ``put_if_absent`` is a ``PutObject`` with ``If-None-Match: *``; the server refuses to overwrite
  (412 PreconditionFailed, or 409 ConditionalRequestConflict while another writer is mid-upload),
  which is reported as False. A server that ignores the header (old moto, some S3-compatible
  stores) silently overwrites: this class does not emulate the condition with a racy HEAD, so
  such servers are unsupported for brokers that share a bucket.
- A 412 that follows an internal retry may mean our own earlier attempt succeeded before its reply
  was lost; then the stored object is read back and, if it is byte-identical to ours, the put
  counts as ours (True).
- Missing keys raise ``ObjectNotFound``; unreachable endpoints, rejected credentials, a missing
  bucket and server-side failures raise ``ObjectStoreUnavailable`` naming endpoint and bucket.
- Every request is bounded: ``timeout`` (``KAFSCALE_S3_TIMEOUT_MS``) to connect and for each
  read of the answer, and two attempts, so a paused or silent endpoint fails a call within about
  twice the timeout. The first such failure opens an ``OutageGate``: later calls fail at once
  until a background probe (``check``) gets an answer again. ``check`` always asks the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from kafscale.outage import OutageGate
from kafscale.storage.objects import (
    DELETE_BATCH,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
# 412: the key exists. 409: another conditional write of the key is in flight; its writer wins.
_NOT_WRITTEN = {"PreconditionFailed", "412", "ConditionalRequestConflict"}
_REJECTED = {
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "AllAccessDisabled",
}

# check() must give up within ~15 s on a silent endpoint: 2 attempts x (3 s connect or 4 s read)
# plus standard-mode backoff (< 1 s before the second attempt).
_CHECK_CONNECT_TIMEOUT = 3.0
_CHECK_READ_TIMEOUT = 4.0
_CHECK_MAX_ATTEMPTS = 2


def _is_outage(exc: Exception) -> bool:
    """A failure that says the server is unreachable or failing (a timeout, a refused or broken
    connection, a 5xx), not that our configuration is wrong (credentials, a missing bucket)."""
    if isinstance(exc, ClientError):
        return _status(exc) >= 500 or _error_code(exc) in ("SlowDown", "RequestTimeout")
    return isinstance(exc, BotoCoreError) and not isinstance(
        exc, NoCredentialsError | PartialCredentialsError
    )


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


class S3ObjectStore:
    """Objects in ``bucket``; keys are used as given (callers add the namespace prefix)."""

    def __init__(
        self,
        bucket: str,
        region: str,
        endpoint_url: str | None,
        path_style: bool,
        access_key: str | None,
        secret_key: str | None,
        timeout: float = 10,
        max_attempts: int = 2,
        max_pool_connections: int = 32,
        ca_file: str | None = None,
    ) -> None:
        """``ca_file``: a PEM bundle of the CAs an https endpoint's certificate is checked
        against, instead of the system's (a private CA in front of MinIO)."""
        self._bucket = bucket
        self._settings: dict[str, Any] = {
            "region_name": region or None,
            "endpoint_url": endpoint_url or None,
            "aws_access_key_id": access_key or None,
            "aws_secret_access_key": secret_key or None,
        }
        if ca_file:
            self._settings["verify"] = ca_file
        self._path_style = path_style
        # One private session for both clients (they share its loaded models); never boto3's
        # default session, which is not thread-safe.
        session = boto3.session.Session()
        self._client = self._make_client(
            session, timeout, timeout, max_attempts, max_pool_connections
        )
        self._check_client = self._make_client(
            session,
            min(timeout, _CHECK_CONNECT_TIMEOUT),
            min(timeout, _CHECK_READ_TIMEOUT),
            _CHECK_MAX_ATTEMPTS,
            2,  # the health checker's and the outage gate's probe may overlap
        )
        self._endpoint = self._client.meta.endpoint_url
        self._gate = OutageGate("s3", self.check, ObjectStoreUnavailable)

    def _make_client(
        self,
        session: boto3.session.Session,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        max_pool_connections: int,
    ) -> S3Client:
        config = BotoConfig(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"total_max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=max_pool_connections,
            s3={"addressing_style": "path" if self._path_style else "auto"},
        )
        try:
            return session.client("s3", config=config, **self._settings)
        except (BotoCoreError, ValueError) as exc:
            raise ObjectStoreUnavailable(
                f"cannot configure S3 client for bucket {self._bucket!r} "
                f"(endpoint {self._settings['endpoint_url'] or 'AWS default'}): {exc}"
            ) from exc

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def description(self) -> str:
        return f"s3://{self._bucket} (endpoint {self._endpoint})"

    def _where(self) -> str:
        return f"S3 endpoint {self._endpoint} (bucket {self._bucket!r})"

    def _raise(self, action: str, key: str, exc: Exception) -> NoReturn:
        """Translate a boto3 failure into the object store's exceptions; an unavailable server
        opens the outage gate."""
        try:
            self._translate(action, key, exc)
        except ObjectStoreUnavailable as unavailable:
            if _is_outage(exc):
                self._gate.failed(unavailable)
            raise

    def _translate(self, action: str, key: str, exc: Exception) -> NoReturn:
        if isinstance(exc, ClientError):
            code, status = _error_code(exc), _status(exc)
            if code in _NOT_FOUND:
                raise ObjectNotFound(f"{key!r} not found in {self.description}") from exc
            if code == "NoSuchBucket":
                raise ObjectStoreUnavailable(f"{self._where()}: the bucket does not exist") from exc
            if code in _REJECTED:
                raise ObjectStoreUnavailable(
                    f"{self._where()} rejected our credentials or permissions: {exc}"
                ) from exc
            if status >= 500 or code in ("SlowDown", "RequestTimeout"):
                raise ObjectStoreUnavailable(f"{self._where()} failed to {action}: {exc}") from exc
            raise ObjectStoreError(f"{self._where()}: cannot {action} {key!r}: {exc}") from exc
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            raise ObjectStoreUnavailable(f"{self._where()}: no usable credentials: {exc}") from exc
        raise ObjectStoreUnavailable(f"{self._where()} is unreachable: {exc}") from exc

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        self._gate.admit()
        body = data if isinstance(data, bytes) else bytes(data)
        try:
            self._client.put_object(Bucket=self._bucket, Key=key, Body=body, IfNoneMatch="*")
        except ClientError as exc:
            if _error_code(exc) not in _NOT_WRITTEN and _status(exc) != 412:
                self._raise("store", key, exc)
            retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
            return bool(retried) and self._holds(key, body)
        except BotoCoreError as exc:
            self._raise("store", key, exc)
        return True

    def _holds(self, key: str, body: bytes) -> bool:
        """True if ``key`` exists with exactly ``body`` (our own retried put got there first)."""
        try:
            return self.size(key) == len(body) and self.get(key) == body
        except ObjectNotFound:
            return False

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if start < 0 or (length is not None and length < 0):
            raise ValueError(f"invalid range start={start} length={length}")
        if length == 0:
            return b""
        self._gate.admit()
        byte_range = ""
        if length is not None:
            byte_range = f"bytes={start}-{start + length - 1}"
        elif start > 0:
            byte_range = f"bytes={start}-"
        try:
            if byte_range:
                response = self._client.get_object(Bucket=self._bucket, Key=key, Range=byte_range)
            else:
                response = self._client.get_object(Bucket=self._bucket, Key=key)
            data = response["Body"].read()
            if byte_range and "ContentRange" not in response:  # the server ignored Range
                return data[start : None if length is None else start + length]
            return data
        except ClientError as exc:
            if _error_code(exc) == "InvalidRange" or _status(exc) == 416:
                return b""  # start is at or past the end of the object
            self._raise("read", key, exc)
        except BotoCoreError as exc:
            self._raise("read", key, exc)

    def size(self, key: str) -> int:
        self._gate.admit()
        try:
            return self._client.head_object(Bucket=self._bucket, Key=key)["ContentLength"]
        except (ClientError, BotoCoreError) as exc:
            self._raise("stat", key, exc)

    def list(self, prefix: str) -> list[ObjectInfo]:
        self._gate.admit()
        found: list[ObjectInfo] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=prefix):
                found.extend(
                    ObjectInfo(item["Key"], item["Size"]) for item in page.get("Contents", [])
                )
        except (ClientError, BotoCoreError) as exc:
            self._raise("list", prefix, exc)
        # S3 already returns UTF-8 byte order; sorting guards against servers that do not.
        found.sort(key=lambda info: info.key)
        return found

    def delete(self, key: str) -> None:
        self._gate.admit()
        try:
            self._client.delete_object(Bucket=self._bucket, Key=key)
        except ClientError as exc:
            if _error_code(exc) not in _NOT_FOUND:
                self._raise("delete", key, exc)
        except BotoCoreError as exc:
            self._raise("delete", key, exc)

    def delete_many(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            self._gate.admit()
            batch = keys[start : start + DELETE_BATCH]
            objects: Any = [{"Key": key} for key in batch]
            try:
                reply = self._client.delete_objects(
                    Bucket=self._bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except ClientError as exc:
                if _error_code(exc) != "NotImplemented":
                    self._raise("delete", batch[0], exc)
                for key in batch:  # an S3-compatible store without DeleteObjects
                    self.delete(key)
                continue
            except BotoCoreError as exc:
                self._raise("delete", batch[0], exc)
            failed = [e for e in reply.get("Errors", []) if e.get("Code") not in _NOT_FOUND]
            if failed:
                first = failed[0]
                raise ObjectStoreError(
                    f"{self._where()}: cannot delete {first.get('Key')!r} "
                    f"({first.get('Code')}: {first.get('Message')}) and {len(failed) - 1} more"
                )

    def check(self) -> None:
        try:
            self._check_client.head_bucket(Bucket=self._bucket)
        except ClientError as exc:
            # HEAD responses carry no error body: the status code is all there is.
            if _status(exc) == 404 or _error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise ObjectStoreUnavailable(f"{self._where()}: the bucket does not exist") from exc
            if _status(exc) == 403 or _error_code(exc) in _REJECTED:
                raise ObjectStoreUnavailable(
                    f"{self._where()} rejected our credentials or permissions for the bucket: {exc}"
                ) from exc
            self._raise("check the bucket", "", exc)
        except BotoCoreError as exc:
            self._raise("check the bucket", "", exc)

    def close(self) -> None:
        self._gate.close()
        self._client.close()
        self._check_client.close()
