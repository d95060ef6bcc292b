"""etcd v3 metadata store: the production backend, over gRPC with python-etcd3 0.12.

Maps ``store.MetadataStore`` one-to-one onto etcd's KV, Txn, Lease and Watch APIs. python-etcd3
builds the channel and the generated stubs; requests go through the stubs directly because the
library's helpers drop what the interface needs (``transaction`` returns no revision) or do not
survive a broken stream (its shared ``Watcher`` drops every callback on the first stream error and
re-opens streams in a tight loop while etcd is down). Invariants:

- Every gRPC failure becomes a ``MetadataStoreError``: UNAVAILABLE and DEADLINE_EXCEEDED become
  ``MetadataStoreUnavailable`` naming the endpoint; "lease not found" becomes ``LeaseExpired``.
  Every call carries the store's deadline (``KAFSCALE_ETCD_TIMEOUT_MS``), so nothing hangs on a
  dead or paused etcd. The first call that finds etcd unavailable opens an ``OutageGate``: later
  calls fail at once until a background probe (``check``) gets an answer; ``check`` and the
  watches always go to the server.
- Our ``start_revision`` means "after"; etcd's means "from", so watches ask for ``after + 1``.
- Each watch owns one gRPC stream and one thread. A broken stream (etcd restarted, network blip)
  is re-opened with backoff from the revision after the last delivered event, so no event is lost
  or repeated; ``last_error`` shows the outage meanwhile. Compaction past that revision or a
  cancel by the server ends the watch with ``on_error``.
- Endpoints are tried in order at construction and the first that answers is used for the life of
  the store. Failover to the next endpoint later, TLS and authentication are future work.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]

with warnings.catch_warnings():
    # etcd3 0.12's generated stubs use protobuf's old descriptor API, which warns on import.
    warnings.simplefilter("ignore", DeprecationWarning)
    import etcd3
    from etcd3 import etcdrpc

from kafscale.metadata.store import (
    Compare,
    DeleteRange,
    EventType,
    KeyValue,
    LeaseExpired,
    MetadataStoreError,
    MetadataStoreUnavailable,
    Operation,
    Put,
    RevisionCompacted,
    TxnResult,
    WatchEvent,
)
from kafscale.outage import OutageGate

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT = 2379
_GRPC_OPTIONS = [
    # Reconnect quickly after an etcd restart instead of gRPC's default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
_EVENT_DELETE = 1  # mvccpb.Event.EventType.DELETE
_MAX_WATCH_BACKOFF_S = 2.0


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port``, ``http://host:port`` or ``host`` -> (host, port)."""
    text = endpoint.strip().rstrip("/")
    if text.startswith("https://"):
        raise MetadataStoreError(f"etcd endpoint {endpoint!r}: TLS is not supported yet")
    text = text.removeprefix("http://")
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit() and host:
        return host, int(port)
    return text, DEFAULT_PORT


def _prefix_range(prefix: str) -> tuple[bytes, bytes]:
    start = prefix.encode()
    if not start:
        return b"\0", b"\0"  # etcd's spelling of "every key"
    return start, start[:-1] + bytes([start[-1] + 1])  # UTF-8 never contains 0xFF


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
        stub, timeout = self._store._client.leasestub, self._store._timeout
        responses = self._store._call(lambda: list(stub.LeaseKeepAlive(iter([request]), timeout)))
        # etcd answers a keep-alive of an unknown lease with TTL 0, not with an error.
        if not responses or responses[0].TTL <= 0:
            raise LeaseExpired(f"lease {self._id:x} expired or was revoked")

    def revoke(self) -> None:
        request = etcdrpc.LeaseRevokeRequest(ID=self._id)
        stub, timeout = self._store._client.leasestub, self._store._timeout
        with contextlib.suppress(LeaseExpired):  # already gone: revoking is idempotent
            self._store._call(lambda: stub.LeaseRevoke(request, timeout))


class _WatchEnded(Exception):
    pass


