"""Reading committed log entries from the object store: the blocking half of the read path.

These functions run on the shard's reader threads; they touch nothing but the object store (and,
for ``read_entries``, the metadata store) and their arguments, and hand back values the shard's
loop puts into its caches.

An entry is a spec segment (its batches at ``[32, size - 16)`` of the ``.kfs``, with an
``.index``) or a chunk of a write-ahead object (``size`` bytes of batches at ``position`` of the
object, no index); a ``SegmentRef`` says which bytes of which object, and everything here works
on either.

- ``read_index``: a segment's ``.index`` object, parsed.
- ``read_at`` / ``read_range``: the batches a fetch at ``offset`` needs, with ranged GETs: from
  the index entry at or before the offset (a chunk, or a segment without index: from its first
  batch), a window of about ``max_bytes``; more only when the batch holding the offset is not
  complete in it (a batch larger than the window, or an index entry far behind). In a segment
  the log cleaner wrote, the batch holding the offset may be gone: the batches from the first
  one ending after it, or None when no batch does (the fetch goes on to the next entry).
- ``read_segment``: a whole entry (read-ahead, timestamp lookups), every CRC verified; a chunk
  with one ranged GET.
- ``find_timestamp`` / ``search_segment``: ListOffsets by timestamp, the first record at or past a
  timestamp in a chunk (decoding records, decompression bounded by ``compression.read_limit``).
- ``read_entries``: a partition's entries as the metadata store lists them now (after a chunk's
  object was found gone: compacted and collected since the shard's list was loaded).

Every batch handed out has had its CRC32C checked: an entry corrupted at rest is reported as
``CorruptSegment`` naming the object (and, for a chunk, the position), never served. A batch whose
records do not decode is ``CorruptBatch`` naming the batch: that lookup fails, the shard goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kafscale.metadata import records as metadata
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.metadata.store import MetadataStore
from kafscale.protocol import records
from kafscale.protocol.compression import CorruptCompressedData, read_limit
from kafscale.protocol.records import CorruptRecordBatch
from kafscale.shards.cache import Chunk
from kafscale.storage import chunks
from kafscale.storage import segment as segments
from kafscale.storage.objects import ObjectNotFound, ObjectStore
from kafscale.storage.segment import CorruptBatch, CorruptSegment, Index

log = logging.getLogger(__name__)

MIN_WINDOW = 64 * 1024  # a ranged GET smaller than this costs about as much as this
INDEX_SLACK = 32 * 1024  # index entries are ~100 records apart: the target is a bit further on


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """A committed entry and where its batches lie: ``[start, end)`` of object ``key``, and
    the key of its index (a segment's ``.index``; None for a chunk)."""

    record: SegmentRecord
    key: str
    index_key: str | None
    start: int
    end: int

    @classmethod
    def of(cls, namespace: str, topic: str, partition: int, record: SegmentRecord) -> SegmentRef:
        if record.is_chunk:
            return cls(record, record.object, None, record.position, record.position + record.size)
        base, generation = record.base_offset, record.generation
        return cls(
            record,
            segments.segment_key(namespace, topic, partition, base, generation),
            segments.index_key(namespace, topic, partition, base, generation),
            segments.HEADER_SIZE,
            record.size - segments.FOOTER_SIZE,
        )

    @property
    def where(self) -> str:
        """The entry for messages: a segment's key; a chunk's object and position."""
        return self.key if self.index_key is not None else f"{self.key} (chunk at {self.start})"


def read_index(objects: ObjectStore, ref: SegmentRef) -> Index:
    """The segment's index (a chunk has none: ValueError)."""
    if ref.index_key is None:
        raise ValueError(f"{ref.where} has no index")
    data = objects.get(ref.index_key)
    try:
        return segments.parse_index(data)
    except CorruptSegment as exc:
        raise CorruptSegment(f"{ref.index_key}: {exc}") from None


def read_segment(objects: ObjectStore, ref: SegmentRef) -> Chunk:
    """The whole entry as one chunk; raises CorruptSegment if anything fails to verify."""
    if ref.index_key is None:
        return _read_chunk(objects, ref)
    data = objects.get(ref.key)
    try:
        parsed = segments.parse_segment(data, verify=True)
    except CorruptSegment as exc:
        raise CorruptSegment(f"{ref.key}: {exc}") from None
    if parsed.base_offset != ref.record.base_offset or parsed.last_offset != ref.record.last_offset:
        raise CorruptSegment(
            f"{ref.key}: holds offsets {parsed.base_offset}..{parsed.last_offset}, "
            f"committed as {ref.record.base_offset}..{ref.record.last_offset}"
        )
    start = segments.HEADER_SIZE
    return Chunk(
        data=parsed.body,
        first_offset=parsed.base_offset,
        starts=tuple(span.position - start for span in parsed.batches),
        lasts=tuple(span.last_offset for span in parsed.batches),
        complete=True,
    )


def _read_chunk(objects: ObjectStore, ref: SegmentRef) -> Chunk:
    """A chunk of a write-ahead object: one ranged GET, every batch verified, its offsets
    exactly those it was committed with."""
    length = ref.end - ref.start
    data = objects.get(ref.key, ref.start, length)
    if len(data) != length:
        raise CorruptSegment(
            f"{ref.where}: {len(data)} bytes, committed as {length} (the object is shorter)"
        )
    record = ref.record
    spans = chunks.verify_chunk(data, ref.key, ref.start, record.base_offset, record.last_offset)
    return Chunk(
        data=data,
        first_offset=record.base_offset,
        starts=tuple(span.position for span in spans),
        lasts=tuple(span.last_offset for span in spans),
        complete=True,
    )


def read_at(
    objects: ObjectStore, ref: SegmentRef, index: Index | None, offset: int, max_bytes: int
) -> tuple[Index | None, Chunk | None]:
    """A fetch's ranged read (``read_range``) of the batches at ``offset``, fetching a
    segment's index first if not cached. An index that is missing or corrupt is only an
    accelerator lost: read from the first batch (as for a chunk, which has none)."""
    if index is None and ref.index_key is not None:
        try:
            index = read_index(objects, ref)
        except (CorruptSegment, ObjectNotFound) as exc:
            log.warning(
                "index unusable; reading the segment from its start", extra={"error": str(exc)}
            )
    return index, read_range(objects, ref, index, offset, max_bytes)


def read_range(
    objects: ObjectStore, ref: SegmentRef, index: Index | None, offset: int, max_bytes: int
) -> Chunk | None:
    """Whole batches from the one holding ``offset`` (in a cleaned segment: the first ending at
    or after it; None if none does): at least that one, and the ones after it that arrived in
    the same window. Raises CorruptSegment."""
    position = ref.start
    if index is not None and index.entries and index.entries[0].offset <= offset:
        position = index.lookup(offset)
    window = max(max_bytes, MIN_WINDOW) + INDEX_SLACK
    start, buf, at = position, b"", 0  # buf: object bytes from ``start``; at: the batch looked at
    while True:
        if len(buf) - at < segments.BATCH_HEADER_SIZE:
            start, buf, at = start + at, buf[at:], 0
            if ref.record.generation and start + len(buf) >= ref.end:
                return None  # a cleaned segment's batches all end before the offset
            buf = _extend(objects, ref, start, buf, window)
        header = records.read_header(buf, at)
        if header.magic != 2 or header.size < segments.BATCH_HEADER_SIZE:
            raise CorruptSegment(f"{ref.key}: no record batch at position {start + at}")
        if header.last_offset < offset:  # before the one we need: skip it, read or not
            at += header.size
            if at > len(buf):
                start, buf, at = start + at, b"", 0
            continue
        if at + header.size > len(buf):
            buf = _extend(objects, ref, start, buf, at + header.size - len(buf))
        return _chunk(ref, start + at, memoryview(buf)[at:])


def _extend(objects: ObjectStore, ref: SegmentRef, start: int, buf: bytes, more: int) -> bytes:
    """``buf`` (the object's bytes from ``start``) and up to ``more`` bytes after it."""
    position = start + len(buf)
    length = min(more, ref.end - position)
    if length <= 0:
        raise CorruptSegment(f"{ref.where}: a batch runs past the end of the batches")
    got = objects.get(ref.key, position, length)
    if len(got) != length:
        raise CorruptSegment(
            f"{ref.key}: {len(got)} bytes at position {position}, expected {length} "
            f"(the object is shorter than its committed entry, {ref.end} bytes)"
        )
    return buf + got if buf else got


def _chunk(ref: SegmentRef, position: int, data: memoryview) -> Chunk:
    """The whole batches at the start of ``data`` (read from ``position``), CRCs checked. A
    batch that is not sound ends the chunk there; it is an error only when it comes first, so
    the batches before it are still served and only a fetch of its own offsets fails."""
    starts: list[int] = []
    lasts: list[int] = []
    end = 0
    fault = ""
    while end + segments.BATCH_HEADER_SIZE <= len(data):
        header = records.read_header(data, end)
        where = f"{ref.key}: batch at position {position + end}"
        if header.magic != 2 or header.size < segments.BATCH_HEADER_SIZE:
            fault = f"{where}: no record batch (magic {header.magic}, {header.size} bytes)"
            break
        if end + header.size > len(data):
            break  # the end of the window
        batch = data[end : end + header.size]
        if segments.batch_crc(batch) != header.crc:
            fault = f"{where} (offsets {header.base_offset}..{header.last_offset}) fails its CRC32C"
            break
        starts.append(end)
        lasts.append(header.last_offset)
        end += header.size
    if not starts:
        raise CorruptSegment(fault or f"{ref.key}: no whole batch at position {position}")
    first = records.read_header(data, 0).base_offset
    return Chunk(data[:end], first, tuple(starts), tuple(lasts), complete=False)


def search_segment(
    objects: ObjectStore, ref: SegmentRef, timestamp: int, exact: bool, factor: int
) -> tuple[Chunk, tuple[int, int] | None]:
    """The whole entry (for the cache) and ``find_timestamp`` in it."""
    chunk = read_segment(objects, ref)
    return chunk, find_timestamp(chunk, timestamp, exact, factor, ref.where)


def find_timestamp(
    chunk: Chunk, timestamp: int, exact: bool, factor: int, where: str
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record whose timestamp is >= ``timestamp`` (== with
    ``exact``), or None. Only batches whose max_timestamp reaches it are decoded, each to at most
    ``factor`` times max(Kafka's max.message.bytes, its size). Raises ``CorruptBatch`` naming the
    batch (in ``where``) whose records do not decode."""
    for i in range(len(chunk.starts)):
        batch = chunk.batch_bytes(i)
        header = records.read_header(batch)
        if header.max_timestamp < timestamp:
            continue
        try:
            for record in records.iter_records(batch, read_limit(len(batch), factor)):
                if record.timestamp == timestamp or (not exact and record.timestamp > timestamp):
                    return record.offset, record.timestamp
        except (CorruptRecordBatch, CorruptCompressedData) as exc:
            raise CorruptBatch(
                where,
                f"batch of offsets {header.base_offset}..{header.last_offset} "
                f"does not decode: {exc}",
            ) from None
    return None


def read_entries(
    store: MetadataStore, namespace: str, topic: str, partition: int
) -> list[SegmentRecord]:
    """The partition's committed entries as the metadata store lists them now."""
    prefix = Keys(namespace).segments(topic, partition)
    return [metadata.decode_segment(kv.value) for kv in store.get_prefix(prefix)]
