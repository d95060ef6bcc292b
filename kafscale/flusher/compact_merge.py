"""The merge level of compaction (docs/design/write-path.md, section 11): the I/O of a ``Merge``
job, and the ranged read of a merged chunk that a seal needs.

A merge writes the held runs the planner chose into ONE write-ahead object in the flusher's own
format (``kafscale.storage.wal``), under the broker's ``!wal/`` prefix with the compactor's own
token (keys never repeat: a new token per compactor, a sequence number per object), chunks in
(topic, partition, base offset) order, each run one chunk (the bytes of consecutive chunks are
valid as one chunk). It then asks the coordinator to ``CommitMerge``: the object's ``WalRecord``
(``merged=True``) and per run the chunk that replaces it. Runs committed release their memory
and are told to the shard owning the partition (``SegmentsCompacted``: the read path now reads
the merged chunk); runs refused reload the partition's entries.

An object uploaded but never committed (a crash, the coordinator down) has no ``WalRecord``: the
flusher's boot recovery finds nothing in it to adopt (every chunk lies below its partition's high
watermark) and deletes it. One committed with runs all refused is collected by the GC.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kafscale import metrics
from kafscale.flusher.compact_plan import Merge, PartitionKey
from kafscale.flusher.compact_state import Accumulator
from kafscale.flusher.objects import chunk_record
from kafscale.ipc import messages, routing, write_path
from kafscale.ipc.rpc import Bulk, Reply
from kafscale.metadata.records import SegmentRecord, WalRecord
from kafscale.storage import wal
from kafscale.storage.objects import ObjectStore

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_MS = 30_000  # a merge commits thousands of runs in tens of transactions


class MergeFailed(Exception):
    """A merge could not complete; its partitions are tried again after a back-off."""


@dataclass(frozen=True, slots=True)
class Edges:
    """What a merge needs of the compactor: a coordinator call (``call(message, bulk,
    timeout_ms)``), a notice to a shard, and the reload of a partition's entries."""

    call: Callable[[messages.Message, Bulk, int], Reply]
    notify: Callable[[int, messages.Message], None]
    reload: Callable[[PartitionKey], None]


class Merger:
    def __init__(
        self,
        objects: ObjectStore,
        accumulator: Accumulator,
        namespace: str,
        broker_id: int,
        shards: int,
    ) -> None:
        self.objects = objects
        self.accumulator = accumulator
        self.namespace = namespace
        self.broker_id = broker_id
        self.shards = shards
        self.token = wal.new_token()
        self._seq = itertools.count()

    def merge(self, job: Merge, edges: Edges) -> None:
        """Carry ``job`` out (runs that changed since it was planned are left out)."""
        found = self.accumulator.merge_input(job)
        if not found:
            return
        planned = dict(job.runs)
        found.sort(key=lambda item: (item[0], planned[item[0]][0].base_offset))
        topic_ids = {key: topic_id for key, topic_id, _ in found}
        inputs = [_chunk_input(key, topic_id, planned[key], data) for key, topic_id, data in found]
        created_ms = int(time.time() * 1000)
        key = wal.object_key(self.namespace, self.broker_id, self.token, next(self._seq))
        body, entries = wal.build_object(inputs, created_ms)
        if not self.objects.put_if_absent(key, body) and self.objects.get(key) != body:
            raise MergeFailed(f"{key} exists with other bytes")  # keys never repeat: a bug
        self.accumulator.merged_objects([key])
        record = WalRecord(
            key,
            len(body),
            created_ms,
            self.broker_id,
            [(entry.topic, entry.partition, entry.base_offset) for entry in entries],
            merged=True,
        )
        runs = [
            write_path.CommitCompaction(
                entry.topic,
                topic_ids[PartitionKey(entry.topic, entry.partition)],
                entry.partition,
                entry.base_offset,
                entry.last_offset,
                chunk_record(key, entry),
            )
            for entry in entries
        ]
        reply = edges.call(write_path.CommitMerge(record, runs), (), COMMIT_TIMEOUT_MS).message
        if not isinstance(reply, write_path.MergeCommitted) or len(reply.results) != len(runs):
            raise MergeFailed(f"the coordinator could not commit the merge: {reply!r}")
        merged_bytes = 0
        for run, result in zip(runs, reply.results, strict=True):
            partition = PartitionKey(run.topic, run.partition)
            if not result.committed:
                log.info(
                    "merge of a run refused; reloading the partition's entries",
                    extra={"topic": run.topic, "partition": run.partition, "reason": result.error},
                )
                edges.reload(partition)
                continue
            self.accumulator.merged(partition, run.segment)
            merged_bytes += run.segment.size
            shard = routing.shard_for(run.topic_id, run.partition, self.shards)
            notice = write_path.SegmentsCompacted(
                run.topic, run.topic_id, run.partition, run.segment
            )
            try:
                edges.notify(shard, notice)
            except Exception:  # the shard's reads find the chunks gone and reload: not fatal
                log.exception("could not tell shard %d of a merge", shard)
        metrics.COMPACTION_MERGES.inc()
        metrics.COMPACTION_MERGED_BYTES.inc(merged_bytes)
        log.info(
            "held chunks merged",
            extra={"object": key, "runs": len(runs), "bytes": merged_bytes},
        )


def _chunk_input(
    key: PartitionKey, topic_id: str, chunks: tuple[SegmentRecord, ...], data: list[bytes]
) -> wal.ChunkInput:
    first = chunks[0]
    return wal.ChunkInput(
        topic=key.topic,
        topic_id=topic_id,
        partition=key.partition,
        base_offset=first.base_offset,
        last_offset=chunks[-1].last_offset,
        records=sum(chunk.records for chunk in chunks),
        max_timestamp=max(chunk.max_timestamp for chunk in chunks),
        codec=first.codec,
        created_ms=first.created_ms,  # the age rule keeps counting from the oldest chunk
        batches=data,
    )
