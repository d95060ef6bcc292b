"""The object store interface: where segments and indexes live.

Two real implementations sit behind it, chosen by configuration (``open_object_store``):
``LocalObjectStore`` (a directory under ``KAFSCALE_DATA_DIR``, the embedded default) and
``S3ObjectStore`` (AWS S3 or any S3-compatible endpoint, via boto3). Both use the same key layout
(``{namespace}/{topic}/{partition}/segment-{base_offset:020d}.kfs``) and the same semantics:

- ``put_if_absent`` never overwrites: a second put of an existing key returns False and leaves the
  first object intact (S3 ``If-None-Match: *``; locally an atomic link of a complete temp file).
- ``get`` with ``start``/``length`` is a ranged read; reading past the end returns what exists.
- ``list`` returns keys under a prefix in lexicographic order (for segment keys: offset order).
- ``delete`` is idempotent.
- An unreachable backend raises ``ObjectStoreUnavailable`` whose message names the endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class ObjectStoreError(Exception):
    """Base of object store failures."""


class ObjectNotFound(ObjectStoreError):
    """The key does not exist."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The backend cannot be reached or refused us; the message names the endpoint."""


DELETE_BATCH = 1000  # keys per S3 DeleteObjects request, the most S3 accepts


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


class ObjectStore(Protocol):
    @property
    def description(self) -> str:
        """Where objects go, for logs and errors (``s3://bucket (endpoint ...)``, a path)."""
        ...

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Store ``data`` under ``key`` unless the key exists; True if this call created it."""
        ...

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        """Read the object, or ``length`` bytes of it from ``start``. Raises ObjectNotFound."""
        ...

    def size(self, key: str) -> int:
        """The object's size in bytes. Raises ObjectNotFound."""
        ...

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix``, sorted by key."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""
        ...

    def delete_many(self, keys: Sequence[str]) -> None:
        """Remove every key in ``keys`` (missing keys are not an error) in as few requests as the
        backend allows: a deleted topic can have thousands of objects."""
        ...

    def check(self) -> None:
        """Raise ObjectStoreUnavailable unless the backend answers (and the bucket exists)."""
        ...

    def close(self) -> None: ...
