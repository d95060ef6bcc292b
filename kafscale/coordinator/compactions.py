"""Compaction commits: a partition's chunk records replaced by the spec segment built from them.

One transaction per ``CommitCompaction`` (docs/design/write-path.md, section 6): it compares the
topic record (not deleted or re-created) and the first chunk's record (exactly as read), puts the
segment's record over the first chunk's key and deletes the other chunks' keys with one
``DeleteRange``. Keys are zero-padded base offsets, so ``[segment(first_base + 1),
segment(last_offset + 1))`` holds exactly the entries after the first that the segment covers.
The entries read now must be chunks covering ``first_base..last_offset`` exactly
(``commit_plan.compaction_refusal``). The high watermark does not move.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from kafscale.ipc.messages import CommitCompaction, SegmentCommitted
from kafscale.ipc.rpc import Incoming
from kafscale.metadata import records
from kafscale.metadata.records import Keys
from kafscale.metadata.store import Compare, DeleteRange, KeyValue, MetadataStore, Operation, Put

from .commit_plan import compaction_refusal
from .partitions import References

log = logging.getLogger(__name__)


class CompactionCommitter:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        high_watermark: Callable[[str, int], int],
        refs: References | None = None,
    ) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.high_watermark = high_watermark  # PartitionCommitter.high_watermark
        self.refs = refs

    def handle(self, incoming: Incoming) -> SegmentCommitted:
        assert isinstance(incoming.message, CommitCompaction)
        return self.commit(incoming.message)

    def commit(self, request: CommitCompaction) -> SegmentCommitted:
        """Replace the chunk records ``first_base..last_offset`` by ``request.segment``."""
        topic, partition = request.topic, request.partition
        topic_kv = self.store.get(self.keys.topic(topic))
        if topic_kv is None or records.decode_topic(topic_kv.value).topic_id != request.topic_id:
            return SegmentCommitted(
                committed=False,
                high_watermark=-1,
                error=f"topic {topic} ({request.topic_id}) no longer exists",
            )
        first_key = self.keys.segment(topic, partition, request.first_base)
        end_key = self.keys.segment(topic, partition, request.last_offset + 1)
        found = self._read_range(first_key, end_key)
        replaced = [records.decode_segment(kv.value) for kv in found]
        high_watermark = self.high_watermark(topic, partition)
        refusal = compaction_refusal(request, replaced)
        if refusal is not None:
            return SegmentCommitted(committed=False, high_watermark=high_watermark, error=refusal)
        success: list[Operation] = [Put(first_key, records.encode(request.segment))]
        if len(found) > 1:
            after_first = self.keys.segment(topic, partition, request.first_base + 1)
            success.append(DeleteRange(after_first, end_key))
        txn = self.store.transaction(
            [
                Compare(topic_kv.key, mod_revision=topic_kv.mod_revision),
                Compare(first_key, value=found[0].value),
            ],
            success,
        )
        if not txn.succeeded:
            return SegmentCommitted(
                committed=False,
                high_watermark=high_watermark,
                error="the topic or the first chunk changed during the compaction",
            )
        if self.refs is not None:
            for object_key, count in Counter(entry.object for entry in replaced).items():
                self.refs.removed(object_key, count)
        log.info(
            "chunks compacted into a segment",
            extra={
                "topic": topic,
                "partition": partition,
                "base_offset": request.first_base,
                "last_offset": request.last_offset,
                "chunks": len(replaced),
            },
        )
        return SegmentCommitted(committed=True, high_watermark=high_watermark)

    def _read_range(self, start: str, end: str) -> list[KeyValue]:
        """The keys ``start <= key < end``, read under the longest prefix they share."""
        shared = 0
        while shared < min(len(start), len(end)) and start[shared] == end[shared]:
            shared += 1
        return [kv for kv in self.store.get_prefix(start[:shared]) if start <= kv.key < end]
