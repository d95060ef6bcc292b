"""etcd v3 metadata store: the production backend, over gRPC with etcd's generated stubs.

Maps ``store.MetadataStore`` one-to-one onto etcd's KV, Txn, Lease and Watch APIs. The stubs are
pyetcd's (``etcd-sdk-python``, the maintained fork of python-etcd3, generated for protobuf 5) on
our own channels (``etcd_channel``): the library's client helpers drop what the interface needs
(``transaction`` returns no revision), do not survive a broken watch stream, and keep one auth
token for a client's life. Invariants:

- Every gRPC failure becomes a ``MetadataStoreError``: UNAVAILABLE and DEADLINE_EXCEEDED become
  ``MetadataStoreUnavailable`` naming the endpoint; "lease not found" becomes ``LeaseExpired``;
  a watch past compaction ``RevisionCompacted``. Every call carries the store's deadline
  (``KAFSCALE_ETCD_TIMEOUT_MS``), so nothing hangs on a dead or paused etcd.
- Endpoints are tried in order at construction and the first that answers is used. A call that
  finds the endpoint in use unavailable raises ``MetadataStoreUnavailable`` (it is not sent again:
  a Txn may have been applied) and moves the store to the next endpoint for the next call.
  Only when every endpoint has failed in a row does the store open its ``OutageGate``: later calls
  fail at once until a background probe (``check``, which tries every endpoint) gets an answer.
  ``check`` and the watches always go to the server.
- With ``KAFSCALE_ETCD_USERNAME`` every call carries an auth token; a call refused for an expired
  token authenticates again and is sent once more (etcd refused it before applying it).
- Watches (``etcd_watch``) resume after an outage or a failover from the revision after the last
  delivered event, on whichever endpoint is in use then, so no event is lost or repeated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]
from pyetcd import etcdrpc

from kafscale.config import Config
from kafscale.metadata.etcd_channel import (
    CredentialsRefused,
    EtcdCluster,
    EtcdSecurity,
    Member,
    Metadata,
    joined,
    parse_endpoint,
    rpc_error,
)
from kafscale.metadata.etcd_watch import EtcdWatch, prefix_range
from kafscale.metadata.store import (
    Compare,
    DeleteRange,
    KeyValue,
    LeaseExpired,
    MetadataStoreError,
    MetadataStoreUnavailable,
    Operation,
    Put,
    TxnResult,
    WatchEvent,
)
from kafscale.outage import OutageGate

__all__ = ["EtcdLease", "EtcdMetadataStore", "EtcdSecurity", "EtcdWatch", "parse_endpoint"]

T = TypeVar("T")


# get_prefix reads this many keys per Range (most values are ~200 bytes); a page over the 64 MiB
# gRPC message limit (values are up to etcd's 1.5 MiB request limit) is asked again with fewer.
PAGE_KEYS = 1_000
PAGE_RESTARTS = 3  # scans started again because history compaction removed their revision


class EtcdLease:
    def __init__(self, store: EtcdMetadataStore, lease_id: int, ttl: int) -> None:
        self._store, self._id, self._ttl = store, lease_id, ttl

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl(self) -> int:
        return self._ttl

    def refresh(self) -> None:
        request = etcdrpc.LeaseKeepAliveRequest(ID=self._id)
        timeout = self._store._timeout
        responses = self._store._call(
            lambda member, auth: list(
                member.lease.LeaseKeepAlive(iter([request]), timeout, metadata=auth)
            )
        )
        # etcd answers a keep-alive of an unknown lease with TTL 0, not with an error.
        if not responses or responses[0].TTL <= 0:
            raise LeaseExpired(f"lease {self._id:x} expired or was revoked")

    def revoke(self) -> None:
        request = etcdrpc.LeaseRevokeRequest(ID=self._id)
        timeout = self._store._timeout
        with contextlib.suppress(LeaseExpired):  # already gone: revoking is idempotent
            self._store._call(
                lambda member, auth: member.lease.LeaseRevoke(request, timeout, metadata=auth)
            )


class EtcdMetadataStore:
    def __init__(
        self,
        endpoints: Sequence[str],
        timeout: float = 5.0,
        security: EtcdSecurity | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("EtcdMetadataStore needs at least one endpoint")
        self._timeout = timeout
        self._security = security or EtcdSecurity()
        self._watches: set[EtcdWatch] = set()
        self._gate = OutageGate("etcd", self.check, MetadataStoreUnavailable)
        self._cluster = EtcdCluster(endpoints, timeout, self._security)
        errors: list[MetadataStoreError] = []
        for member in self._cluster.members:
            try:
                self._connect(member)
                break
            except CredentialsRefused:
                self._cluster.close()
                raise  # the same answer from every member
            except MetadataStoreError as exc:  # unreachable, or not etcd: try the next one
                errors.append(exc)
        else:
            self._cluster.close()
            raise joined(errors)

    @classmethod
    def from_config(cls, config: Config) -> EtcdMetadataStore:
        security = EtcdSecurity(
            ca_file=config.etcd_ca_file,
            cert_file=config.etcd_cert_file,
            key=config.etcd_key,
            username=config.etcd_username,
            password=config.etcd_password,
        )
        return cls(config.etcd_endpoints, config.etcd_timeout_ms / 1000, security)

    def _connect(self, member: Member) -> None:
        self._cluster.pin(member)
        if self._security.username:
            try:
                self._cluster.authenticate(member)
            except grpc.RpcError as exc:
                raise rpc_error(exc, member.address) from exc
        self._cluster.status(member)

    @property
    def description(self) -> str:
        return f"etcd://{self._cluster.member.address}"

    def _call(self, rpc: Callable[[Member, Metadata], T]) -> T:
        self._gate.admit()
        cluster = self._cluster
        member, metadata = cluster.member, cluster.metadata
        try:
            try:
                result = rpc(member, metadata)
            except grpc.RpcError as exc:
                if not cluster.token_rejected(exc):
                    raise
                # etcd refused the call before applying it: safe to send again, once.
                result = rpc(member, cluster.authenticate(member, metadata))
        except grpc.RpcError as exc:
            error = rpc_error(exc, member.address)
            if isinstance(error, MetadataStoreUnavailable) and cluster.failed(member):
                self._gate.failed(error)  # every endpoint failed: etcd is down
            raise error from exc
        cluster.answered()
        return result

    def _range(self, request: Any) -> Any:
        timeout = self._timeout
        return self._call(lambda member, auth: member.kv.Range(request, timeout, metadata=auth))

    def get(self, key: str) -> KeyValue | None:
        response = self._range(etcdrpc.RangeRequest(key=key.encode()))
        return _key_value(response.kvs[0]) if response.kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Every key under ``prefix`` at one revision, read ``PAGE_KEYS`` keys per Range: a
        namespace's records outgrow one gRPC message (64 MiB) in a long run. The pages after
        the first read at the first one's revision; if history compaction removes it meanwhile
        the scan starts again."""
        for _ in range(PAGE_RESTARTS):
            try:
                return self._scan(prefix)
            except MetadataStoreError as exc:
                if "required revision has been compacted" not in str(exc):
                    raise
        return self._scan(prefix)

    def _scan(self, prefix: str) -> list[KeyValue]:
        start, end = prefix_range(prefix)
        found: list[KeyValue] = []
        revision = 0  # the first page's: every page reads the same revision
        limit = PAGE_KEYS
        while True:
            request = etcdrpc.RangeRequest(
                key=start,
                range_end=end,
                limit=limit,
                revision=revision,
                sort_order=etcdrpc.RangeRequest.ASCEND,
                sort_target=etcdrpc.RangeRequest.KEY,
            )
            try:
                response = self._range(request)
            except MetadataStoreError as exc:
                if "RESOURCE_EXHAUSTED" not in str(exc) or limit == 1:
                    raise
                limit = max(limit // 4, 1)  # large values: fewer keys per page
                continue
            found.extend(_key_value(kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                return found
            revision = revision or int(response.header.revision)
            start = bytes(response.kvs[-1].key) + b"\0"

    def revision(self) -> int:
        response = self._range(etcdrpc.RangeRequest(key=b"\0", count_only=True))
        return int(response.header.revision)

    def compact(self, revision: int) -> None:
        request = etcdrpc.CompactionRequest(revision=revision, physical=False)
        timeout = self._timeout
        try:
            self._call(lambda member, auth: member.kv.Compact(request, timeout, metadata=auth))
        except MetadataStoreError as exc:
            if "required revision has been compacted" not in str(exc):
                raise  # (compacted already, by us before a restart or by etcd's own policy)

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        request = _put_request(Put(key, value, lease_id))
        timeout = self._timeout
        response = self._call(lambda member, auth: member.kv.Put(request, timeout, metadata=auth))
        return int(response.header.revision)

    def delete(self, key: str) -> bool:
        request = etcdrpc.DeleteRangeRequest(key=key.encode())
        timeout = self._timeout
        response = self._call(
            lambda member, auth: member.kv.DeleteRange(request, timeout, metadata=auth)
        )
        return bool(response.deleted)

    def transaction(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        request = etcdrpc.TxnRequest(
            compare=[message for compare in compares for message in _compare_messages(compare)],
            success=_request_ops(success),
            failure=_request_ops(failure),
        )
        timeout = self._timeout
        response = self._call(lambda member, auth: member.kv.Txn(request, timeout, metadata=auth))
        return TxnResult(bool(response.succeeded), int(response.header.revision))

    def grant_lease(self, ttl_seconds: int) -> EtcdLease:
        request = etcdrpc.LeaseGrantRequest(TTL=ttl_seconds, ID=0)
        timeout = self._timeout
        response = self._call(
            lambda member, auth: member.lease.LeaseGrant(request, timeout, metadata=auth)
        )
        if response.error:
            raise MetadataStoreError(
                f"etcd at {self._cluster.member.address} refused a lease: {response.error}"
            )
        # etcd may raise a short TTL to its minimum (about 1.5 x the election timeout).
        return EtcdLease(self, int(response.ID), int(response.TTL))

    def watch_prefix(
        self,
        prefix: str,
        callback: Callable[[WatchEvent], None],
        start_revision: int | None = None,
        on_error: Callable[[MetadataStoreError], None] | None = None,
    ) -> EtcdWatch:
        after = self.revision() if start_revision is None else start_revision
        watch = EtcdWatch(self._cluster, self._watches, prefix, callback, on_error, after + 1)
        self._watches.add(watch)
        watch.start()
        return watch

    def check(self) -> None:
        self._cluster.check()

    def close(self) -> None:
        self._gate.close()
        for watch in list(self._watches):
            watch.cancel()
        self._cluster.close()


def _key_value(kv: Any) -> KeyValue:
    return KeyValue(
        kv.key.decode(),
        bytes(kv.value),
        int(kv.create_revision),
        int(kv.mod_revision),
        int(kv.lease),
    )


def _put_request(op: Put) -> Any:
    return etcdrpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease_id)


def _request_ops(ops: Sequence[Operation]) -> list[Any]:
    """The RequestOps of ``ops``. An empty ``DeleteRange`` (``end <= start``) is left out: etcd
    would read an empty ``range_end`` as "just the key ``start``"."""
    return [_request_op(op) for op in ops if not isinstance(op, DeleteRange) or op.start < op.end]


def _request_op(op: Operation) -> Any:
    if isinstance(op, Put):
        return etcdrpc.RequestOp(request_put=_put_request(op))
    if isinstance(op, DeleteRange):
        request = etcdrpc.DeleteRangeRequest(key=op.start.encode(), range_end=op.end.encode())
    else:
        request = etcdrpc.DeleteRangeRequest(key=op.key.encode())
    return etcdrpc.RequestOp(request_delete_range=request)


def _compare_messages(compare: Compare) -> Iterator[Any]:
    if compare.mod_revision is None and compare.value is None:
        raise ValueError(f"{compare!r} gives neither mod_revision nor value")
    key = compare.key.encode()
    if compare.mod_revision is not None:
        yield etcdrpc.Compare(
            key=key,
            result=etcdrpc.Compare.EQUAL,
            target=etcdrpc.Compare.MOD,
            mod_revision=compare.mod_revision,
        )
    if compare.value is not None:
        yield etcdrpc.Compare(
            key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.VALUE, value=compare.value
        )
