"""The shard's read path: Fetch and ListOffsets for the partitions the shard owns (ListOffsets
itself is ``kafscale.shards.offsets``; the caches, reader threads and S3 health here serve both).

Where a fetch at offset O is served from:

- O at or past the visible end (the high watermark; the log end with ``KAFSCALE_FETCH_UNFLUSHED``)
  has nothing yet: the fetch waits (long polling), see below.
- O in a buffer (only with ``KAFSCALE_FETCH_UNFLUSHED``): a copy of the buffered batches.
- O in a committed entry, a spec segment or a chunk of a write-ahead object (located by binary
  search in the partition's entry list): the L1 cache, which also holds every chunk this shard
  committed (copied from its buffer when the commit lands, so consumers at the tail never go to
  S3); on a miss, a ranged GET on a reader thread, from the index entry at or before O (the index
  comes from the L2 cache or one more GET) or, for a chunk, from its start. Serving an entry also
  prefetches up to ``KAFSCALE_READAHEAD_SEGMENTS`` following entries whole into L1 (best effort,
  bounded). When the batches found end before the partition's ``max_bytes`` (small chunks of a
  partition written slowly), the fetch goes on into the following entries as far as L1 holds
  them (``Chunk.gather``: one copy, bounded by ``max_bytes``), never waiting for S3 for them.
- A segment of a compacted topic that the log cleaner rewrote has gaps: the fetch is answered
  from the first batch ending at or after O, and when the entry has none (its tail was cleaned
  away, or all of it) the lookup goes on at the next entry's base offset (``Part.at``), as far as
  the visible end; the answer then begins after O, as Kafka's does on a compacted log.
- An entry whose object is gone (a chunk compacted into a segment and collected, a segment
  cleaned or deleted, after the entry list was loaded) makes the shard reload the partition's
  entries from the metadata store, on a reader thread, and read again once. When chunks are
  compacted (``compacted``), their cached batches move to the segment's cache entry; when
  segments are cleaned (``cleaned``), theirs are dropped (the new ones hold fewer records).

Bytes leave as the memoryview of whole batches in the cache, handed to ZeroMQ without a copy;
nothing is decoded or re-encoded.

Long polling: a fetch with less than ``min_bytes`` available is parked, keyed by its partitions.
The events that move a partition's visible end (a commit; an append when unflushed data is
served) re-run the fetches parked on it; so does ``ReleaseFetch`` from the frontend (another
shard already had enough) and the deadline. Nothing polls: an idle consumer costs a dict entry.

S3 health (``kafscale.shards.gate``): a failed read refuses every fetch that needs S3 at once
(KAFKA_STORAGE_ERROR, which every client retries silently) for ``READ_BACKOFF_MS``; then one read
goes through as a probe and its outcome closes or reopens the gate. Cached and buffered data is
served throughout. A fetch whose only news is that error is answered at its deadline
(``max_wait_ms``), not at once, so clients that retry without a backoff do not spin.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafscale import metrics
from kafscale.config import Config
from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming, RpcServer
from kafscale.metadata.records import SegmentRecord
from kafscale.metadata.store import MetadataStore
from kafscale.protocol.errors import ErrorCode
from kafscale.shards import reads
from kafscale.shards.cache import Chunk, EntryCache, SegmentKey, entry_key
from kafscale.shards.gate import ReadGate
from kafscale.shards.leases import NotLeader
from kafscale.shards.offsets import OffsetLookups
from kafscale.shards.partition import PartitionLog, StaleTopic
from kafscale.shards.reads import SegmentRef
from kafscale.shards.threads import ReaderThreads
from kafscale.storage.objects import ObjectNotFound, ObjectStore
from kafscale.storage.segment import Index

log = logging.getLogger(__name__)

READ_WORKERS = 8
MAX_READAHEADS = 4  # whole-entry prefetches in flight per shard

# The retriable error of a read the object store cannot serve now. Every client retries it
# without telling the application, but Java and aiokafka at once (no backoff): so a fetch with
# only this to say waits out its max_wait_ms like an empty one instead of answering at once.
RETRY_LATER = ErrorCode.kafka_storage_error

PartitionKey = tuple[str, int]  # topic id, partition
# Loads (or returns) the partition a request names: (topic, topic id, partition, created ms);
# raises StaleTopic when that topic is gone.
PartitionFor = Callable[[str, str, int, int], PartitionLog]


@dataclass(eq=False, slots=True)
class Part:
    """One partition's answer to a fetch, as far as known."""

    offset: int
    max_bytes: int
    at: int = -1  # where the entry is looked up: the offset, or past entries cleaned empty there
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    chunk: Chunk | None = None
    reloaded: bool = False  # the entry list was reloaded for this part (a chunk was gone)


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
        metadata: MetadataStore | None = None,
    ) -> None:
        """``metadata``: where the partitions' entry lists are reloaded from when a chunk's
        object is found gone (without it, such a read fails like any missing object)."""
        self.namespace = config.s3_namespace
        self.unflushed = config.fetch_unflushed
        self.readahead = config.readahead_segments
        self.decompression_factor = config.max_decompression_factor
        self.objects = objects
        self.metadata = metadata
        self.server = server
        self.partition_for = partition_for
        self.label = label
        self.now = clock
        self.cache = EntryCache(
            config.cache_size // config.shards, config.index_cache_size // config.shards, label
        )
        self.segments = self.cache.segments  # L1, for the shard's "fits in the cache" checks
        self.gate = ReadGate(label, clock)
        self.faults = self.gate.faults
        self.threads = ReaderThreads(READ_WORKERS, label)
        self.wakeup_fd = self.threads.wakeup_fd
        self.submit = self.threads.submit
        self._fetches: dict[tuple[bytes, int], FetchOp] = {}
        self._parked: dict[PartitionKey, set[FetchOp]] = defaultdict(set)
        self._prefetching: set[SegmentKey] = set()
        self._reloading: dict[PartitionKey, list[Callable[[bool], None]]] = {}
        self.offsets = OffsetLookups(self)

    # -- events from the shard -----------------------------------------------------------------

    def advanced(self, partition: PartitionLog) -> None:
        """The partition's visible end moved: re-run the fetches waiting on it."""
        for op in self._parked.pop((partition.topic_id, partition.partition), set()):
            self._unpark(op)
            self._run(op)

    def flushed(self, partition: PartitionLog, chunk: Chunk | None, record: SegmentRecord) -> None:
        """An entry was committed; ``chunk`` is its batches as they were buffered."""
        partition.segments.add(record)
        if chunk is not None:
            self.cache.store(entry_key(partition, record), chunk)
        if not self.unflushed:
            self.advanced(partition)

    def compacted(self, partition: PartitionLog, segment: SegmentRecord) -> None:
        """Chunks of the partition were compacted into ``segment``: it replaces them in the
        entry list, and their cached batches (still the same bytes) move to its cache entry."""
        replaced = partition.segments.compacted(segment)
        self.cache.move([entry_key(partition, r) for r in replaced], entry_key(partition, segment))

    def cleaned(self, partition: PartitionLog, segments: list[SegmentRecord]) -> None:
        """The log cleaner replaced segments of the partition by ``segments`` (covering the
        same offsets): they replace them in the entry list; what is cached of the old ones is
        dropped."""
        for segment in segments:
            for old in partition.segments.compacted(segment):
                key = entry_key(partition, old)
                self.cache.segments.discard(key)
                self.cache.indexes.discard(key)

    def appended(self, partition: PartitionLog) -> None:
        if self.unflushed:
            self.advanced(partition)

    def tick(self, now: int) -> None:
        expired = {op for ops in self._parked.values() for op in ops if op.deadline_ms <= now}
        for op in expired:
            self._unpark(op)
            self._settle(op)

    def publish(self) -> None:
        """Set the read path's gauges (the cache's sizes)."""
        self.cache.publish()

    def on_completions(self) -> None:
        """Finish the object-store reads that completed (the shard polls ``wakeup_fd``)."""
        self.threads.on_completions()

    def close(self) -> None:
        for op in list(self._fetches.values()):
            op.released = True
            if op.reading == 0:
                self._unpark(op)
                self._settle(op)
        self.threads.close()

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
        else:
            self._plan_at(op, partition, part, offset)
        return part

    def _plan_at(self, op: FetchOp, partition: PartitionLog, part: Part, at: int) -> None:
        """Answer ``part`` from offset ``at`` on (its offset, or past entries it had no batch
        in): nothing yet, buffered batches, or a committed entry's."""
        following: int | None = at
        while following is not None:
            part.at = following
            if part.at >= self.visible_end(partition):
                return  # nothing to read yet
            if part.at >= partition.high_watermark:
                buffered = partition.buffered(part.at)
                assert buffered is not None, "offsets between HW and the log end are buffered"
                part.chunk = buffered.chunk(part.at, part.max_bytes)
                return
            following = self._plan_committed(op, partition, part)

    def _plan_committed(self, op: FetchOp, partition: PartitionLog, part: Part) -> int | None:
        """Answer ``part`` from the committed entry holding ``part.at``, cached or read; or,
        when the cache says it has no batch from there on (cleaned), the offset to go on at."""
        segment = self._segment(partition, part.at, part)
        if segment is None:
            return None
        key = entry_key(partition, segment)
        chunk = self.cache.cached(key, part.at)
        if chunk is not None:
            self._serve(op, partition, part, chunk)
            return None
        if self.cache.passed(key, part.at):
            return segment.last_offset + 1
        if self.refused(part):
            return None
        ref = SegmentRef.of(self.namespace, partition.topic, partition.partition, segment)
        index = self.cache.index(key) if ref.index_key is not None else None

        def done(
            result: tuple[Index | None, Chunk | None] | None, error: BaseException | None
        ) -> None:
            if self.entry_gone(error) and not part.reloaded:
                part.reloaded = True
                self.gate.answered()
                self.reload(partition, lambda ok: self._reread(op, partition, part, ok, error))
                return
            op.reading -= 1
            if result is None:
                self.read_failed(part, ref.key, error)
            else:
                fetched_index, chunk = result
                if index is None and fetched_index is not None:
                    self.cache.put_index(key, fetched_index, segment.index_size)
                self.healthy()
                if chunk is None:  # cleaned away from ``at`` to the entry's end: the next one
                    self._plan_at(op, partition, part, segment.last_offset + 1)
                else:
                    self.cache.store(key, chunk)
                    self._serve(op, partition, part, chunk)
            if op.reading == 0:
                self._settle(op)

        op.reading += 1
        self.submit(reads.read_at, (self.objects, ref, index, part.at, part.max_bytes), done)
        return None

    def _serve(self, op: FetchOp, partition: PartitionLog, part: Part, chunk: Chunk) -> None:
        """Answer ``part`` from ``chunk`` and the cached batches after it, as far as they fit in
        the partition's and the request's max_bytes; read ahead after the last entry reached."""
        limit = min(part.max_bytes, op.request.max_bytes)
        part.chunk = chunk.gather(part.at, limit, lambda at: self._cached_at(partition, at))
        reached = partition.segments.find(part.chunk.last_offset)
        if reached is not None:
            self._read_ahead(partition, reached)

    def _cached_at(self, partition: PartitionLog, offset: int) -> Chunk | None:
        """A cached run of the partition's batches in which a batch begins at ``offset``."""
        entry = partition.segments.find(offset)
        return None if entry is None else self.cache.continuing(entry_key(partition, entry), offset)

    def _reread(
        self, op: FetchOp, partition: PartitionLog, part: Part, ok: bool, gone: BaseException | None
    ) -> None:
        """After the entry list was reloaded for an entry found gone: read once more (or, if
        retention or DeleteRecords moved the log start past it meanwhile, out of range)."""
        if ok and part.at < partition.log_start_offset:
            part.error = ErrorCode.offset_out_of_range
            part.message = f"offset {part.at} is below the log start {partition.log_start_offset}"
        elif ok:
            self._plan_at(op, partition, part, part.at)
        else:
            self.read_failed(part, f"{partition.topic}-{partition.partition}", gone)
        op.reading -= 1
        if op.reading == 0:
            self._settle(op)

    def _settle(self, op: FetchOp) -> None:
        """Answer now if there is enough (or an error, a release, the deadline); else park."""
        used = 0
        views: list[memoryview | None] = []
        for part in op.parts:
            view = None
            if part.chunk is not None:
                remaining = op.request.max_bytes - used
                view = part.chunk.batches_from(part.at, min(part.max_bytes, remaining))
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
        except NotLeader as exc:
            return _error(ErrorCode.not_leader_or_follower, str(exc))
        except Exception:  # a partition that cannot load is that partition's error
            log.exception("cannot load partition", extra={"topic": topic, "partition": partition})
            return _error(ErrorCode.kafka_storage_error, "cannot load the partition")

    def visible_end(self, partition: PartitionLog) -> int:
        return partition.next_offset if self.unflushed else partition.high_watermark

    def _segment(self, partition: PartitionLog, offset: int, part: Part) -> SegmentRecord | None:
        segment = partition.segments.find(offset)
        if segment is None:
            log.error(
                "no committed entry holds a committed offset",
                extra={"topic": partition.topic, "partition": partition.partition, "at": offset},
            )
            part.error = ErrorCode.kafka_storage_error
            part.message = f"no committed entry holds offset {offset}"
        return segment

    def _read_ahead(self, partition: PartitionLog, segment: SegmentRecord) -> None:
        if not self.readahead or self.gate.degraded:
            return
        for following in partition.segments.following(segment, self.readahead):
            key = entry_key(partition, following)
            if key in self._prefetching or self.cache.holds_all(key, following.last_offset):
                continue
            if len(self._prefetching) >= MAX_READAHEADS:
                return
            if following.size > self.segments.capacity // 4:
                continue  # would push out more than it is worth
            self._prefetching.add(key)
            ref = SegmentRef.of(self.namespace, partition.topic, partition.partition, following)
            done = self._prefetched(partition, key, ref)
            self.submit(reads.read_segment, (self.objects, ref), done)

    def _prefetched(
        self, partition: PartitionLog, key: SegmentKey, ref: SegmentRef
    ) -> Callable[..., None]:
        def done(result: Chunk | None, error: BaseException | None) -> None:
            self._prefetching.discard(key)
            if self.entry_gone(error):
                metrics.READAHEADS.labels("failed").inc()
                self.reload(partition, lambda ok: None)  # the next fetch finds the segment
            elif result is None:
                metrics.READAHEADS.labels("failed").inc()
                self.read_failed(Part(0, 0), ref.key, error)
            else:
                metrics.READAHEADS.labels("done").inc()
                self.cache.store(key, result)
                self.healthy()

        return done

    def refused(self, part: Part) -> bool:
        """Whether reads from the object store are refused now (and ``part`` says so)."""
        refusal = self.gate.refusal()
        if refusal is not None:
            part.error, part.message = refusal
        return refusal is not None

    def refusal(self) -> tuple[ErrorCode, str | None] | None:
        """``refused`` for a request that is not a fetch: the error to answer, if refused."""
        return self.gate.refusal()

    def read_error(self, key: str, error: BaseException | None) -> tuple[ErrorCode, str | None]:
        """``read_failed`` for a request that is not a fetch: the error to answer."""
        return self.gate.failure(key, error)

    def read_failed(self, part: Part, key: str, error: BaseException | None) -> None:
        part.error, part.message = self.gate.failure(key, error)

    def healthy(self) -> None:
        self.gate.healthy()

    @staticmethod
    def entry_gone(error: BaseException | None) -> bool:
        """Whether a read failed because the entry's object is gone since the partition's entry
        list was loaded: a chunk compacted into a segment and collected, a segment the log
        cleaner replaced (deleted after a grace), or one retention deleted."""
        return isinstance(error, ObjectNotFound)

    def reload(self, partition: PartitionLog, then: Callable[[bool], None]) -> None:
        """Reload the partition's entry list from the metadata store on a reader thread, then
        call ``then(reloaded)`` on the loop. Reloads asked for meanwhile share the one read."""
        key = (partition.topic_id, partition.partition)
        waiting = self._reloading.get(key)
        if waiting is not None:
            waiting.append(then)
            return
        if self.metadata is None:
            then(False)
            return
        self._reloading[key] = [then]

        def done(result: list[SegmentRecord] | None, error: BaseException | None) -> None:
            if result is None:
                log.warning(
                    "cannot reload the partition's entries",
                    exc_info=error,
                    extra={"topic": partition.topic, "partition": partition.partition},
                )
            else:
                partition.segments.reloaded(result, partition.high_watermark)
                partition.segments.drop_before(partition.log_start_offset)
            for callback in self._reloading.pop(key):
                callback(result is not None)

        args = (self.metadata, self.namespace, partition.topic, partition.partition)
        self.submit(reads.read_entries, args, done)


def _error(code: ErrorCode, message: str | None) -> messages.OffsetAnswer:
    return messages.OffsetAnswer(error_code=int(code), message=message)