class EtcdWatch:
    def __init__(
        self,
        store: EtcdMetadataStore,
        prefix: str,
        callback: Callable[[WatchEvent], None],
        on_error: Callable[[MetadataStoreError], None] | None,
        next_revision: int,
    ) -> None:
        self.prefix = prefix
        self._store, self._callback, self._on_error = store, callback, on_error
        self._next_revision = next_revision
        self._cancelled = threading.Event()
        self._settled = threading.Event()  # the first stream was created, or failed
        self._delivering = threading.Lock()
        self._call_lock = threading.Lock()
        self._call: Any = None
        self._backoff = 0.0
        self.error: MetadataStoreError | None = None  # why the watch ended, if it did
        self.last_error: MetadataStoreError | None = None  # the current outage, if any
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"etcd-watch {prefix}")

    def start(self) -> None:
        self._thread.start()
        if not self._settled.wait(self._store._timeout * 2):
            self.cancel()
            raise MetadataStoreUnavailable(
                f"etcd at {self._store._endpoint} did not create a watch in time"
            )
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self._cancelled.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()
        self._store._watches.discard(self)
        if threading.current_thread() is not self._thread:
            self._thread.join(self._store._timeout)
            with self._delivering:  # no callback runs after we return
                pass

    def _run(self) -> None:
        while not self._cancelled.is_set():
            try:
                self._stream()
            except _WatchEnded:
                return
            except grpc.RpcError as exc:
                if self._cancelled.is_set():
                    return
                error = self._store._error(exc)
                if not self._settled.is_set():
                    self._end(error)
                    return
                if self.last_error is None:
                    log.warning(
                        "watch on %r: %s; re-watching from revision %d",
                        self.prefix,
                        error,
                        self._next_revision,
                    )
                self.last_error = error
            self._backoff = min(max(self._backoff * 2, 0.1), _MAX_WATCH_BACKOFF_S)
            if self._cancelled.wait(self._backoff):
                return

    def _stream(self) -> None:
        start, end = _prefix_range(self.prefix)
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        requests.put(
            etcdrpc.WatchRequest(
                create_request=etcdrpc.WatchCreateRequest(
                    key=start,
                    range_end=end,
                    start_revision=self._next_revision,
                    progress_notify=True,
                )
            )
        )
        call = self._store._watch_stub.Watch(iter(requests.get, None))
        with self._call_lock:
            self._call = call
            if self._cancelled.is_set():
                call.cancel()
        try:
            for response in call:
                self._handle(response)
        finally:
            call.cancel()  # a no-op if the stream already ended; closes it if we ended the watch
            requests.put(None)  # ends the request iterator gRPC reads on its own thread

    def _handle(self, response: Any) -> None:
        if response.compact_revision:
            self._end(
                RevisionCompacted(
                    f"watch on {self.prefix!r} needs revision {self._next_revision}, but etcd at"
                    f" {self._store._endpoint} compacted up to {response.compact_revision}",
                    response.compact_revision,
                )
            )
            raise _WatchEnded
        if response.canceled:
            self._end(
                MetadataStoreError(
                    f"etcd at {self._store._endpoint} cancelled the watch"
                    f" on {self.prefix!r}: {response.cancel_reason}"
                )
            )
            raise _WatchEnded
        if response.created:
            if self.last_error is not None:
                log.info(
                    "watch on %r re-established at revision %d", self.prefix, self._next_revision
                )
            self.last_error, self._backoff = None, 0.0
            self._settled.set()
        if not response.events and not response.created:
            # A progress notification: every event up to header.revision has been sent.
            self._next_revision = max(self._next_revision, response.header.revision + 1)
        with self._delivering:
            for event in response.events:
                if self._cancelled.is_set():
                    return
                kv = event.kv
                deleted = event.type == _EVENT_DELETE
                try:
                    self._callback(
                        WatchEvent(
                            EventType.DELETE if deleted else EventType.PUT,
                            kv.key.decode(),
                            b"" if deleted else kv.value,
                            kv.mod_revision,
                        )
                    )
                except Exception:
                    log.exception("watch callback on %r failed", self.prefix)
                self._next_revision = kv.mod_revision + 1

    def _end(self, error: MetadataStoreError) -> None:
        self.error = error
        self._store._watches.discard(self)
        if not self._settled.is_set():
            self._settled.set()  # start() raises it
        elif self._on_error is None:
            log.error("watch on %r ended: %s", self.prefix, error)
        else:
            try:
                self._on_error(error)
            except Exception:
                log.exception("on_error of the watch on %r failed", self.prefix)


