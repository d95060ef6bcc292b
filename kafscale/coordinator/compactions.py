"""Compaction commits: a partition's chunk records replaced by one entry holding the same batches,
a spec segment (``CommitCompaction``) or a chunk of a merged write-ahead object (``CommitMerge``,
many partitions at once; docs/design/write-path.md, sections 6 and 11).

A run's replacement compares the topic record (not deleted or re-created), the first chunk's
record (exactly as read) and the partition's leader key (only its owner, at its epoch, compacts
it: docs/design/scale-out.md), puts the new record over the first chunk's key and deletes the other
chunks' keys with one ``DeleteRange``. Keys are zero-padded base offsets, so ``[segment(first_base
+ 1), segment(last_offset + 1))`` holds exactly the entries after the first that the run covers.
The entries read now must be chunks covering ``first_base..last_offset`` exactly
(``commit_plan.compaction_refusal``). The high watermark does not move.

- ``CommitCompaction``: one transaction. A chunk record is accepted only for an object whose
  ``WalRecord`` exists (the garbage collector counts only those).
- ``CommitMerge``: the merged object's ``WalRecord`` is put first, alone and only if absent (a
  retry finds it), so every reference that follows is counted and an object whose runs are all
  refused is collected. The runs are then packed into transactions within
  ``KAFSCALE_METADATA_MAX_TXN_OPS`` / ``_BYTES`` (``max(compares, operations)``, as etcd counts);
  a transaction that fails its compares is retried run by run, so each run is committed or
  refused alone.

References (``wal_gc``, which counts them from its watch): the replaced chunks' objects lose
theirs; a merged chunk's object gains one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafscale.ipc.rpc import Incoming
from kafscale.ipc.write_path import CommitCompaction, CommitMerge, MergeCommitted, SegmentCommitted
from kafscale.metadata import records
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.metadata.store import (
    Compare,
    DeleteRange,
    KeyValue,
    MetadataStore,
    MetadataStoreError,
    Operation,
    Put,
)
from kafscale.storage import wal

from . import leadership
from .commit_plan import OP_OVERHEAD, Limits, compaction_refusal
from .leadership import Leaders
from .partitions import DEFAULT_LIMITS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A run read and checked, ready to go into a transaction."""

    request: CommitCompaction
    topic_kv: KeyValue
    first: KeyValue
    replaced: list[SegmentRecord]
    high_watermark: int
    fence: Compare  # our leader key: only the partition's owner compacts it

    def compares(self) -> list[Compare]:
        return [Compare(self.first.key, value=self.first.value), self.fence]

    def operations(self, keys: Keys) -> list[Operation]:
        request = self.request
        success: list[Operation] = [Put(self.first.key, records.encode(request.segment))]
        if len(self.replaced) > 1:
            after_first = keys.segment(request.topic, request.partition, request.first_base + 1)
            end = keys.segment(request.topic, request.partition, request.last_offset + 1)
            success.append(DeleteRange(after_first, end))
        return success


