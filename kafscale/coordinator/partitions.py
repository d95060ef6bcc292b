"""Commits of partitions' logs: the high watermark, producer state and entries move together.

Two requests, each made of compare-and-set transactions over the topic record (the topic was
not deleted or re-created meanwhile) and the partition record (no other commit got in first), so
the committed log never has a gap or an overlap, and the partition's leader key (only its owner
at its leader epoch commits: ``leaders``, docs/design/scale-out.md):

- ``CommitObject`` (write path v2): the chunks of one write-ahead object, planned by
  ``commit_plan`` into one or more transactions, run in order. Partition and topic records are
  cached with their ``mod_revision`` (a transaction's revision is the ``mod_revision`` of every
  key it put), so a commit costs no reads; a transaction whose compares fail is re-planned once
  from fresh reads (without the partitions whose leader key is no longer ours), and a refusal
  decided from cached records is checked against fresh ones before it is answered. The first
  transaction to succeed holds the object's ``WalRecord``.
- ``CommitSegment``: one spec segment at the high watermark: what ``kafscale.shards.recovery``
  adopts when a previous version's flusher uploaded a segment and crashed before committing it.

``high_watermarks`` follows every commit (the groups read it for lag). The references to
write-ahead objects that commits add are counted by the WAL garbage collector from its watch.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

import msgspec

from kafscale.ipc.rpc import Incoming
from kafscale.ipc.write_path import (
    ChunkCommitted,
    CommitObject,
    CommitSegment,
    ObjectCommitResult,
    SegmentCommitted,
)
from kafscale.metadata import records
from kafscale.metadata.records import Keys, PartitionRecord, TopicRecord
from kafscale.metadata.store import Compare, MetadataStore, MetadataStoreError, Put

from . import leadership
from .commit_plan import (
    CommitState,
    Limits,
    Outcome,
    PartitionId,
    PlannedTxn,
    Stored,
    Verdict,
    plan_commit,
    touched,
)
from .leadership import Leaders

log = logging.getLogger(__name__)

DEFAULT_LIMITS = Limits(max_ops=128, max_bytes=1024 * 1024)  # etcd's defaults, with headroom


class PartitionCommitter:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        leaders: Leaders,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.leaders = leaders
        self.limits = limits
        self.high_watermarks: dict[PartitionId, int] = {}  # as committed by this process
        self._topics: dict[str, Stored[TopicRecord] | None] = {}
        self._partitions: dict[PartitionId, Stored[PartitionRecord] | None] = {}

    # -- handlers ----------------------------------------------------------------------------

    def handle(self, incoming: Incoming) -> SegmentCommitted:
        assert isinstance(incoming.message, CommitSegment)
        return self.commit(incoming.message)

    def handle_object(self, incoming: Incoming) -> ObjectCommitResult:
        assert isinstance(incoming.message, CommitObject)
        return self.commit_object(incoming.message)

    # -- write-ahead objects -----------------------------------------------------------------

    def commit_object(self, request: CommitObject) -> ObjectCommitResult:
        """Commit what of ``request`` can be; one answer per chunk, in order. A metadata store
        failure before anything committed raises; after, the rest are answered not committed."""
        topics, partitions = touched(request)
        cached = self._load(topics, partitions)
        verdicts, planned = self._plan(request, range(len(request.chunks)), include_wal=True)
        doubtful = {
            _pid(request, index)
            for index, verdict in verdicts
            if verdict.outcome is not Outcome.COMMIT
            and (_pid(request, index) in cached or request.chunks[index].topic in cached)
        }
        if doubtful:  # decided on cached records: decide again on fresh ones
            self._forget(doubtful)
            self._load(topics, partitions)
            verdicts, planned = self._plan(request, range(len(request.chunks)), include_wal=True)
        self._forget(
            _pid(request, i) for i, verdict in verdicts if verdict.outcome is Outcome.TOPIC_GONE
        )
        run = _ObjectRun(request, [_answer(request, i, verdict) for i, verdict in verdicts])
        self._run(run, planned)
        return ObjectCommitResult(run.results)

    def _plan(
        self, request: CommitObject, indexes: Iterable[int], include_wal: bool
    ) -> tuple[list[tuple[int, Verdict]], list[PlannedTxn]]:
        """Plan the chunks at ``indexes`` on the cached records: (index, verdict) per chunk and
        the transactions (their ``chunks`` are indexes into ``request.chunks`` too)."""
        chosen = list(indexes)
        part = msgspec.structs.replace(request, chunks=[request.chunks[i] for i in chosen])
        owned = {
            pid: leader
            for pid in {(c.topic, c.partition) for c in part.chunks}
            if (leader := self.leaders.leader(*pid)) is not None
        }
        state = CommitState(self._topics, self._partitions, owned)
        plan = plan_commit(part, state, self.limits, self.keys, include_wal)
        for txn in plan.transactions:
            txn.chunks = [chosen[i] for i in txn.chunks]
        for topic, partition in plan.oversized:
            log.warning(
                "a partition's chunks pass the metadata transaction limits: committed alone",
                extra={"topic": topic, "partition": partition, "object": request.wal.key},
            )
        verdicts = [(chosen[i], verdict) for i, verdict in enumerate(plan.verdicts)]
        return verdicts, plan.transactions

    def _run(self, run: _ObjectRun, planned: list[PlannedTxn]) -> None:
        queue = deque((txn, False) for txn in planned)
        while queue:
            txn, retried = queue.popleft()
            if not run.wal_written and not txn.holds_wal:
                # The WalRecord's transaction failed: it goes with the next one instead.
                queue.extendleft(reversed([(t, retried) for t in self._replan(run, txn, False)]))
                continue
            try:
                outcome = self.store.transaction(txn.compares, txn.puts)
            except MetadataStoreError as exc:
                if not run.committed_any:
                    raise
                self._abandon(run, [txn, *(t for t, _ in queue)], exc)
                return
            if outcome.succeeded:
                self._committed(run, txn, outcome.revision)
            elif retried:
                for index in txn.chunks:
                    stored = self._partitions.get(_pid(run.request, index))
                    run.results[index] = msgspec.structs.replace(
                        run.results[index],
                        high_watermark=stored.record.high_watermark if stored else -1,
                        error="the partition or topic changed during the commit",
                    )
                self._forget(txn.partitions)
            else:
                # A partition fenced since the plan fails the whole transaction: drop it (the
                # driver closes it) before planning again, so the others still commit.
                self._check_fences(txn)
                fresh = self._replan(run, txn, True)
                queue.extendleft(reversed([(t, True) for t in fresh]))

    def _check_fences(self, txn: PlannedTxn) -> None:
        """After a transaction failed its compares: tell the ownership driver of every
        partition in it whose leader key is no longer our record (it closes them at once)."""
        for topic, partition in txn.partitions:
            ours = self.leaders.leader(topic, partition)
            if ours is None:
                continue
            kv = self.store.get(self.keys.leader(topic, partition))
            if kv is None or kv.value != records.encode(ours):
                self.leaders.fenced(topic, partition, ours.epoch)

    def _replan(self, run: _ObjectRun, txn: PlannedTxn, reread: bool) -> list[PlannedTxn]:
        """``txn``'s chunks planned again (from fresh reads if ``reread``), answers updated."""
        if reread:
            self._forget(txn.partitions)
            self._load({topic for topic, _ in txn.partitions}, set(txn.partitions))
        verdicts, planned = self._plan(run.request, txn.chunks, not run.wal_written)
        for index, verdict in verdicts:
            run.results[index] = _answer(run.request, index, verdict)
        return planned

    def _committed(self, run: _ObjectRun, txn: PlannedTxn, revision: int) -> None:
        run.committed_any = True
        run.wal_written |= txn.holds_wal
        for pid, record in txn.partitions.items():
            self._partitions[pid] = Stored(record, revision)
            self.high_watermarks[pid] = record.high_watermark
        for index in txn.chunks:
            high_watermark = txn.partitions[_pid(run.request, index)].high_watermark
            run.results[index] = msgspec.structs.replace(
                run.results[index], committed=True, high_watermark=high_watermark, error=None
            )
        log.debug(
            "chunks committed",
            extra={"object": run.request.wal.key, "chunks": len(txn.chunks), "revision": revision},
        )

    def _abandon(self, run: _ObjectRun, left: list[PlannedTxn], exc: MetadataStoreError) -> None:
        """The store failed after some transactions committed: answer the rest not committed
        (whether the failing one committed is unknown: its records are read again next time)."""
        log.warning(
            "metadata store failed during an object commit",
            extra={"object": run.request.wal.key, "error": str(exc)},
        )
        for txn in left:
            self._forget(txn.partitions)
            for index in txn.chunks:
                run.results[index] = msgspec.structs.replace(
                    run.results[index], high_watermark=-1, error=f"metadata store failed: {exc}"
                )

    def high_watermark(self, topic: str, partition: int) -> int:
        """The partition's committed high watermark (cached, or read)."""
        pid = (topic, partition)
        if pid not in self._partitions:
            self._load({topic}, {pid})
        stored = self._partitions.get(pid)
        return stored.record.high_watermark if stored is not None else 0

    # -- segments (the per-partition flush) ----------------------------------------------------

    def commit(self, request: CommitSegment) -> SegmentCommitted:
        topic_key = self.keys.topic(request.topic)
        partition_key = self.keys.partition(request.topic, request.partition)
        pid = (request.topic, request.partition)
        self._forget([pid])
        topic_kv = self.store.get(topic_key)
        if topic_kv is None or records.decode_topic(topic_kv.value).topic_id != request.topic_id:
            return SegmentCommitted(
                committed=False,
                high_watermark=-1,
                error=f"topic {request.topic} ({request.topic_id}) no longer exists",
            )
        partition_kv = self.store.get(partition_key)
        current = (
            records.decode_partition(partition_kv.value)
            if partition_kv is not None
            else PartitionRecord(topic_id=request.topic_id)
        )
        leader = self.leaders.leader(request.topic, request.partition)
        if leader is None or (current.owner, current.leader_epoch) != (leader.owner, leader.epoch):
            return SegmentCommitted(
                committed=False,
                high_watermark=current.high_watermark,
                error=f"fenced: this broker does not own {request.topic}/{request.partition}",
            )
        segment = request.segment
        if segment.base_offset != current.high_watermark:
            return SegmentCommitted(
                committed=False,
                high_watermark=current.high_watermark,
                error=f"segment starts at {segment.base_offset} but the high "
                f"watermark is {current.high_watermark}",
            )
        updated = msgspec.structs.replace(
            current,
            topic_id=request.topic_id,
            high_watermark=segment.last_offset + 1,
            producers=request.producers,
            wal_committed=True,
        )
        txn = self.store.transaction(
            [
                Compare(topic_key, mod_revision=topic_kv.mod_revision),
                Compare(
                    partition_key, mod_revision=partition_kv.mod_revision if partition_kv else 0
                ),
                leadership.fence(self.keys, request.topic, request.partition, leader),
            ],
            [
                Put(partition_key, records.encode(updated)),
                Put(
                    self.keys.segment(request.topic, request.partition, segment.base_offset),
                    records.encode(segment),
                ),
            ],
        )
        if not txn.succeeded:
            latest = self.store.get(partition_key)
            high_watermark = (
                records.decode_partition(latest.value).high_watermark if latest is not None else 0
            )
            return SegmentCommitted(
                committed=False,
                high_watermark=high_watermark,
                error="the partition or topic changed during the commit",
            )
        log.debug(
            "segment committed",
            extra={
                "topic": request.topic,
                "partition": request.partition,
                "high_watermark": updated.high_watermark,
            },
        )
        self._partitions[pid] = Stored(updated, txn.revision)
        self.high_watermarks[pid] = updated.high_watermark
        return SegmentCommitted(committed=True, high_watermark=updated.high_watermark)

    # -- the cache ----------------------------------------------------------------------------

    def _load(self, topics: set[str], partitions: set[PartitionId]) -> set[str | PartitionId]:
        """Read the records of ``topics`` and ``partitions`` not cached; returns those that
        were (decisions made on them may be stale)."""
        cached: set[str | PartitionId] = {t for t in topics if t in self._topics}
        cached |= {pid for pid in partitions if pid in self._partitions}
        for topic in topics - self._topics.keys():
            kv = self.store.get(self.keys.topic(topic))
            self._topics[topic] = (
                Stored(records.decode_topic(kv.value), kv.mod_revision) if kv else None
            )
        missing = [pid for pid in partitions if pid not in self._partitions]
        for topic in {t for t, _ in missing}:
            wanted = [pid for pid in missing if pid[0] == topic]
            if len(wanted) == 1:  # one read; for more, one read of the topic's partitions
                kv = self.store.get(self.keys.partition(*wanted[0]))
                found = {wanted[0]: kv} if kv else {}
            else:
                prefix = self.keys.topic_partitions(topic)
                found = {
                    (topic, int(kv.key[len(prefix) :])): kv
                    for kv in self.store.get_prefix(prefix)
                    if kv.key[len(prefix) :].isdigit()
                }
            for pid in wanted:
                kv = found.get(pid)
                self._partitions[pid] = (
                    Stored(records.decode_partition(kv.value), kv.mod_revision) if kv else None
                )
        return cached

    def _forget(self, partitions: Iterable[PartitionId]) -> None:
        """Drop the cached records of ``partitions`` and of their topics."""
        for pid in list(partitions):
            self._partitions.pop(pid, None)
            self._topics.pop(pid[0], None)


class _ObjectRun:
    """One ``CommitObject`` in progress: the answers so far and what is written."""

    def __init__(self, request: CommitObject, results: list[ChunkCommitted]) -> None:
        self.request = request
        self.results = results
        self.wal_written = False
        self.committed_any = False


def _pid(request: CommitObject, index: int) -> PartitionId:
    chunk = request.chunks[index]
    return chunk.topic, chunk.partition


def _answer(request: CommitObject, index: int, verdict: Verdict) -> ChunkCommitted:
    """The answer to a chunk as decided (a ``COMMIT`` one says not committed, high watermark
    unknown, until its transaction succeeds)."""
    chunk = request.chunks[index]
    return ChunkCommitted(
        topic=chunk.topic,
        partition=chunk.partition,
        base_offset=chunk.chunk.base_offset,
        committed=verdict.outcome is Outcome.COMMITTED,
        high_watermark=verdict.high_watermark if verdict.outcome is not Outcome.COMMIT else -1,
        error=verdict.error if verdict.outcome is not Outcome.COMMIT else "not committed",
        topic_gone=verdict.outcome is Outcome.TOPIC_GONE,
        earlier=verdict.outcome is Outcome.COMMITTED,
    )
