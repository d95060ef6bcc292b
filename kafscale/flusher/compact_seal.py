"""A seal's object-store side: its segment's ``.kfs`` and ``.index`` put at their spec keys
(docs/design/write-path.md, section 6), and what the seal needs to read of the metadata store.

``SegmentWriter.upload`` puts both objects if absent. A key already taken is judged by
``kafscale.flusher.compact_existing``: an earlier attempt of ours (adopted, whatever number of
chunks it holds), a segment already committed there (``AlreadyCompacted``: the answer of an
earlier commit was lost), a deleted topic's leftover (replaced), or anything else (never
overwritten: ``CompactionFailed``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from kafscale import metrics
from kafscale.flusher import compact_existing
from kafscale.flusher.compact_plan import PartitionKey
from kafscale.metadata import records as metadata_records
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.metadata.store import MetadataStore
from kafscale.storage import segment as segments
from kafscale.storage.objects import ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)


class CompactionFailed(Exception):
    """A compaction could not complete; it is tried again after a back-off."""


class AlreadyCompacted(Exception):
    """The segment is committed already, by an earlier attempt whose answer was lost."""

    def __init__(self, segment: SegmentRecord) -> None:
        self.segment = segment


class SegmentWriter:
    def __init__(self, objects: ObjectStore, store: MetadataStore, namespace: str) -> None:
        self.objects = objects
        self.store = store
        self.namespace = namespace
        self.keys = Keys(namespace)

    def upload(
        self,
        key: PartitionKey,
        topic_id: str,
        chunks: Sequence[SegmentRecord],
        data: Sequence[bytes],
        kfs: bytes,
        index: bytes,
    ) -> tuple[int, int, int, int]:
        """Put the segment and its index; how many chunks the segment now under the key holds
        (ours: all; an earlier attempt's: fewer), its created time, size and index size."""
        base_offset = chunks[0].base_offset
        kfs_key = segments.segment_key(self.namespace, *key, base_offset)
        index_key = segments.index_key(self.namespace, *key, base_offset)
        count, created_ms = len(chunks), chunks[0].created_ms
        if not self._put(kfs_key, kfs):
            existing = self.objects.get(kfs_key)
            committed = self.committed_record(key, base_offset)
            if committed is not None and not committed.is_chunk:
                raise AlreadyCompacted(committed)
            decision = compact_existing.judge(
                existing, kfs, chunks, data, self._topic_created_ms(key, topic_id)
            )
            if isinstance(decision, compact_existing.Conflict):
                log.error("not overwriting %s: %s", kfs_key, decision.reason)
                raise CompactionFailed(f"{kfs_key} holds {decision.reason}")
            if isinstance(decision, compact_existing.Adopt):
                count, created_ms, kfs = decision.chunks, decision.created_ms, existing
                index = segments.rebuild_index(existing)
            else:
                log.warning("replacing %s: %s", kfs_key, decision.reason)
                self.objects.delete(kfs_key)
                if not self._put(kfs_key, kfs):
                    raise CompactionFailed(f"{kfs_key} was written again while we replaced it")
        if not self._put(index_key, index):
            # our segment is in place and no record refers to the index yet: a leftover
            log.warning("replacing a leftover index", extra={"key": index_key})
            self.objects.delete(index_key)
            if not self._put(index_key, index):
                raise CompactionFailed(f"{index_key} was written again while we replaced it")
        return count, created_ms, len(kfs), len(index)

    def remove_if_ours(self, key: PartitionKey, base_offset: int, kfs: bytes, index: bytes) -> None:
        """Delete the segment and index at ``base_offset`` if they hold these bytes (a commit
        refused: nothing refers to them)."""
        for name, data in (
            (segments.segment_key(self.namespace, *key, base_offset), kfs),
            (segments.index_key(self.namespace, *key, base_offset), index),
        ):
            try:
                if self.objects.get(name) == data:
                    self.objects.delete(name)
            except ObjectNotFound:
                pass

    def committed_record(self, key: PartitionKey, base_offset: int) -> SegmentRecord | None:
        kv = self.store.get(self.keys.segment(key.topic, key.partition, base_offset))
        return metadata_records.decode_segment(kv.value) if kv is not None else None

    def _topic_created_ms(self, key: PartitionKey, topic_id: str) -> int:
        kv = self.store.get(self.keys.topic(key.topic))
        topic = metadata_records.decode_topic(kv.value) if kv is not None else None
        return topic.created_ms if topic is not None and topic.topic_id == topic_id else 0

    def _put(self, key: str, data: bytes) -> bool:
        """Put-if-absent; True if the key now holds ``data`` (created, or ours already)."""
        started = time.monotonic()
        try:
            created = self.objects.put_if_absent(key, data)
        except ObjectStoreError:
            metrics.S3_ERRORS.labels("put").inc()
            raise
        metrics.S3_PUT_SECONDS.observe(time.monotonic() - started)
        return created or self.objects.get(key) == data