class CompactionCommitter:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        high_watermark: Callable[[str, int], int],
        leaders: Leaders,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.leaders = leaders
        self.high_watermark = high_watermark  # PartitionCommitter.high_watermark
        self.limits = limits

    def handle(self, incoming: Incoming) -> SegmentCommitted:
        assert isinstance(incoming.message, CommitCompaction)
        return self.commit(incoming.message)

    def handle_merge(self, incoming: Incoming) -> MergeCommitted:
        assert isinstance(incoming.message, CommitMerge)
        return self.commit_merge(incoming.message)

    def commit(self, request: CommitCompaction) -> SegmentCommitted:
        """Replace the chunk records ``first_base..last_offset`` by ``request.segment``."""
        if request.segment.is_chunk and not self._wal_record_exists(request.segment.object):
            return SegmentCommitted(
                committed=False,
                high_watermark=self.high_watermark(request.topic, request.partition),
                error=f"no WAL record for {request.segment.object}",
            )
        prepared = self._prepare(request, {})
        if isinstance(prepared, SegmentCommitted):
            return prepared
        txn = self.store.transaction(
            [
                Compare(prepared.topic_kv.key, mod_revision=prepared.topic_kv.mod_revision),
                *prepared.compares(),
            ],
            prepared.operations(self.keys),
        )
        if not txn.succeeded:
            return SegmentCommitted(
                committed=False,
                high_watermark=prepared.high_watermark,
                error="the topic, the first chunk or the partition's owner changed during the "
                "compaction",
            )
        self._committed(prepared)
        return SegmentCommitted(committed=True, high_watermark=prepared.high_watermark)

    def commit_merge(self, request: CommitMerge) -> MergeCommitted:
        """Put the merged object's record, then commit each run (one answer per run, in order).
        A metadata store failure before any run committed raises; after, the runs left are
        answered not committed."""
        wal_key = self.keys.wal_object(wal.object_name(request.wal.key))
        self.store.transaction(
            [Compare.absent(wal_key)], [Put(wal_key, records.encode(request.wal))]
        )
        results: dict[int, SegmentCommitted] = {}
        ready: list[tuple[int, _Prepared]] = []
        topics: dict[str, KeyValue | None] = {}
        for i, run in enumerate(request.runs):
            if run.segment.object != request.wal.key:
                results[i] = SegmentCommitted(False, -1, f"not a chunk of {request.wal.key}")
            elif isinstance(prepared := self._prepare(run, topics), SegmentCommitted):
                results[i] = prepared
            else:
                ready.append((i, prepared))
        for batch in pack(ready, self.limits):
            try:
                results.update(self._commit_batch(batch))
            except MetadataStoreError as exc:
                if not any(result.committed for result in results.values()):
                    raise
                for i, prepared in batch:
                    results[i] = SegmentCommitted(False, prepared.high_watermark, str(exc))
        log.info(
            "chunks merged into a write-ahead object",
            extra={
                "object": request.wal.key,
                "runs": len(request.runs),
                "committed": sum(result.committed for result in results.values()),
            },
        )
        return MergeCommitted([results[i] for i in range(len(request.runs))])

    def _commit_batch(self, batch: Sequence[tuple[int, _Prepared]]) -> dict[int, SegmentCommitted]:
        """One transaction for the runs of ``batch``; run by run if it fails its compares."""
        topic_compares = {
            p.topic_kv.key: Compare(p.topic_kv.key, mod_revision=p.topic_kv.mod_revision)
            for _, p in batch
        }
        compares = [*topic_compares.values(), *(c for _, p in batch for c in p.compares())]
        success = [op for _, p in batch for op in p.operations(self.keys)]
        if self.store.transaction(compares, success).succeeded:
            for _, prepared in batch:
                self._committed(prepared)
            return {i: SegmentCommitted(True, p.high_watermark) for i, p in batch}
        return {i: self.commit(prepared.request) for i, prepared in batch}

    def _prepare(
        self, request: CommitCompaction, topics: dict[str, KeyValue | None]
    ) -> _Prepared | SegmentCommitted:
        """The run read and checked, or the refusal. ``topics``: topic records read already."""
        topic, partition = request.topic, request.partition
        if topic not in topics:
            topics[topic] = self.store.get(self.keys.topic(topic))
        topic_kv = topics[topic]
        if topic_kv is None or records.decode_topic(topic_kv.value).topic_id != request.topic_id:
            return SegmentCommitted(
                committed=False,
                high_watermark=-1,
                error=f"topic {topic} ({request.topic_id}) no longer exists",
            )
        leader = self.leaders.leader(topic, partition)
        if leader is None:
            return SegmentCommitted(
                committed=False,
                high_watermark=-1,
                error=f"fenced: this broker does not own {topic}/{partition}",
            )
        first_key = self.keys.segment(topic, partition, request.first_base)
        end_key = self.keys.segment(topic, partition, request.last_offset + 1)
        found = self._read_range(first_key, end_key)
        replaced = [records.decode_segment(kv.value) for kv in found]
        high_watermark = self.high_watermark(topic, partition)
        refusal = compaction_refusal(request, replaced)
        if refusal is not None:
            return SegmentCommitted(committed=False, high_watermark=high_watermark, error=refusal)
        fence = leadership.fence(self.keys, topic, partition, leader)
        return _Prepared(request, topic_kv, found[0], replaced, high_watermark, fence)

    def _committed(self, prepared: _Prepared) -> None:
        request = prepared.request
        log.debug(
            "chunks compacted",
            extra={
                "topic": request.topic,
                "partition": request.partition,
                "base_offset": request.first_base,
                "last_offset": request.last_offset,
                "chunks": len(prepared.replaced),
                "merged": request.segment.is_chunk,
            },
        )

    def _wal_record_exists(self, object_key: str) -> bool:
        try:
            name = wal.object_name(object_key)
        except ValueError:
            return False
        return self.store.get(self.keys.wal_object(name)) is not None

    def _read_range(self, start: str, end: str) -> list[KeyValue]:
        """The keys ``start <= key < end``, read under the longest prefix they share."""
        shared = 0
        while shared < min(len(start), len(end)) and start[shared] == end[shared]:
            shared += 1
        return [kv for kv in self.store.get_prefix(start[:shared]) if start <= kv.key < end]


def pack(
    ready: Sequence[tuple[int, _Prepared]], limits: Limits
) -> list[list[tuple[int, _Prepared]]]:
    """The runs in transactions, in order, each within ``limits``: compares are one per topic
    plus two per run (its first chunk, its leader key), operations one or two per run; bytes
    are keys and values plus ``OP_OVERHEAD`` per operation. A run that alone exceeds them gets a
    transaction of its own."""
    batches: list[list[tuple[int, _Prepared]]] = []
    topics: set[str] = set()
    compares = operations = size = 0
    for item in ready:
        prepared = item[1]
        ops = 1 + (len(prepared.replaced) > 1)  # the put, and the range delete
        new_topic = prepared.topic_kv.key not in topics
        run_compares = 2 + new_topic
        run_size = _run_size(prepared)
        fits = (
            max(compares + run_compares, operations + ops) <= limits.max_ops
            and size + run_size <= limits.max_bytes
        )
        if not batches or not fits:
            batches.append([])
            topics, compares, operations, size = set(), 0, 0, 0
            run_compares = 3
        batches[-1].append(item)
        topics.add(prepared.topic_kv.key)
        compares, operations, size = compares + run_compares, operations + ops, size + run_size
    return batches


def _run_size(prepared: _Prepared) -> int:
    """Bytes of a run's operations in a request: the topic compare, the first chunk compare (its
    value), the leader key compare (its value), the put of the new record and the range delete."""
    request = prepared.request
    fence_value = prepared.fence.value or b""
    return (
        len(prepared.topic_kv.key)
        + len(prepared.first.key) * 3
        + len(prepared.first.value)
        + len(prepared.fence.key)
        + len(fence_value)
        + len(records.encode(request.segment))
        + 5 * OP_OVERHEAD
    )
