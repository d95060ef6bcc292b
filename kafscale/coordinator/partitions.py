"""Commits of a partition's log: the high watermark and the segment list move together.

The flusher uploads a segment, then asks here. The commit is one compare-and-set transaction over
the topic record (the topic was not deleted or re-created meanwhile) and the partition record (no
other commit got in first), writing the new partition record and the segment's record together.
A commit that does not start exactly at the current high watermark is refused, so the committed
log never has a gap or an overlap.
"""

from __future__ import annotations

import logging

from kafscale.ipc.messages import CommitSegment, SegmentCommitted
from kafscale.ipc.rpc import Incoming
from kafscale.metadata import records
from kafscale.metadata.records import Keys, PartitionRecord
from kafscale.metadata.store import Compare, MetadataStore, Put

log = logging.getLogger(__name__)


class PartitionCommitter:
    def __init__(self, store: MetadataStore, namespace: str) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.high_watermarks: dict[tuple[str, int], int] = {}  # as committed by this process

    def handle(self, incoming: Incoming) -> SegmentCommitted:
        assert isinstance(incoming.message, CommitSegment)
        return self.commit(incoming.message)

    def commit(self, request: CommitSegment) -> SegmentCommitted:
        topic_key = self.keys.topic(request.topic)
        partition_key = self.keys.partition(request.topic, request.partition)
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
        segment = request.segment
        if segment.base_offset != current.high_watermark:
            return SegmentCommitted(
                committed=False,
                high_watermark=current.high_watermark,
                error=f"segment starts at {segment.base_offset} but the high "
                f"watermark is {current.high_watermark}",
            )
        updated = PartitionRecord(
            topic_id=request.topic_id,
            high_watermark=segment.last_offset + 1,
            log_start_offset=current.log_start_offset,
            producers=request.producers,
        )
        txn = self.store.transaction(
            [
                Compare(topic_key, mod_revision=topic_kv.mod_revision),
                Compare(
                    partition_key, mod_revision=partition_kv.mod_revision if partition_kv else 0
                ),
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
        self.high_watermarks[(request.topic, request.partition)] = updated.high_watermark
        return SegmentCommitted(committed=True, high_watermark=updated.high_watermark)
