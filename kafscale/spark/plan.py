"""Planning a read on the driver: resolve the bounds to offsets, then cut the log entries in
range into slices, one Spark input partition each.

Bounds follow Spark's Kafka source: the range read from a partition is ``[start, end)``; a
timestamp resolves to the first offset whose record has a timestamp >= it (what Kafka's
``offsetsForTimes`` answers). A starting timestamp that no record reaches fails the read
(``startingOffsetsByTimestampStrategy=error``, the default) or starts at the end (``latest``); an
ending timestamp that none reaches ends at the high watermark.

Slices never cross an entry. A chunk of a write-ahead object (small, no index) is always one
slice, read with one ranged GET, every batch's CRC32C and its committed offsets checked. A
segment wholly inside the range and no larger than ``splitBytes`` is one slice, read with one
GET and checked against its footer CRC. Otherwise the segment's
``.index`` places the cut: the range starts at the entry at or before the first wanted offset and
stops at the first entry at or past the end, so the records outside are not downloaded; a range
larger than ``splitBytes`` is cut at index entries into several slices. Entries outside the range
are never touched, nor are their indexes.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafscale.protocol import records
from kafscale.spark.catalog import Catalog, CatalogError, PartitionLog, SegmentInfo
from kafscale.spark.options import EARLIEST, LATEST, Bound, ReadOptions
from kafscale.storage import ObjectNotFound, ObjectStore, chunks
from kafscale.storage import segment as segments
from kafscale.storage.segment import CorruptSegment, IndexEntry

log = logging.getLogger(__name__)


class BoundError(Exception):
    """The requested bounds cannot be honoured (data lost to retention, an offset past the
    high watermark, a starting timestamp no record reaches)."""


@dataclass(frozen=True, slots=True)
class Slice:
    """A byte range of one log entry and the offsets to keep from it."""

    topic: str
    partition: int
    key: str  # the .kfs object, or a chunk's write-ahead object
    base_offset: int  # the entry's first and last offsets, as the catalog knows them
    last_offset: int
    start: int  # object positions of the first batch read and just past the last one
    end: int
    whole: bool  # the whole entry: verify all the format allows (a segment's footer CRC too)
    from_offset: int  # records kept: [from_offset, until_offset)
    until_offset: int
    chunk: bool = False  # a chunk of a write-ahead object: [start, end) is all of it


@dataclass(frozen=True, slots=True)
class PartitionRange:
    topic: str
    partition: int
    start: int
    end: int


ReadSegment = Callable[[SegmentInfo], Sequence[memoryview]]  # an entry's batches, verified


def plan(options: ReadOptions, catalog: Catalog, objects: ObjectStore) -> list[Slice]:
    topics = catalog.topics(options.selection)
    slices: list[Slice] = []
    for topic, count in topics.items():
        wanted: tuple[int, ...] = tuple(range(count))
        if options.selection.assign is not None:
            wanted = options.selection.assign[topic]
            missing = [p for p in wanted if p >= count]
            if missing:
                raise CatalogError(
                    f"assign: topic {topic!r} has {count} partitions, no partition {missing}"
                )
        for partition in wanted:
            partition_log = catalog.partition(topic, partition)
            reader = SegmentReader(objects)
            span = resolve(options, partition_log, reader.read)
            slices.extend(cut(span, partition_log, objects, options.split_bytes))
    return slices


def resolve(options: ReadOptions, partition_log: PartitionLog, read: ReadSegment) -> PartitionRange:
    """The offsets ``[start, end)`` to read from one partition."""
    name = f"{partition_log.topic}-{partition_log.partition}"
    low, high = partition_log.log_start, partition_log.high_watermark
    start = _start(options, partition_log, read)
    if start < low:
        if options.fail_on_data_loss:
            raise BoundError(
                f"{name}: starting offset {start} is no longer available (the log starts at "
                f"{low}: older records were deleted by retention); set failOnDataLoss=false to "
                "start at the log start instead"
            )
        log.warning("starting at the log start", extra={"partition": name, "asked": start})
        start = low
    if start > high:
        raise BoundError(f"{name}: starting offset {start} is past the high watermark {high}")
    end = _end(options, partition_log, read)
    if end > high:
        raise BoundError(
            f"{name}: ending offset {end} is past the high watermark {high} (only committed "
            "records can be read)"
        )
    if end < start:
        raise BoundError(f"{name}: ending offset {end} is before the starting offset {start}")
    return PartitionRange(partition_log.topic, partition_log.partition, start, end)


def _value(bound: Bound, partition_log: PartitionLog) -> int:
    topic = bound.specific.get(partition_log.topic, {})
    return topic.get(partition_log.partition, bound.default)


def _start(options: ReadOptions, partition_log: PartitionLog, read: ReadSegment) -> int:
    value = _value(options.starting, partition_log)
    if value == EARLIEST:
        return partition_log.log_start
    if options.starting.kind == "offset":
        return value
    found = offset_for_timestamp(partition_log, value, read)
    if found is not None:
        return found
    if options.start_timestamp_strategy == "latest":
        return partition_log.high_watermark
    raise BoundError(
        f"{partition_log.topic}-{partition_log.partition}: no record has a timestamp at or after "
        f"the starting timestamp {value}; set startingOffsetsByTimestampStrategy=latest to read "
        "nothing from such partitions instead"
    )


def _end(options: ReadOptions, partition_log: PartitionLog, read: ReadSegment) -> int:
    value = _value(options.ending, partition_log)
    if value == LATEST:
        return partition_log.high_watermark
    if options.ending.kind == "offset":
        return value
    found = offset_for_timestamp(partition_log, value, read)
    return partition_log.high_watermark if found is None else found


def offset_for_timestamp(
    partition_log: PartitionLog, timestamp: int, read: ReadSegment
) -> int | None:
    """The first offset whose record's timestamp is >= ``timestamp``, or None.

    With every entry's max timestamp known (from the metadata store) only the one entry holding
    the answer is read: the first whose running maximum reaches ``timestamp``. Otherwise
    segments are read in order until one holds it."""
    candidates = list(partition_log.segments)
    if all(s.max_timestamp is not None for s in candidates):
        running, highest = [], -1
        for s in candidates:
            highest = max(highest, s.max_timestamp or -1)
            running.append(highest)
        candidates = candidates[bisect.bisect_left(running, timestamp) :][:1]
    for segment in candidates:
        found = _first_reaching(read(segment), timestamp, partition_log.log_start)
        if found is not None:
            return found
    return None


def _first_reaching(batches: Sequence[memoryview], timestamp: int, log_start: int) -> int | None:
    for batch in batches:
        header = records.read_header(batch)
        if header.max_timestamp < timestamp or header.is_control or header.last_offset < log_start:
            continue
        for record in records.iter_records(batch):
            if record.offset >= log_start and record.timestamp >= timestamp:
                return record.offset
    return None


class SegmentReader:
    """Whole entries for timestamp lookups, read once each and verified."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        self.read_keys: list[str] = []

    def read(self, segment: SegmentInfo) -> list[memoryview]:
        self.read_keys.append(segment.key)
        chunk = (segment.start, segment.end) if segment.is_chunk else None
        return read_whole(
            self.objects, segment.key, segment.base_offset, segment.last_offset, chunk
        )


