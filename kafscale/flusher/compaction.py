"""The compactor: moves committed chunks into spec segments in the background
(docs/design/write-path.md, section 6).

It keeps, per partition, the uncompacted chunk records and, in an **accumulator** bounded by
``KAFSCALE_COMPACTION_BUFFER_BYTES``, the bytes of a run of them from the oldest (the flusher
hands each chunk it committed to ``committed``; what does not fit is read back later, one GET per
write-ahead object). One worker thread asks the planner (``kafscale.flusher.compact_plan``) what
to do and carries the jobs out, up to ``PARALLEL_JOBS`` at once:

- ``Load``: GET the whole write-ahead object, verify it (``kafscale.storage.wal``), keep the
  chunks the plan names.
- ``Merge`` (``kafscale.flusher.compact_merge``): write held runs of many partitions into one
  merged write-ahead object and commit it, which frees their memory.
- ``Seal``: the chunks of merged objects the plan's seals need are read first, with one ranged
  GET per run of neighbouring chunks in an object (``kafscale.flusher.compact_reads``); build the
  ``.kfs`` and ``.index`` of the chunks' batches (deterministic bytes: the
  first chunk's created time and codec), put-if-absent both at the spec keys of the first chunk's
  base offset (``kafscale.flusher.compact_seal``: an object already there is judged, a committed
  one never overwritten), ask the coordinator to ``CommitCompaction``, then drop
  the chunks and tell the shard owning the partition (``SegmentsCompacted``). A refused commit
  (retention or deletion changed the entries) reloads the partition's entries from the store.

Only a partition's owner compacts it (docs/design/scale-out.md): the compactor follows the
partitions this broker owns (``owned``), reading the chunk records of one that becomes ours and
forgetting one that no longer is; a commit refused as fenced forgets it at once.

A failed job backs off (the partition, or the object, is left out of plans for a while) and is
tried again. ``committed`` only takes a lock held for bookkeeping, never across I/O: nothing here
blocks the flusher's cycles.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from kafscale import metrics
from kafscale.config import Config
from kafscale.flusher import compact_merge, compact_plan, compact_reads
from kafscale.flusher.compact_plan import Limits, Load, Merge, PartitionKey, Seal
from kafscale.flusher.compact_seal import AlreadyCompacted, CompactionFailed, SegmentWriter
from kafscale.flusher.compact_state import BACKOFF_S, Accumulator, backoff
from kafscale.flusher.objects import EntryUnreadable, split_batches
from kafscale.ipc import messages, routing, write_path
from kafscale.ipc.rpc import Bulk, Reply, RpcError
from kafscale.metadata import records as metadata_records
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.storage import segment as segments
from kafscale.storage import wal
from kafscale.storage.objects import ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

PARALLEL_JOBS = 4
COMMIT_TIMEOUT_MS = 10_000
IDLE_WAIT_S = 1.0  # re-plan at least this often (the age rule needs no event)
MIN_PLAN_GAP_S = 0.2  # after a plan with nothing to do, the next one waits at least this
PLAN_SPACING = 9  # ... and nine times as long as that plan took
MIN_CHECK_GAP_S = 0.05  # between two checks whether a plan could find work

_J = TypeVar("_J", Seal, Load, Merge)
_T = TypeVar("_T")
_Chunks = dict[tuple[PartitionKey, int], tuple[int, memoryview]]  # an object's, with positions


def now_ms() -> int:
    return int(time.time() * 1000)  # the clock of chunks' created_ms


class CoordinatorClient(Protocol):
    """What the compactor needs of ``kafscale.ipc.rpc.RpcClient``."""

    def call(self, message: messages.Message, bulk: Bulk = (), timeout_ms: int = 1000) -> Reply: ...

    def close(self) -> None: ...


class Compactor:
    def __init__(
        self,
        config: Config,
        objects: ObjectStore,
        store: MetadataStore,
        coordinator: Callable[[], CoordinatorClient],
        notify: Callable[[int, messages.Message], None],
        shards: int,
        owned: Callable[[], set[tuple[str, int]]] | None = None,
    ) -> None:
        """``coordinator`` makes a client (one per worker thread); ``notify(shard, message)``
        sends a notice to a shard and is called from the compactor's threads; ``owned``, the
        partitions this broker owns now (None: every partition, one broker's tests)."""
        self.objects = objects
        self.store = store
        self.namespace = config.s3_namespace
        self.keys = Keys(self.namespace)
        self.limits = Limits(
            config.compaction_buffer_bytes,
            config.compaction_max_age_ms,
            PARALLEL_JOBS,
            compact_plan.seal_read_bytes(config.compaction_buffer_bytes),
        )
        self.default_segment_bytes = config.segment_bytes
        self._new_client = coordinator
        self._notify = notify
        self._shards = shards
        self.accumulator = Accumulator(config.compaction_buffer_bytes, config.segment_bytes)
        self.writer = SegmentWriter(objects, store, self.namespace)
        self._lock = threading.Lock()  # guards _clients
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(PARALLEL_JOBS, "compact")
        self._local = threading.local()
        self._clients: list[CoordinatorClient] = []
        self.merger = compact_merge.Merger(
            objects, self.accumulator, self.namespace, config.broker_id, shards
        )
        self._owned = owned
        self._following: set[tuple[str, int]] = set()  # the owned partitions last seen

    # --- the flusher's side -------------------------------------------------------------------

    def committed(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        segment_bytes: int,
        record: SegmentRecord,
        data: bytes | memoryview,
    ) -> None:
        """A chunk the flusher committed: keep its record and, if it fits, its bytes (copied).
        ``segment_bytes`` 0 means the broker's ``KAFSCALE_SEGMENT_BYTES``."""
        self.accumulator.committed(
            PartitionKey(topic, partition), topic_id, segment_bytes, record, data
        )
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="compactor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop after the jobs under way (an S3 call may take its timeout)."""
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._pool.shutdown(wait=True)
        for client in self._clients:
            client.close()

    @property
    def held_bytes(self) -> int:
        return self.accumulator.held

    def uncompacted(self, topic: str, partition: int) -> list[SegmentRecord]:
        """The partition's chunk records not compacted yet (for logs and tests)."""
        return self.accumulator.uncompacted(PartitionKey(topic, partition))

    # --- the worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._closing.is_set():
            try:
                self.load_entries()
                break
            except Exception as exc:
                failures += 1
                log.warning("compactor cannot read the chunk records", extra={"error": str(exc)})
                self._closing.wait(backoff(failures))
        while not self._closing.is_set():
            self._wake.clear()
            started = time.monotonic()
            try:
                self._follow_owners()
                if not self.accumulator.may_have_work(self.limits, now_ms(), started):
                    # No partition can be sealed or merged (a check per partition, where a
                    # plan walks every chunk): wait for news (a commit), at most IDLE_WAIT_S
                    # (the age rule needs no event), at least MIN_CHECK_GAP_S.
                    self._closing.wait(MIN_CHECK_GAP_S)
                    self._wake.wait(IDLE_WAIT_S - MIN_CHECK_GAP_S)
                elif not self.run_once():
                    # A plan walks every uncompacted chunk record: after one that found
                    # nothing to do, wait for news (a commit), but plan again no sooner than
                    # PLAN_SPACING times that plan took (at most a tenth of a core), and at
                    # least every IDLE_WAIT_S (the age rule needs no event).
                    spacing = max(MIN_PLAN_GAP_S, PLAN_SPACING * (time.monotonic() - started))
                    self._closing.wait(spacing)
                    self._wake.wait(max(0.0, IDLE_WAIT_S - spacing))
            except Exception:  # a bug: keep the flusher up, try again later
                log.exception("compaction round failed")
                self._closing.wait(BACKOFF_S[1])

    def run_once(self) -> int:
        """Plan and carry out one round of jobs; the number of jobs run. Objects are read at
        once, but what they bring is kept in plan order (a partition's held chunks stay a run
        from its oldest)."""
        jobs = self._plan()
        read = self._read_merged([job for job in jobs if isinstance(job, Seal)])
        seals = [
            self._pool.submit(self._guarded, job, lambda seal: self._seal(seal, read))
            for job in jobs
            if isinstance(job, Seal)
        ] + [
            self._pool.submit(self._guarded, job, self._merge)
            for job in jobs
            if isinstance(job, Merge)
        ]
        fetches = [
            (job, self._pool.submit(self._guarded, job, self._fetch))
            for job in jobs
            if isinstance(job, Load)
        ]
        for job, fetch in fetches:
            if (found := fetch.result()) is not None:
                self._guarded(job, lambda load: self._keep(load, found))
        concurrent.futures.wait(seals)
        return len(jobs)

    def load_entries(self) -> None:
        """Read the chunk records of every partition this broker owns from the store (once, at
        start; ``_follow_owners`` reads those of partitions that become ours later)."""
        owned = self._owned() if self._owned is not None else None
        self._following = owned or set()
        found: dict[PartitionKey, list[SegmentRecord]] = {}
        prefix = self.keys.all_segments
        for kv in self.store.get_prefix(prefix):
            name, partition, _ = kv.key[len(prefix) :].split("/")
            if owned is not None and (name, int(partition)) not in owned:
                continue  # another broker's to compact
            record = metadata_records.decode_segment(kv.value)
            if record.is_chunk:
                found.setdefault(PartitionKey(name, int(partition)), []).append(record)
        topics = {
            topic.name: topic
            for topic in map(metadata_records.decode_topic, _values(self.store, self.keys.topics))
        }
        self.accumulator.merged_objects(
            record.key
            for record in map(
                metadata_records.decode_wal, _values(self.store, self.keys.wal_objects)
            )
            if record.merged
        )
        for key, chunks in found.items():
            if (topic := topics.get(key.topic)) is not None:
                self.accumulator.merge(key, topic.topic_id, self._segment_bytes(topic), chunks)
        self._wake.set()

    def _follow_owners(self) -> None:
        """Only the owner compacts a partition (its commits are fenced on its leader key): read
        the chunk records of partitions that became ours (a failover, a hand-over), forget
        those that are no longer ours."""
        if self._owned is None:
            return
        owned = self._owned()
        for topic, partition in self._following - owned:
            self.accumulator.drop(PartitionKey(topic, partition))
        for topic, partition in owned - self._following:
            self._take(PartitionKey(topic, partition))
        self._following = owned

    def _take(self, key: PartitionKey) -> None:
        """Start compacting a partition that became ours: its chunk records from the store."""
        topic_kv = self.store.get(self.keys.topic(key.topic))
        if topic_kv is None:
            return  # deleted meanwhile
        topic = metadata_records.decode_topic(topic_kv.value)
        chunks = [
            record
            for kv in self.store.get_prefix(self.keys.segments(*key))
            if (record := metadata_records.decode_segment(kv.value)).is_chunk
        ]
        if chunks:
            self.accumulator.merge(key, topic.topic_id, self._segment_bytes(topic), chunks)
            self._wake.set()

    def _segment_bytes(self, topic: metadata_records.TopicRecord) -> int:
        """The size compaction aims at for ``topic``: its segment.bytes, else the broker's."""
        return int(topic.configs.get("segment.bytes", self.default_segment_bytes))

    def _plan(self) -> list[compact_plan.Job]:
        states, paused = self.accumulator.states(time.monotonic())
        return compact_plan.plan(states, self.limits, now_ms(), paused)

    def run_job(self, job: compact_plan.Job) -> None:
        """Carry out one job now (what ``run_once`` does for each of a plan's)."""
        if isinstance(job, Seal):
            read = self._read_merged([job])
            self._guarded(job, lambda seal: self._seal(seal, read))
        elif isinstance(job, Merge):
            self._guarded(job, self._merge)
        elif (found := self._guarded(job, self._fetch)) is not None:
            self._guarded(job, lambda load: self._keep(load, found))

    def _guarded(self, job: _J, action: Callable[[_J], _T]) -> _T | None:
        """``action(job)``; a failure is logged, counted and backs the job off."""
        try:
            return action(job)
        except Exception as exc:
            storage = isinstance(exc, (ObjectStoreError, MetadataStoreError, RpcError))
            refused = isinstance(
                exc, (CompactionFailed, compact_merge.MergeFailed, compact_reads.ChunkUnreadable)
            )
            kind = "storage" if storage else "refused" if refused else ""
            metrics.COMPACTION_FAILURES.labels(kind or "internal").inc()
            what = {"job": type(job).__name__, "error": f"{type(exc).__name__}: {exc}"}
            if kind:
                log.warning("compaction failed; will retry", extra=what)
            else:
                log.exception("compaction failed unexpectedly; will retry", extra=what)
            self.accumulator.back_off(job, time.monotonic())
            return None

    def _fetch(self, job: Load) -> _Chunks | None:
        """Every chunk of the object ``job`` reads, with its position (None: the object is gone,
        compacted meanwhile: the partitions' entries are reloaded)."""
        try:
            data = self.objects.get(job.object)
        except ObjectNotFound:
            log.warning("a chunk's object is gone; reloading", extra={"key": job.object})
            for key in {key for key, _ in job.chunks}:
                self._reload(key)
            return None
        try:
            parsed = wal.parse_object(data)
        except wal.CorruptObject as exc:
            raise CompactionFailed(f"{job.object}: {exc}") from None
        return {
            (PartitionKey(entry.topic, entry.partition), entry.base_offset): (entry.position, chunk)
            for entry, chunk in zip(parsed.entries, parsed.chunks, strict=True)
        }

    def _keep(self, job: Load, found: _Chunks) -> None:
        missing = self.accumulator.loaded(job, found)
        if missing:
            raise CompactionFailed(f"{job.object} does not hold the chunks {missing} it should")

    def _read_merged(self, seals: Sequence[Seal]) -> compact_reads.Found:
        """The merged chunks ``seals`` need, read at once with as few ranged GETs as they lie
        in (on the pool, before the seals run)."""
        chunks = self.accumulator.merged_chunks(seals)
        return compact_reads.read_all(self.objects, chunks, lambda f, r: list(self._pool.map(f, r)))

    def _seal(self, job: Seal, read: compact_reads.Found) -> None:
        key = job.key
        found = self.accumulator.seal_input(job)
        if found is None:
            return  # changed meanwhile: the next plan sees it
        topic_id, held = found
        try:
            data = [
                part if part is not None else compact_reads.take(self.objects, chunk, read)
                for chunk, part in zip(job.chunks, held, strict=True)
            ]
        except ObjectNotFound:
            log.warning("a merged chunk's object is gone; reloading", extra={"key": key})
            self._reload(key)
            return
        chunks = job.chunks
        first = chunks[0]
        batches = [batch for chunk_data in data for batch in _split(chunk_data)]
        kfs, index = segments.build_segment(batches, flags=first.codec, created_ms=first.created_ms)
        try:
            count, created_ms, size, index_size = self.writer.upload(
                key, topic_id, chunks, data, kfs, index
            )
        except AlreadyCompacted as done:
            self._compacted(key, topic_id, done.segment)
            return
        chunks = chunks[:count]
        segment = SegmentRecord(
            base_offset=first.base_offset,
            last_offset=chunks[-1].last_offset,
            size=size,
            index_size=index_size,
            records=sum(chunk.records for chunk in chunks),
            max_timestamp=max(chunk.max_timestamp for chunk in chunks),
            created_ms=created_ms,
            codec=first.codec,
        )
        request = write_path.CommitCompaction(
            key.topic, topic_id, key.partition, first.base_offset, segment.last_offset, segment
        )
        reply = self._coordinator().call(request, timeout_ms=COMMIT_TIMEOUT_MS).message
        if isinstance(reply, messages.ErrorReply):
            raise CompactionFailed(f"the coordinator could not commit: {reply.message}")
        if not isinstance(reply, write_path.SegmentCommitted):
            raise CompactionFailed(f"unexpected reply from the coordinator: {reply!r}")
        if reply.committed or self.writer.committed_record(key, first.base_offset) == segment:
            self._compacted(key, topic_id, segment)
            return
        log.info(
            "compaction refused; reloading the partition's entries",
            extra={"topic": key.topic, "partition": key.partition, "reason": reply.error},
        )
        current = self.writer.committed_record(key, first.base_offset)
        if current is None or current.is_chunk:  # nothing refers to what we uploaded
            self.writer.remove_if_ours(key, first.base_offset, kfs, index)
        if (reply.error or "").startswith("fenced"):
            self.accumulator.drop(key)  # not ours any more: its owner compacts it
        else:
            self._reload(key)

    def _merge(self, job: Merge) -> None:
        edges = compact_merge.Edges(
            lambda message, bulk, timeout_ms: self._coordinator().call(message, bulk, timeout_ms),
            self._notify,
            self._reload,
        )
        self.merger.merge(job, edges)

    def _compacted(self, key: PartitionKey, topic_id: str, segment: SegmentRecord) -> None:
        self.accumulator.compacted(key, segment)
        metrics.COMPACTIONS.inc()
        metrics.COMPACTION_BYTES.inc(segment.size)
        shard = routing.shard_for(topic_id, key.partition, self._shards)
        try:
            self._notify(
                shard, write_path.SegmentsCompacted(key.topic, topic_id, key.partition, segment)
            )
        except Exception:  # the shard's reads find the chunks gone and reload: not fatal
            log.exception("could not tell shard %d of a compaction", shard)

    def _reload(self, key: PartitionKey) -> None:
        """Replace the partition's entries by the store's."""
        topic_kv = self.store.get(self.keys.topic(key.topic))
        kvs = self.store.get_prefix(self.keys.segments(*key))
        topic = metadata_records.decode_topic(topic_kv.value) if topic_kv is not None else None
        stored = [metadata_records.decode_segment(kv.value) for kv in kvs]
        self.accumulator.replace(key, topic.topic_id if topic else None, stored)

    def _coordinator(self) -> CoordinatorClient:
        """One client per worker thread (ZeroMQ sockets are not thread-safe)."""
        client: CoordinatorClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._new_client()
            with self._lock:
                self._clients.append(client)
        return client


def _split(data: bytes) -> list[memoryview]:
    """The batches of a chunk (verified when it was committed or loaded)."""
    try:
        return split_batches(data)
    except EntryUnreadable as exc:
        raise CompactionFailed(f"a chunk does not frame: {exc}") from None


def _values(store: MetadataStore, prefix: str) -> list[bytes]:
    return [kv.value for kv in store.get_prefix(prefix)]
