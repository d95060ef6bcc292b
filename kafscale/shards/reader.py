"""The shard's read path: Fetch and ListOffsets for the partitions the shard owns (ListOffsets
itself is ``kafscale.shards.offsets``; the caches, reader threads and S3 health here serve both).

Where a fetch at offset O is served from:

- O at or past the visible end (the high watermark; the log end with ``KAFSCALE_FETCH_UNFLUSHED``)
  has nothing yet: the fetch waits (long polling), see below.
- O in a buffer (only with ``KAFSCALE_FETCH_UNFLUSHED``): a copy of the buffered batches.
- O in a committed segment (located by binary search in the partition's segment list): the L1
  cache, which also holds every segment this shard flushed (copied from its buffer when the
  commit lands, so consumers at the tail never go to S3); on a miss, a ranged GET from the index
  entry at or before O (the index comes from the L2 cache or one more GET), on a reader thread.
  Serving a segment also prefetches up to ``KAFSCALE_READAHEAD_SEGMENTS`` following segments
  whole into L1 (best effort, bounded).

Bytes leave as the memoryview of whole batches in the cache, handed to ZeroMQ without a copy;
nothing is decoded or re-encoded.

Long polling: a fetch with less than ``min_bytes`` available is parked, keyed by its partitions.
The events that move a partition's visible end (a commit; an append when unflushed data is
served) re-run the fetches parked on it; so does ``ReleaseFetch`` from the frontend (another
shard already had enough) and the deadline. Nothing polls: an idle consumer costs a dict entry.

S3 health: a failed read refuses every fetch that needs S3 at once (KAFKA_STORAGE_ERROR, which
every client retries silently) for ``READ_BACKOFF_MS``; then one read goes through as a probe and
its outcome closes or reopens the gate. Cached and buffered data is served throughout. A fetch
whose only news is that error is answered at its deadline (``max_wait_ms``), not at once, so
clients that retry without a backoff do not spin.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kafscale import metrics
from kafscale.config import Config
from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming, RpcServer
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.shards import reads
from kafscale.shards.cache import ByteLRU, Chunk
from kafscale.shards.offsets import OffsetLookups
from kafscale.shards.partition import PartitionLog, StaleTopic
from kafscale.shards.reads import SegmentRef
from kafscale.storage.faults import FaultLog
from kafscale.storage.objects import ObjectNotFound, ObjectStore, ObjectStoreError
from kafscale.storage.segment import CorruptBatch, CorruptSegment, Index

log = logging.getLogger(__name__)

READ_WORKERS = 8
READ_BACKOFF_MS = 1000
MAX_READAHEADS = 4  # whole-segment prefetches in flight per shard

# The retriable error of a read the object store cannot serve now. Every client retries it
# without telling the application, but Java and aiokafka at once (no backoff): so a fetch with
# only this to say waits out its max_wait_ms like an empty one instead of answering at once.
RETRY_LATER = ErrorCode.kafka_storage_error

SegmentKey = tuple[str, int, int]  # topic id, partition, segment base offset
PartitionKey = tuple[str, int]  # topic id, partition
# Loads (or returns) the partition a request names: (topic, topic id, partition, created ms);
# raises StaleTopic when that topic is gone.
PartitionFor = Callable[[str, str, int, int], PartitionLog]
T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Part:
    """One partition's answer to a fetch, as far as known."""

    offset: int
    max_bytes: int
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    chunk: Chunk | None = None


@dataclass(eq=False)
class FetchOp:
    incoming: Incoming
    request: messages.Fetch
    deadline_ms: int
    parts: list[Part] = field(default_factory=list)
    reading: int = 0  # object-store reads in flight
    released: bool = False
    parked_ms: int = -1  # when it began to wait; -1 while not waiting