def read_whole(
    objects: ObjectStore,
    key: str,
    base_offset: int,
    last_offset: int,
    chunk: tuple[int, int] | None = None,
) -> list[memoryview]:
    """The batches of a whole entry, every CRC verified and its offsets checked against the
    catalog's: the segment at ``key``, or the chunk at ``[start, end)`` of object ``key``."""
    if chunk is not None:
        return _read_chunk(objects, key, base_offset, last_offset, *chunk)
    try:
        data = objects.get(key)
    except ObjectNotFound:
        raise CorruptSegment(
            f"{objects.description}: segment {key} is gone (deleted by retention or with its "
            "topic while the read ran?)"
        ) from None
    try:
        parsed = segments.parse_segment(data, verify=True)
    except CorruptSegment as exc:
        raise CorruptSegment(f"{objects.description}: segment {key}: {exc}") from None
    if parsed.base_offset != base_offset or parsed.last_offset != last_offset:
        raise CorruptSegment(
            f"{objects.description}: segment {key} holds offsets {parsed.base_offset}.."
            f"{parsed.last_offset}, expected {base_offset}..{last_offset}"
        )
    return [parsed.data[s.position : s.position + s.length] for s in parsed.batches]


def _read_chunk(
    objects: ObjectStore, key: str, base_offset: int, last_offset: int, start: int, end: int
) -> list[memoryview]:
    """A chunk of a write-ahead object: one ranged GET, verified."""
    where = f"{objects.description}: write-ahead object {key}"
    try:
        data = memoryview(objects.get(key, start, end - start))
    except ObjectNotFound:
        raise CorruptSegment(
            f"{where} is gone (its chunks were compacted into a segment and the object collected "
            "while the read ran: read again)"
        ) from None
    if len(data) != end - start:
        raise CorruptSegment(
            f"{where}: {len(data)} bytes at position {start}, the chunk has {end - start}"
        )
    spans = chunks.verify_chunk(data, where, start, base_offset, last_offset)
    return [data[s.position : s.position + s.length] for s in spans]


