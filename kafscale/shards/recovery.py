"""Adopting segments that a previous version uploaded but never committed.

Under write path 1 (per-partition flushes), a crash between the flusher's upload and the
coordinator's commit left ``.kfs``/``.index`` objects at or beyond the high watermark. When a
shard loads the partition it walks them in offset order: one that starts exactly at the high
watermark and verifies (every CRC) is committed -- its batches' producer state included -- and
the high watermark moves past it; anything corrupt, or not contiguous, is removed. So the
committed log never has a gap, and a segment key is never written twice with different bytes.

Finding them costs a LIST of the partition's prefix, so the loader
(``kafscale.shards.loading``) asks only where such a leftover can exist: in a topic created by
that version (``TopicRecord.write_path`` 1) whose partition record this version has not yet
committed to (``PartitionRecord.wal_committed`` false; every commit of this version sets it).
Write path 2 never leaves one: its uncommitted uploads are write-ahead objects, adopted by the
flusher at boot (``kafscale.flusher.recovery``), and compaction writes segments only below the
high watermark.

Judged by the segment format alone (``parse_segment(verify=True)``): a segment whose batches
frame, match their CRCs and run on without a gap is adopted even if a batch's records do not
decode (stored by something that never validated them): its bytes are whole, a producer may have
been told they were written, and every read path answers such a batch with an error for that
request only (``kafscale.shards.reads``).
"""

from __future__ import annotations

import logging

from kafscale.ipc import write_path
from kafscale.ipc.rpc import RpcClient, RpcError
from kafscale.metadata.records import SegmentRecord
from kafscale.shards.producers import ProducerStates
from kafscale.storage import segment as segments
from kafscale.storage.objects import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_MS = 10_000


def adopt_uncommitted(
    objects: ObjectStore,
    coordinator: RpcClient,
    namespace: str,
    topic: str,
    topic_id: str,
    partition: int,
    high_watermark: int,
    producers: ProducerStates,
    topic_created_ms: int = 0,
) -> int:
    """The partition's high watermark after adopting what can be adopted."""
    prefix = segments.segment_prefix(namespace, topic, partition)
    found = sorted(
        key
        for info in objects.list(prefix)
        if (key := segments.parse_segment_key(info.key)) is not None
        and key.kind == "kfs"
        and key.generation == 0  # the log cleaner's segments are never uncommitted uploads
        and key.base_offset >= high_watermark
    )
    for key in found:
        kfs = segments.segment_key(namespace, topic, partition, key.base_offset)
        index = segments.index_key(namespace, topic, partition, key.base_offset)
        if key.base_offset != high_watermark:
            _remove(objects, kfs, index, f"not contiguous with high watermark {high_watermark}")
            continue
        try:
            data = objects.get(kfs)
            parsed = segments.parse_segment(data)
        except (segments.CorruptSegment, ObjectNotFound) as exc:
            _remove(objects, kfs, index, str(exc))
            continue
        if parsed.created_ms < topic_created_ms:
            _remove(
                objects,
                kfs,
                index,
                "sealed before this topic was created: a leftover of a "
                "deleted topic of the same name",
            )
            continue
        adopted = ProducerStates.restore(producers.snapshot())
        for span in parsed.batches:
            adopted.record_batch(segments.read_batch_header(parsed.data, span.position))
        record = SegmentRecord(
            base_offset=parsed.base_offset,
            last_offset=parsed.last_offset,
            size=len(data),
            index_size=_size(objects, index),
            records=parsed.record_count,
            max_timestamp=max(
                segments.read_batch_header(parsed.data, s.position).max_timestamp
                for s in parsed.batches
            ),
            created_ms=parsed.created_ms,
        )
        request = write_path.CommitSegment(
            topic=topic,
            topic_id=topic_id,
            partition=partition,
            segment=record,
            producers=adopted.snapshot(),
        )
        try:
            reply = coordinator.call(request, timeout_ms=COMMIT_TIMEOUT_MS).message
        except RpcError as exc:
            raise RuntimeError(f"cannot adopt {kfs}: {exc}") from exc
        if not isinstance(reply, write_path.SegmentCommitted) or not reply.committed:
            raise RuntimeError(f"cannot adopt {kfs}: {reply}")
        log.warning(
            "adopted an uncommitted segment",
            extra={
                "key": kfs,
                "base_offset": parsed.base_offset,
                "last_offset": parsed.last_offset,
            },
        )
        high_watermark = reply.high_watermark
        producers.producers = adopted.producers
    return high_watermark


def _size(objects: ObjectStore, key: str) -> int:
    try:
        return objects.size(key)
    except ObjectNotFound:
        return 0  # an index is an accelerator; readers rebuild it from the segment


def _remove(objects: ObjectStore, kfs: str, index: str, reason: str) -> None:
    log.warning("removing an uncommitted segment", extra={"key": kfs, "reason": reason})
    objects.delete(index)
    objects.delete(kfs)