class ReadPath:
    def __init__(
        self,
        config: Config,
        objects: ObjectStore,
        server: RpcServer,
        partition_for: PartitionFor,
        label: str,
        clock: Callable[[], int],
    ) -> None:
        self.namespace = config.s3_namespace
        self.unflushed = config.fetch_unflushed
        self.readahead = config.readahead_segments
        self.decompression_factor = config.max_decompression_factor
        self.faults = FaultLog(log, "shard", metrics.READ_FAULTS.labels("shard").inc)
        self.objects = objects
        self.server = server
        self.partition_for = partition_for
        self.label = label
        self.now = clock
        self.segments: ByteLRU[SegmentKey, tuple[Chunk, ...]] = ByteLRU(
            config.cache_size // config.shards
        )
        self.indexes: ByteLRU[SegmentKey, Index] = ByteLRU(config.index_cache_size // config.shards)
        self._pool = concurrent.futures.ThreadPoolExecutor(READ_WORKERS, f"read-{label}")
        self._done: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[..., None]]]
        self._done = queue.SimpleQueue()
        self.wakeup_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._fetches: dict[tuple[bytes, int], FetchOp] = {}
        self._parked: dict[PartitionKey, set[FetchOp]] = defaultdict(set)
        self._prefetching: set[SegmentKey] = set()
        self._degraded = False
        self._refuse_until_ms = 0
        self._probing = False
        metrics.S3_READ_HEALTHY.labels(label).set(1)
        self.offsets = OffsetLookups(self)

    # -- events from the shard -----------------------------------------------------------------

    def advanced(self, partition: PartitionLog) -> None:
        """The partition's visible end moved: re-run the fetches waiting on it."""
        for op in self._parked.pop((partition.topic_id, partition.partition), set()):
            self._unpark(op)
            self._run(op)

    def flushed(self, partition: PartitionLog, chunk: Chunk | None, record: SegmentRecord) -> None:
        """A segment was committed; ``chunk`` is its batches as they were buffered."""
        partition.segments.add(record)
        if chunk is not None:
            self.store((partition.topic_id, partition.partition, record.base_offset), chunk)
        if not self.unflushed:
            self.advanced(partition)

    def appended(self, partition: PartitionLog) -> None:
        if self.unflushed:
            self.advanced(partition)

    def tick(self, now: int) -> None:
        expired = {op for ops in self._parked.values() for op in ops if op.deadline_ms <= now}
        for op in expired:
            self._unpark(op)
            self._settle(op)

    def on_completions(self) -> None:
        """Finish the object-store reads that completed (the shard polls ``wakeup_fd``)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.wakeup_fd)
        while True:
            try:
                future, done = self._done.get_nowait()
            except queue.Empty:
                return
            error = future.exception()
            done(None if error else future.result(), error)

    def close(self) -> None:
        for op in list(self._fetches.values()):
            op.released = True
            if op.reading == 0:
                self._unpark(op)
                self._settle(op)
        self._pool.shutdown(wait=False, cancel_futures=True)
        os.close(self.wakeup_fd)

    # -- fetch ---------------------------------------------------------------------------------

    def on_fetch(self, incoming: Incoming, request: messages.Fetch) -> None:
        deadline = self.now() + max(request.max_wait_ms, 0)
        op = FetchOp(incoming, request, deadline)
        self._fetches[(incoming.identity, request.fetch_id)] = op
        self._run(op)

    def on_release(self, incoming: Incoming, request: messages.ReleaseFetch) -> None:
        op = self._fetches.get((incoming.identity, request.fetch_id))
        if op is None:
            return  # already answered
        op.released = True
        if op.parked_ms >= 0:
            self._unpark(op)
            self._settle(op)

    def _run(self, op: FetchOp) -> None:
        op.parts = [self._plan(op, entry) for entry in op.request.entries]
        if op.reading == 0:
            self._settle(op)

    def _plan(self, op: FetchOp, entry: messages.FetchEntry) -> Part:
        part = Part(entry.offset, entry.max_bytes)
        partition = self.partition_of(entry.topic, entry.topic_id, entry.partition, entry)
        if isinstance(partition, messages.OffsetAnswer):
            part.error, part.message = ErrorCode(partition.error_code), partition.message
            return part
        end = self.visible_end(partition)
        part.high_watermark, part.log_start_offset = end, partition.log_start_offset
        offset = entry.offset
        if offset < partition.log_start_offset or offset > partition.next_offset:
            part.error = ErrorCode.offset_out_of_range
            part.message = (
                f"offset {offset} is outside the log "
                f"[{partition.log_start_offset}, {partition.next_offset}]"
            )
        elif offset >= end:
            pass  # nothing to read yet
        elif offset >= partition.high_watermark:
            buffered = partition.buffered(offset)
            assert buffered is not None, "offsets between HW and the log end are buffered"
            part.chunk = buffered.chunk(offset, entry.max_bytes)
        else:
            self._plan_committed(op, partition, part)
        return part

    def _plan_committed(self, op: FetchOp, partition: PartitionLog, part: Part) -> None:
        segment = self._segment(partition, part.offset, part)
        if segment is None:
            return
        key = (partition.topic_id, partition.partition, segment.base_offset)
        chunk = self.cached(key, part.offset)
        if chunk is not None:
            part.chunk = chunk
            self._read_ahead(partition, segment)
            return
        if self.refused(part):
            return
        ref = SegmentRef.of(self.namespace, partition.topic, partition.partition, segment)
        index = self.indexes.get(key)
        metrics.CACHE_LOOKUPS.labels("index", "miss" if index is None else "hit").inc()

        def done(result: tuple[Index | None, Chunk] | None, error: BaseException | None) -> None:
            op.reading -= 1
            if result is None:
                self.read_failed(part, ref.key, error)
            else:
                fetched_index, chunk = result
                if index is None and fetched_index is not None:
                    self.indexes.put(key, fetched_index, max(segment.index_size, 1))
                    self._gauges()
                self.healthy()
                self.store(key, chunk)
                part.chunk = chunk
                self._read_ahead(partition, segment)
            if op.reading == 0:
                self._settle(op)

        op.reading += 1
        self.submit(_range_job, (self.objects, ref, index, part.offset, part.max_bytes), done)

    def _settle(self, op: FetchOp) -> None:
        """Answer now if there is enough (or an error, a release, the deadline); else park."""
        used = 0
        views: list[memoryview | None] = []
        for part in op.parts:
            view = None
            if part.chunk is not None:
                remaining = op.request.max_bytes - used
                view = part.chunk.batches_from(part.offset, min(part.max_bytes, remaining))
                if used > 0 and len(view) > remaining:
                    view = None  # only the first partition may exceed max_bytes
                else:
                    used += len(view)
            views.append(view)
        now = self.now()
        if (
            used >= op.request.min_bytes
            or any(part.error not in (ErrorCode.none, RETRY_LATER) for part in op.parts)
            or op.released
            or now >= op.deadline_ms
        ):
            self._answer(op, views, used, now)
            return
        op.parked_ms = now
        for entry in op.request.entries:
            self._parked[(entry.topic_id, entry.partition)].add(op)
        metrics.FETCHES_WAITING.labels(self.label).inc()

    def _answer(self, op: FetchOp, views: list[memoryview | None], used: int, now: int) -> None:
        results = [
            messages.FetchResult(
                error_code=int(part.error),
                high_watermark=part.high_watermark,
                log_start_offset=part.log_start_offset,
                size=len(view) if view is not None else 0,
                message=part.message,
            )
            for part, view in zip(op.parts, views, strict=True)
        ]
        bulk = [view for view in views if view is not None and len(view)]
        self.server.reply(op.incoming, messages.Fetched(results=results), bulk)
        self._fetches.pop((op.incoming.identity, op.request.fetch_id), None)
        metrics.FETCH_BYTES.inc(used)
        if op.request.max_wait_ms > 0 and now > op.deadline_ms - op.request.max_wait_ms:
            metrics.FETCH_WAIT_SECONDS.observe(
                (now - op.deadline_ms + op.request.max_wait_ms) / 1000
            )

    def _unpark(self, op: FetchOp) -> None:
        if op.parked_ms < 0:
            return
        op.parked_ms = -1
        for entry in op.request.entries:
            waiting = self._parked.get((entry.topic_id, entry.partition))
            if waiting is not None:
                waiting.discard(op)
                if not waiting:
                    del self._parked[(entry.topic_id, entry.partition)]
        metrics.FETCHES_WAITING.labels(self.label).dec()

    # -- list offsets --------------------------------------------------------------------------

    def on_list_offsets(self, incoming: Incoming, request: messages.ListOffsets) -> None:
        self.offsets.on_list_offsets(incoming, request)

    # -- shared --------------------------------------------------------------------------------

    def partition_of(
        self, topic: str, topic_id: str, partition: int, query: Any
    ) -> PartitionLog | messages.OffsetAnswer:
        try:
            return self.partition_for(topic, topic_id, partition, query.topic_created_ms)
        except StaleTopic as exc:
            return _error(ErrorCode.unknown_topic_or_partition, str(exc))
        except Exception:  # a partition that cannot load is that partition's error
            log.exception("cannot load partition", extra={"topic": topic, "partition": partition})
            return _error(ErrorCode.kafka_storage_error, "cannot load the partition")

    def visible_end(self, partition: PartitionLog) -> int:
        return partition.next_offset if self.unflushed else partition.high_watermark

    def _segment(self, partition: PartitionLog, offset: int, part: Part) -> SegmentRecord | None:
        segment = partition.segments.find(offset)
        if segment is None:
            log.error(
                "no committed segment holds a committed offset",
                extra={"topic": partition.topic, "partition": partition.partition, "at": offset},
            )
            part.error = ErrorCode.kafka_storage_error
            part.message = f"no committed segment holds offset {offset}"
        return segment

    def cached(self, key: SegmentKey, offset: int, whole: bool = False) -> Chunk | None:
        for chunk in self.segments.get(key) or ():
            if chunk.holds(offset) and (chunk.complete or not whole):
                metrics.CACHE_LOOKUPS.labels("segment", "hit").inc()
                return chunk
        metrics.CACHE_LOOKUPS.labels("segment", "miss").inc()
        return None

    def store(self, key: SegmentKey, chunk: Chunk) -> None:
        held = self.segments.peek(key) or ()
        if chunk.complete:
            chunks: tuple[Chunk, ...] = (chunk,)
        elif any(c.complete for c in held):
            return
        else:
            chunks = (*held, chunk)
        self.segments.put(key, chunks, sum(len(c) for c in chunks))
        self._gauges()

    def _read_ahead(self, partition: PartitionLog, segment: SegmentRecord) -> None:
        if not self.readahead or self._degraded:
            return
        for following in partition.segments.following(segment, self.readahead):
            key = (partition.topic_id, partition.partition, following.base_offset)
            held = self.segments.peek(key) or ()
            if key in self._prefetching or any(c.complete for c in held):
                continue
            if len(self._prefetching) >= MAX_READAHEADS:
                return
            if following.size > self.segments.capacity // 4:
                continue  # would push out more than it is worth
            self._prefetching.add(key)
            ref = SegmentRef.of(self.namespace, partition.topic, partition.partition, following)
            self.submit(reads.read_segment, (self.objects, ref), self._prefetched(key, ref))

    def _prefetched(self, key: SegmentKey, ref: SegmentRef) -> Callable[..., None]:
        def done(result: Chunk | None, error: BaseException | None) -> None:
            self._prefetching.discard(key)
            if result is None:
                metrics.READAHEADS.labels("failed").inc()
                self.read_failed(Part(0, 0), ref.key, error)
            else:
                metrics.READAHEADS.labels("done").inc()
                self.store(key, result)
                self.healthy()

        return done

    def refused(self, part: Part) -> bool:
        """Whether reads from the object store are refused now (and ``part`` says so)."""
        if self._degraded:
            if self.now() < self._refuse_until_ms or self._probing:
                part.error = ErrorCode.kafka_storage_error
                part.message = "the object store is unavailable; retry later"
                return True
            self._probing = True  # this read finds out whether the store is back
        return False

    def refusal(self) -> tuple[ErrorCode, str | None] | None:
        """``refused`` for a request that is not a fetch: the error to answer, if refused."""
        part = Part(0, 0)
        return (part.error, part.message) if self.refused(part) else None

    def read_error(self, key: str, error: BaseException | None) -> tuple[ErrorCode, str | None]:
        """``read_failed`` for a request that is not a fetch: the error to answer."""
        part = Part(0, 0)
        self.read_failed(part, key, error)
        return part.error, part.message

    def read_failed(self, part: Part, key: str, error: BaseException | None) -> None:
        part.error = ErrorCode.kafka_storage_error
        self._probing = False  # whatever the probe found, the next read may probe again
        if isinstance(error, ObjectStoreError) and not isinstance(error, ObjectNotFound):
            # Keys and the backend's text (endpoints, bucket) go to the log, not to clients.
            part.message = "the object store cannot be read; retry later"
            if not self._degraded:
                log.error("object store read failed: refusing reads that need it", exc_info=error)
            self._degraded, self._probing = True, False
            self._refuse_until_ms = self.now() + READ_BACKOFF_MS
            metrics.S3_READ_HEALTHY.labels(self.label).set(0)
        elif isinstance(error, (CorruptSegment, ObjectNotFound, records.CorruptRecordBatch)):
            # A batch that does not decode is named by partition and offsets (useful, and no
            # location); other faults name an object key, which stays in the log.
            part.message = (
                f"committed data cannot be read: {error.fault}"
                if isinstance(error, CorruptBatch)
                else "committed data cannot be read (corrupt or missing object)"
            )
            self.faults.report(key, str(error))
        else:
            part.error = ErrorCode.unknown_server_error
            part.message = f"reading the partition failed ({type(error).__name__})"
            log.error("read failed", exc_info=error, extra={"key": key})

    def healthy(self) -> None:
        if self._degraded:
            log.info("object store reads succeed again")
            self._degraded = self._probing = False
            metrics.S3_READ_HEALTHY.labels(self.label).set(1)

    def submit(
        self, job: Callable[..., T], args: tuple[Any, ...], done: Callable[..., None]
    ) -> None:
        def complete(future: concurrent.futures.Future[T]) -> None:
            self._done.put((future, done))
            os.eventfd_write(self.wakeup_fd, 1)

        self._pool.submit(job, *args).add_done_callback(complete)

    def _gauges(self) -> None:
        metrics.CACHE_BYTES.labels("segment", self.label).set(self.segments.used)
        metrics.CACHE_BYTES.labels("index", self.label).set(self.indexes.used)


def _range_job(
    objects: ObjectStore, ref: SegmentRef, index: Index | None, offset: int, max_bytes: int
) -> tuple[Index | None, Chunk]:
    """A ranged read of the batches at ``offset``, fetching the index first if not cached. An
    index that is missing or corrupt is only an accelerator lost: read from the first batch."""
    if index is None:
        try:
            index = reads.read_index(objects, ref)
        except (CorruptSegment, ObjectNotFound) as exc:
            log.warning(
                "index unusable; reading the segment from its start", extra={"error": str(exc)}
            )
    return index, reads.read_range(objects, ref, index, offset, max_bytes)


def _error(code: ErrorCode, message: str | None) -> messages.OffsetAnswer:
    return messages.OffsetAnswer(error_code=int(code), message=message)