def cut(
    span: PartitionRange, partition_log: PartitionLog, objects: ObjectStore, split_bytes: int
) -> list[Slice]:
    """The slices covering ``span``: only segments that hold part of it, only the bytes that do."""
    slices: list[Slice] = []
    if span.start >= span.end:
        return slices
    for segment in partition_log.segments:
        if segment.last_offset < span.start or segment.base_offset >= span.end:
            continue
        body_end = segment.end
        inside = span.start <= segment.base_offset and segment.last_offset < span.end
        if segment.is_chunk or (inside and segment.size <= split_bytes):
            slices.append(_slice(span, segment, segment.start, body_end, whole=True))
            continue
        entries = _index_entries(objects, segment)
        first, stop = _positions(entries, segment, span, body_end)
        cuts = _cuts(entries, first, stop, split_bytes)
        whole = first == segment.start and stop == body_end and len(cuts) == 2
        for start, end in itertools.pairwise(cuts):
            slices.append(_slice(span, segment, start, end, whole=whole))
    return slices


def _slice(span: PartitionRange, segment: SegmentInfo, start: int, end: int, whole: bool) -> Slice:
    return Slice(
        topic=span.topic,
        partition=span.partition,
        key=segment.key,
        base_offset=segment.base_offset,
        last_offset=segment.last_offset,
        start=start,
        end=end,
        whole=whole,
        from_offset=max(span.start, segment.base_offset),
        until_offset=min(span.end, segment.end_offset),
        chunk=segment.is_chunk,
    )


def _index_entries(objects: ObjectStore, segment: SegmentInfo) -> list[IndexEntry]:
    """The segment's index entries; none (read from the start) if the index is missing, as an
    index is an accelerator, never a requirement."""
    assert segment.index_key is not None, "chunks are never cut"
    try:
        data = objects.get(segment.index_key)
    except ObjectNotFound:
        log.warning("segment has no index; reading it from the start", extra={"key": segment.key})
        return []
    try:
        index = segments.parse_index(data)
    except CorruptSegment as exc:
        raise CorruptSegment(f"{objects.description}: index {segment.index_key}: {exc}") from None
    entries = [e for e in index.entries if e.position < segment.end]
    if len(entries) != len(index.entries) or (entries and entries[0].offset != segment.base_offset):
        raise CorruptSegment(
            f"{objects.description}: index {segment.index_key} does not match its segment "
            f"(first entry {index.entries[0] if index.entries else None}, segment of "
            f"{segment.size} bytes from offset {segment.base_offset})"
        )
    return entries


def _positions(
    entries: list[IndexEntry], segment: SegmentInfo, span: PartitionRange, body_end: int
) -> tuple[int, int]:
    """Object positions bounding the batches that hold ``span``'s part of the segment."""
    offsets = [e.offset for e in entries]
    first = segment.start
    i = bisect.bisect_right(offsets, span.start) - 1
    if i >= 0:
        first = entries[i].position
    stop = body_end
    j = bisect.bisect_left(offsets, span.end)
    if j < len(entries):
        stop = entries[j].position
    return first, stop


def _cuts(entries: list[IndexEntry], first: int, stop: int, split_bytes: int) -> list[int]:
    """Batch boundaries from ``first`` to ``stop``, about ``split_bytes`` apart."""
    cuts = [first]
    for entry in entries:
        if first < entry.position < stop and entry.position - cuts[-1] >= split_bytes:
            cuts.append(entry.position)
    cuts.append(stop)
    return cuts
