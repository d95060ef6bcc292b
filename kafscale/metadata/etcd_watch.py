"""A watch on an etcd key prefix: one gRPC stream and one thread, resumed across etcd outages.

Invariants (``EtcdMetadataStore.watch_prefix`` creates them):

- Our ``start_revision`` means "after"; etcd's means "from", so the stream asks for ``after + 1``.
- A broken stream (etcd restarted, the member in use stopped or cut off from its leader, a
  network blip) is re-opened with backoff, on the endpoint the cluster now pins, from the revision
  after the last delivered event: revisions are the cluster's, so no event is lost or repeated
  whichever member serves the stream. ``last_error`` shows the outage meanwhile. A stream refused
  for its auth token is re-opened at once with a new one.
- Compaction past that revision or a cancel by the server ends the watch with ``on_error``.
- No callback runs after ``cancel`` returns.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import grpc  # type: ignore[import-untyped]
from pyetcd import etcdrpc

from kafscale.metadata.etcd_channel import EtcdCluster, rpc_error
from kafscale.metadata.store import (
    EventType,
    MetadataStoreError,
    MetadataStoreUnavailable,
    RevisionCompacted,
    WatchEvent,
)

log = logging.getLogger(__name__)

_EVENT_DELETE = 1  # mvccpb.Event.EventType.DELETE
_MAX_WATCH_BACKOFF_S = 2.0


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    start = prefix.encode()
    if not start:
        return b"\0", b"\0"  # etcd's spelling of "every key"
    return start, start[:-1] + bytes([start[-1] + 1])  # UTF-8 never contains 0xFF


class _WatchEnded(Exception):
    pass


class EtcdWatch:
    def __init__(
        self,
        cluster: EtcdCluster,
        watches: set[EtcdWatch],
        prefix: str,
        callback: Callable[[WatchEvent], None],
        on_error: Callable[[MetadataStoreError], None] | None,
        next_revision: int,
    ) -> None:
        self.prefix = prefix
        self._cluster, self._watches = cluster, watches
        self._callback, self._on_error = callback, on_error
        self._next_revision = next_revision
        self._member = cluster.member  # serving the current stream
        self._cancelled = threading.Event()
        self._settled = threading.Event()  # the first stream was created, or failed
        self._delivering = threading.Lock()
        self._call_lock = threading.Lock()
        self._call: Any = None
        self._backoff = 0.0
        self._token_renewed = False
        self.error: MetadataStoreError | None = None  # why the watch ended, if it did
        self.last_error: MetadataStoreError | None = None  # the current outage, if any
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"etcd-watch {prefix}")

    def start(self) -> None:
        self._thread.start()
        if not self._settled.wait(self._cluster.timeout * 2):
            self.cancel()
            raise MetadataStoreUnavailable(
                f"etcd at {self._member.address} did not create a watch in time"
            )
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self._cancelled.set()
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()
        self._watches.discard(self)
        if threading.current_thread() is not self._thread:
            self._thread.join(self._cluster.timeout)
            with self._delivering:  # no callback runs after we return
                pass

    def _run(self) -> None:
        while not self._cancelled.is_set():
            self._member, metadata = self._cluster.member, self._cluster.metadata
            try:
                self._stream(metadata)
            except _WatchEnded:
                return
            except grpc.RpcError as exc:
                if self._cancelled.is_set():
                    return
                if self._cluster.token_rejected(exc) and not self._token_renewed:
                    self._token_renewed = True  # once until a stream is created again
                    try:
                        self._cluster.authenticate(self._member, metadata)
                        continue
                    except grpc.RpcError as again:
                        exc = again
                if self._failed(rpc_error(exc, self._member.address)):
                    return
            self._backoff = min(max(self._backoff * 2, 0.1), _MAX_WATCH_BACKOFF_S)
            if self._cancelled.wait(self._backoff):
                return

    def _failed(self, error: MetadataStoreError) -> bool:
        """Note a broken stream; True if that ends the watch (its first stream failed)."""
        if isinstance(error, MetadataStoreUnavailable):
            self._cluster.failed(self._member)  # the next stream goes to the next endpoint
        if not self._settled.is_set():
            self._end(error)
            return True
        if self.last_error is None:
            log.warning(
                "watch on %r: %s; re-watching from revision %d",
                self.prefix,
                error,
                self._next_revision,
            )
        self.last_error = error
        return False

    def _stream(self, metadata: Any) -> None:
        start, end = prefix_range(self.prefix)
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
        call = self._member.watch.Watch(iter(requests.get, None), metadata=metadata)
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
                    f" {self._member.address} compacted up to {response.compact_revision}",
                    response.compact_revision,
                )
            )
            raise _WatchEnded
        if response.canceled:
            self._end(
                MetadataStoreError(
                    f"etcd at {self._member.address} cancelled the watch"
                    f" on {self.prefix!r}: {response.cancel_reason}"
                )
            )
            raise _WatchEnded
        if response.created:
            if self.last_error is not None:
                log.info(
                    "watch on %r re-established at revision %d on %s",
                    self.prefix,
                    self._next_revision,
                    self._member.address,
                )
            self.last_error, self._backoff, self._token_renewed = None, 0.0, False
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
        self._watches.discard(self)
        if not self._settled.is_set():
            self._settled.set()  # start() raises it
        elif self._on_error is None:
            log.error("watch on %r ended: %s", self.prefix, error)
        else:
            try:
                self._on_error(error)
            except Exception:
                log.exception("on_error of the watch on %r failed", self.prefix)
