"""The metadata store interface: a small transactional key-value store with watches and leases.

Modelled on etcd v3, which is the production backend (``EtcdMetadataStore``); the embedded default
is a SQLite file in ``KAFSCALE_DATA_DIR`` (``SqliteMetadataStore``), a real implementation of the
same semantics that several processes can share. Chosen by configuration (``open_metadata_store``).

Semantics both backends keep (the contract tests in tests/unit/metadata hold them to it):

- Every change bumps one store-wide ``revision``; a key's ``mod_revision`` is the revision of its
  last change, ``create_revision`` of its creation, 0 for a key that does not exist.
- ``transaction`` applies its operations atomically when every ``Compare`` holds (else the
  ``failure`` operations); this is how every state-dependent write is made (compare-and-set).
- ``watch_prefix`` delivers every later change under a prefix, in revision order, on a background
  thread; ``cancel`` stops it (no callback runs after ``cancel`` returns). A watch never skips
  events silently: if the history it needs was compacted away it raises ``RevisionCompacted`` (at
  ``watch_prefix``) or ends and reports it to ``on_error``; the caller re-reads and watches again.
- A key put with a lease is deleted when the lease expires or is revoked (and watchers see it).
  ``put_if_absent`` with a lease is therefore an exclusive lease on that key: whoever created it
  holds it until it is deleted or the lease ends (revoked, or not refreshed within its TTL).
- An unreachable backend raises ``MetadataStoreUnavailable`` whose message names the endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class MetadataStoreError(Exception):
    """Base of metadata store failures."""


class MetadataStoreUnavailable(MetadataStoreError):
    """The backend cannot be reached; the message names the endpoint."""


class LeaseExpired(MetadataStoreError):
    """The lease no longer exists (it expired or was revoked)."""


class RevisionCompacted(MetadataStoreError):
    """A watch needs history older than the store keeps (``compact_revision`` and before)."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease_id: int = 0


@dataclass(frozen=True, slots=True)
class Compare:
    """Holds when ``key``'s ``mod_revision`` equals ``mod_revision`` (0 means: key absent),
    or, when ``value`` is given instead, when the key exists with exactly that value."""

    key: str
    mod_revision: int | None = None
    value: bytes | None = None

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls(key, mod_revision=0)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease_id: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """Delete every key ``k`` with ``start <= k < end`` (etcd's range delete: one operation
    whatever the number of keys)."""

    start: str
    end: str


Operation = Put | Delete | DeleteRange


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int


class EventType(Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    key: str
    value: bytes  # empty for DELETE
    mod_revision: int


class Watch(Protocol):
    def cancel(self) -> None: ...


class Lease(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def ttl(self) -> int: ...

    def refresh(self) -> None:
        """Keep the lease alive for another ``ttl`` seconds. Raises LeaseExpired if it is gone."""
        ...

    def revoke(self) -> None:
        """End the lease now, deleting its keys."""
        ...


class MetadataStore(Protocol):
    @property
    def description(self) -> str:
        """Where metadata lives, for logs and error messages (``etcd://host:port``, a path)."""
        ...

    def get(self, key: str) -> KeyValue | None: ...

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        """All keys under ``prefix``, sorted by key."""
        ...

    def revision(self) -> int:
        """The store's current revision."""
        ...

    def compact(self, revision: int) -> None:
        """Forget the history (old values, deleted keys, watch events) at and below
        ``revision``; current values are kept. A revision already compacted is no error. etcd
        keeps every revision until told (its database grows without end: ``quota-backend-bytes``
        then refuses every write); SQLite prunes its own history and ignores this."""
        ...

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        """Unconditional put; returns the new revision."""
        ...

    def delete(self, key: str) -> bool:
        """Unconditional delete; True if the key existed."""
        ...

    def transaction(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult: ...

    def watch_prefix(
        self,
        prefix: str,
        callback: Callable[[WatchEvent], None],
        start_revision: int | None = None,
        on_error: Callable[[MetadataStoreError], None] | None = None,
    ) -> Watch:
        """Deliver changes under ``prefix`` after ``start_revision`` (default: from now on).

        Raises ``RevisionCompacted`` if events after ``start_revision`` are no longer kept. If the
        watch later ends because of an error (its history was compacted while it lagged or was
        disconnected), ``on_error`` is called once on the watch's thread; without it the error is
        logged. Transient disconnects are retried and do not end the watch."""
        ...

    def grant_lease(self, ttl_seconds: int) -> Lease: ...

    def check(self) -> None:
        """Raise MetadataStoreUnavailable unless the backend answers."""
        ...

    def close(self) -> None: ...


PUT_IF_ABSENT_ATTEMPTS = 5


def put_if_absent(
    store: MetadataStore, key: str, value: bytes, lease_id: int = 0
) -> KeyValue | None:
    """Create ``key`` unless it exists: None when this call created it, else the key as found
    (whoever holds it). One compare-and-set transaction, so of two callers racing exactly one
    creates the key. With ``lease_id`` it is an exclusive lease, see the module docstring."""
    for _ in range(PUT_IF_ABSENT_ATTEMPTS):
        if store.transaction([Compare.absent(key)], [Put(key, value, lease_id)]).succeeded:
            return None
        existing = store.get(key)
        if existing is not None:
            return existing
        # Deleted between the transaction and the read (its holder's lease just ended): again.
    raise MetadataStoreError(
        f"{key} was created and deleted {PUT_IF_ABSENT_ATTEMPTS} times while we tried to create it"
    )
