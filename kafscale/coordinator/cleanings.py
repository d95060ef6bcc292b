"""Cleaning commits: a compacted partition's segments replaced by the segments the log cleaner
wrote from them (docs/design/ecosystem.md, section 4.3).

``CommitCleaning`` names the segment records it replaces, each with the mod revision the cleaner
read it at, and the new segments, which cover exactly the same offsets (each starting where one
of the replaced did, at its own generation's object keys). One transaction compares the topic
record (not re-created), every replaced record's mod revision (retention, a DeleteRecords or
another cleaning did not change them) and the partition's leader key (only its owner cleans it),
then puts the new records, deletes the replaced records no new one took the key of, and puts a
``GarbageRecord`` per replaced segment: its objects are deleted ``GRACE_MS`` later by the chores
broker (``kafscale.coordinator.garbage``), so a fetch that found them just before can finish.
The high watermark and the log start do not move.

``cleaning_refusal`` is the pure check of the request against the records read.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence

from kafscale.ipc.cleaning import CommitCleaning
from kafscale.ipc.rpc import Incoming
from kafscale.ipc.write_path import SegmentCommitted
from kafscale.metadata import records
from kafscale.metadata.records import GarbageRecord, Keys, SegmentRecord
from kafscale.metadata.store import Compare, Delete, KeyValue, MetadataStore, Operation, Put
from kafscale.storage import segment as segments

from . import leadership
from .leadership import Leaders

log = logging.getLogger(__name__)

GRACE_MS = 60_000  # as long as the write-ahead objects' (wal_gc.WAL_GC_GRACE_MS)


def cleaning_refusal(
    request: CommitCleaning, found: Sequence[tuple[SegmentRecord, int]]
) -> str | None:
    """Why ``request`` cannot replace ``found`` -- the partition's records (with their mod
    revisions) from the first replaced base offset to the last replaced one's end, in offset
    order -- or None. They must be exactly the replaced segments, as read, contiguous; the new
    segments must cover the same offsets, contiguously, each starting where a replaced one did,
    at a later generation than it."""
    if not request.replaced or not request.segments:
        return "nothing to replace"
    if [(s.base_offset, revision) for s, revision in found] != list(request.replaced):
        return "the segments changed since the cleaner read them"
    old = [s for s, _ in found]
    if any(s.is_chunk for s in old):
        return "a replaced entry is a chunk"
    if any(s.is_chunk or s.object for s in request.segments):
        return "a new entry is not a segment"
    for entries, what in ((old, "replaced"), (list(request.segments), "new")):
        for before, after in itertools.pairwise(entries):
            if after.base_offset != before.last_offset + 1:
                return f"the {what} segments have a gap or an overlap at {after.base_offset}"
    if (old[0].base_offset, old[-1].last_offset) != (
        request.segments[0].base_offset,
        request.segments[-1].last_offset,
    ):
        return "the new segments do not cover the replaced offsets"
    generations = {s.base_offset: s.generation for s in old}
    for segment in request.segments:
        if segment.base_offset not in generations:
            return f"no replaced segment starts at {segment.base_offset}"
        if segment.generation <= generations[segment.base_offset]:
            return f"the segment at {segment.base_offset} is not of a later generation"
    return None


class CleaningCommitter:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        high_watermark: Callable[[str, int], int],
        leaders: Leaders,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.keys = Keys(namespace)
        self.leaders = leaders
        self.high_watermark = high_watermark  # PartitionCommitter.high_watermark
        self.clock = clock

    def handle(self, incoming: Incoming) -> SegmentCommitted:
        assert isinstance(incoming.message, CommitCleaning)
        return self.commit(incoming.message)

    def commit(self, request: CommitCleaning) -> SegmentCommitted:
        topic, partition = request.topic, request.partition
        high_watermark = self.high_watermark(topic, partition)

        def refused(error: str) -> SegmentCommitted:
            return SegmentCommitted(committed=False, high_watermark=high_watermark, error=error)

        topic_kv = self.store.get(self.keys.topic(topic))
        if topic_kv is None or records.decode_topic(topic_kv.value).topic_id != request.topic_id:
            return refused(f"topic {topic} ({request.topic_id}) no longer exists")
        leader = self.leaders.leader(topic, partition)
        if leader is None:
            return refused(f"fenced: this broker does not own {topic}/{partition}")
        if not request.replaced:
            return refused("nothing to replace")
        found = self._read(topic, partition, request.replaced[0][0], request.replaced[-1][0])
        refusal = cleaning_refusal(
            request, [(records.decode_segment(kv.value), kv.mod_revision) for kv in found]
        )
        if refusal is not None:
            return refused(refusal)
        compares = [
            Compare(topic_kv.key, mod_revision=topic_kv.mod_revision),
            *(Compare(kv.key, mod_revision=kv.mod_revision) for kv in found),
            leadership.fence(self.keys, topic, partition, leader),
        ]
        if not self.store.transaction(compares, self._operations(request, found)).succeeded:
            return refused("the segments, the topic or the partition's owner changed")
        log.info(
            "segments cleaned",
            extra={
                "topic": topic,
                "partition": partition,
                "base_offset": request.segments[0].base_offset,
                "last_offset": request.segments[-1].last_offset,
                "replaced": len(found),
                "segments": len(request.segments),
                "records": sum(s.records for s in request.segments),
            },
        )
        return SegmentCommitted(committed=True, high_watermark=high_watermark)

    def _operations(self, request: CommitCleaning, found: list[KeyValue]) -> list[Operation]:
        topic, partition = request.topic, request.partition
        new_keys = {self.keys.segment(topic, partition, s.base_offset) for s in request.segments}
        operations: list[Operation] = [
            Put(self.keys.segment(topic, partition, s.base_offset), records.encode(s))
            for s in request.segments
        ]
        due = self.clock() + GRACE_MS
        for kv in found:
            old = records.decode_segment(kv.value)
            if kv.key not in new_keys:
                operations.append(Delete(kv.key))
            base, generation = old.base_offset, old.generation
            objects = list(segments.object_keys(self.namespace, topic, partition, base, generation))
            operations.append(
                Put(
                    self.keys.garbage_of(topic, partition, base, generation),
                    records.encode(GarbageRecord(objects, due, topic, request.topic_id)),
                )
            )
        return operations

    def _read(self, topic: str, partition: int, first: int, last: int) -> list[KeyValue]:
        """The partition's segment records with base offsets ``first..last``."""
        start = self.keys.segment(topic, partition, first)
        end = self.keys.segment(topic, partition, last)
        prefix = self.keys.segments(topic, partition)
        return [kv for kv in self.store.get_prefix(prefix) if start <= kv.key <= end]