class EtcdMetadataStore:
    def __init__(self, endpoints: Sequence[str], timeout: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("EtcdMetadataStore needs at least one endpoint")
        self._timeout = timeout
        self._watches: set[EtcdWatch] = set()
        self._gate = OutageGate("etcd", self.check, MetadataStoreUnavailable)
        failures: list[str] = []
        for endpoint in endpoints:
            host, port = parse_endpoint(endpoint)
            self._endpoint = f"{host}:{port}"
            self._client: Any = etcd3.client(
                host, port, timeout=timeout, grpc_options=_GRPC_OPTIONS
            )
            try:
                self.check()
                break
            except MetadataStoreError as exc:  # unreachable, or not etcd: try the next one
                failures.append(str(exc))
                self._client.close()
        else:
            raise MetadataStoreUnavailable("; ".join(failures))
        self._watch_stub = etcdrpc.WatchStub(self._client.channel)

    @property
    def description(self) -> str:
        return f"etcd://{self._endpoint}"

    def _error(self, exc: grpc.RpcError) -> MetadataStoreError:
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return MetadataStoreUnavailable(f"etcd at {self._endpoint} is unreachable: {details}")
        if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
            return LeaseExpired(f"etcd at {self._endpoint}: {details}")
        name = code.name if code is not None else "error"
        return MetadataStoreError(f"etcd at {self._endpoint}: {name}: {details}")

    def _call(self, rpc: Callable[[], T]) -> T:
        self._gate.admit()
        try:
            return rpc()
        except grpc.RpcError as exc:
            error = self._error(exc)
            if isinstance(error, MetadataStoreUnavailable):
                self._gate.failed(error)
            raise error from exc

    def _range(self, request: Any) -> Any:
        return self._call(lambda: self._client.kvstub.Range(request, self._timeout))

    def get(self, key: str) -> KeyValue | None:
        response = self._range(etcdrpc.RangeRequest(key=key.encode()))
        return _key_value(response.kvs[0]) if response.kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        start, end = _prefix_range(prefix)
        response = self._range(
            etcdrpc.RangeRequest(
                key=start,
                range_end=end,
                sort_order=etcdrpc.RangeRequest.ASCEND,
                sort_target=etcdrpc.RangeRequest.KEY,
            )
        )
        return [_key_value(kv) for kv in response.kvs]

    def revision(self) -> int:
        response = self._range(etcdrpc.RangeRequest(key=b"\0", count_only=True))
        return int(response.header.revision)

    def compact(self, revision: int) -> None:
        request = etcdrpc.CompactionRequest(revision=revision, physical=False)
        try:
            self._call(lambda: self._client.kvstub.Compact(request, self._timeout))
        except MetadataStoreError as exc:
            if "required revision has been compacted" not in str(exc):
                raise  # (compacted already, by us before a restart or by etcd's own policy)

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        request = _put_request(Put(key, value, lease_id))
        response = self._call(lambda: self._client.kvstub.Put(request, self._timeout))
        return int(response.header.revision)

    def delete(self, key: str) -> bool:
        request = etcdrpc.DeleteRangeRequest(key=key.encode())
        response = self._call(lambda: self._client.kvstub.DeleteRange(request, self._timeout))
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
        response = self._call(lambda: self._client.kvstub.Txn(request, self._timeout))
        return TxnResult(bool(response.succeeded), int(response.header.revision))

    def grant_lease(self, ttl_seconds: int) -> EtcdLease:
        request = etcdrpc.LeaseGrantRequest(TTL=ttl_seconds, ID=0)
        response = self._call(lambda: self._client.leasestub.LeaseGrant(request, self._timeout))
        if response.error:
            raise MetadataStoreError(f"etcd at {self._endpoint} refused a lease: {response.error}")
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
        watch = EtcdWatch(self, prefix, callback, on_error, after + 1)
        self._watches.add(watch)
        watch.start()
        return watch

    def check(self) -> None:
        try:
            self._client.maintenancestub.Status(etcdrpc.StatusRequest(), self._timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        self._gate.close()
        for watch in list(self._watches):
            watch.cancel()
        self._client.close()


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
