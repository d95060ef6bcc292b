"""Segment (``.kfs``) and index (``.index``) objects: key names, building, parsing, verifying.

Sans-io: bytes in, values out. A segment is a sealed run of one partition's Kafka v2 record batches
(offsets assigned, contiguous), byte-compatible with the original Go KafScale. All integers are
big-endian; positions are byte offsets from the start of the ``.kfs`` object::

    header (32)  "KAFS" | version u16 = 1 | flags u16 | base offset i64 | record count i32
                 | created ms i64 | reserved u32 = 0
    body         the record batches, unchanged, back to back
    footer (16)  CRC32C(body) u32 | last offset i64 | "END!"

    .index       "IDX\\0" | version u16 = 1 | entry count i32 | interval i32 | reserved u16 = 0
                 then entries: offset i64 | position i32

Decisions, each taken from the Go writer (KafScale/platform, identical in scalytics/kafscale and
kamir/kafscale: pkg/storage/segment.go, index.go, types.go, recordbatch.go, log.go, recovery.go):

- Footer CRC is CRC32C (Castagnoli, ``crc32.MakeTable(crc32.Castagnoli)``) over the body only.
- Record count = the sum of the batches' ``records count`` fields (byte 57), not the batch count.
- Last offset = the last batch's base offset + its ``last offset delta`` (byte 23).
- Created = Unix milliseconds (``created.UnixMilli()``).
- Flags: the Go writer always writes 0 (it stores batches as produced). We write the codec the
  broker applied, in Kafka's own attribute codes (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), not
  the spec page's table (which gives snappy 1): 0 keeps its meaning either way. Flags are
  informational: every batch names its own codec in its attributes.
- Index magic is the four bytes ``IDX\\0``; the header order is magic, version, count, interval,
  reserved, as the spec lists it.
- Index positions count from the start of the ``.kfs`` object (header included): the Go reader
  sends them straight to an S3 range read. Entries sit at batch boundaries: one for the first
  batch, then one at the next batch that starts once ``interval`` records were passed since the
  last entry (``IndexBuilder.MaybeAdd``). The Go broker uses an interval of 100 records.

Cleaned segments (compacted topics, docs/design/ecosystem.md, section 4) are KafScale's extension:
header flag ``FLAG_CLEANED`` (bit 8; the low bits still name the codec). Their batches keep their
offsets with gaps between and inside them, so the header's base offset and the footer's last
offset give the range of offsets the segment covers (those of the segments it replaced), and
may hold no batch at all. Such a segment lives at a key of its own generation,
``segment-{base}.g{n}.kfs`` (generation 0 is the spec key), so a cleaning never overwrites what
a reader may be reading.

Invariants checked by ``parse_segment(verify=True)``, all reported as ``CorruptSegment``: both
magics, version 1, exact batch framing (magic 2, lengths inside the body, nothing left over), each
batch's own CRC32C, the footer CRC32C, offsets contiguous from the header's base offset to the
footer's last offset (cleaned: increasing, within them), and the header's record count. Not
covered by any checksum of the format: the header's flags, created timestamp and reserved field,
and the whole index (check an index against its segment with ``rebuild_index``).
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import crc32c

from kafscale.protocol import records
from kafscale.protocol.records import BatchHeader

SEGMENT_MAGIC = b"KAFS"
FOOTER_MAGIC = b"END!"
INDEX_MAGIC = b"IDX\x00"
FORMAT_VERSION = 1
DEFAULT_INDEX_INTERVAL = 100  # records between index entries, as the Go broker configures it
FLAG_CLEANED = 0x0100  # a segment the log cleaner wrote: offsets with gaps, maybe no batch

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

HEADER = struct.Struct(">4sHHqiqI")  # magic, version, flags, base, count, created, reserved
_FOOTER = struct.Struct(">Iq4s")
_INDEX_HEADER = struct.Struct(">4sHiiH")
_INDEX_ENTRY = struct.Struct(">qi")
HEADER_SIZE = HEADER.size  # 32
FOOTER_SIZE = _FOOTER.size  # 16
INDEX_HEADER_SIZE = _INDEX_HEADER.size  # 16
INDEX_ENTRY_SIZE = _INDEX_ENTRY.size  # 12

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

# The v2 batch header is read with kafscale.protocol.records (the one definition of its layout).
BATCH_HEADER_SIZE = records.HEADER.size  # 61
_LOG_OVERHEAD = records.LOG_OVERHEAD  # 12: base offset + batch length
_CRC_START = records.CRC_START  # 21


class CorruptSegment(Exception):
    """A segment or index that fails to parse or verify; the message says what and where."""


class CorruptBatch(CorruptSegment):
    """A batch whose framing and CRC are sound but whose records do not decode (or decompress
    past the bound): stored by something that did not validate it. The message names it and
    where it lies (an object key, for the log); ``fault`` says what is wrong without the
    location (for a client's error message)."""

    def __init__(self, where: str, fault: str) -> None:
        super().__init__(f"{where}: {fault}")
        self.fault = fault


class BatchSpan(NamedTuple):
    """Where one batch lies in a segment (``position`` from the start of the object)."""

    base_offset: int
    last_offset: int
    position: int
    length: int


class IndexEntry(NamedTuple):
    offset: int
    position: int


class SegmentKey(NamedTuple):
    namespace: str
    topic: str
    partition: int
    base_offset: int
    kind: Literal["kfs", "index"]
    generation: int = 0  # > 0: written by the log cleaner


@dataclass(frozen=True, slots=True)
class Segment:
    """A parsed segment: header and footer fields, the batch spans, and the bytes themselves."""

    version: int
    flags: int
    base_offset: int
    record_count: int
    created_ms: int
    crc: int
    last_offset: int
    batches: tuple[BatchSpan, ...]
    data: memoryview = field(repr=False, compare=False)

    @property
    def body(self) -> memoryview:
        """All batch bytes (what the footer CRC covers)."""
        return self.data[HEADER_SIZE : len(self.data) - FOOTER_SIZE]


@dataclass(frozen=True, slots=True)
class Index:
    version: int
    interval: int
    entries: tuple[IndexEntry, ...]

    def lookup(self, offset: int) -> int:
        """Position of the entry with the greatest offset <= ``offset``: scan forward from there.

        Raises ValueError when ``offset`` precedes every entry (it is not in this segment)."""
        i = bisect.bisect_right(self.entries, offset, key=lambda entry: entry.offset)
        if i == 0:
            raise ValueError(f"offset {offset} precedes every entry of the index")
        return self.entries[i - 1].position


# --- keys -------------------------------------------------------------------------------------

_KEY = re.compile(
    r"(?P<namespace>[^/]+)/(?P<topic>[^/]+)/(?P<partition>0|[1-9][0-9]*)"
    r"/segment-(?P<base_offset>[0-9]{20})(?:\.g(?P<generation>[1-9][0-9]{0,9}))?"
    r"\.(?P<kind>kfs|index)"
)


def segment_prefix(namespace: str, topic: str, partition: int) -> str:
    """The key prefix under which a partition's segments list in offset order."""
    for name, value in (("namespace", namespace), ("topic", topic)):
        if not value or "/" in value:
            raise ValueError(f"invalid {name} {value!r}: must be non-empty without '/'")
    if not 0 <= partition <= _INT32_MAX:
        raise ValueError(f"invalid partition {partition}")
    return f"{namespace}/{topic}/{partition}/"


def _object_key(
    namespace: str, topic: str, partition: int, base_offset: int, kind: str, generation: int
) -> str:
    if not 0 <= base_offset <= _INT64_MAX:
        raise ValueError(f"invalid base offset {base_offset}")
    if not 0 <= generation <= _INT32_MAX:
        raise ValueError(f"invalid generation {generation}")
    # 20 digits: lexicographic key order is offset order (and what the Go broker writes)
    cleaned = f".g{generation}" if generation else ""
    prefix = segment_prefix(namespace, topic, partition)
    return f"{prefix}segment-{base_offset:020d}{cleaned}.{kind}"


def segment_key(
    namespace: str, topic: str, partition: int, base_offset: int, generation: int = 0
) -> str:
    return _object_key(namespace, topic, partition, base_offset, "kfs", generation)


def index_key(
    namespace: str, topic: str, partition: int, base_offset: int, generation: int = 0
) -> str:
    return _object_key(namespace, topic, partition, base_offset, "index", generation)


def object_keys(
    namespace: str, topic: str, partition: int, base_offset: int, generation: int = 0
) -> tuple[str, str]:
    """A segment's two objects: its ``.kfs`` and its ``.index``."""
    return (
        segment_key(namespace, topic, partition, base_offset, generation),
        index_key(namespace, topic, partition, base_offset, generation),
    )


def parse_segment_key(key: str) -> SegmentKey | None:
    """The parts of a segment or index key, or None if ``key`` is not one we would write."""
    match = _KEY.fullmatch(key)
    if match is None:
        return None
    partition, base_offset = int(match["partition"]), int(match["base_offset"])
    if partition > _INT32_MAX or base_offset > _INT64_MAX:
        return None
    kind: Literal["kfs", "index"] = "kfs" if match["kind"] == "kfs" else "index"
    generation = int(match["generation"] or 0)
    if generation > _INT32_MAX:
        return None
    return SegmentKey(match["namespace"], match["topic"], partition, base_offset, kind, generation)


# --- batches ----------------------------------------------------------------------------------


def read_batch_header(data: bytes | memoryview, position: int = 0) -> BatchHeader:
    """The v2 batch header at ``position``; CorruptSegment if fewer than 61 bytes remain."""
    if len(data) - position < BATCH_HEADER_SIZE:
        raise CorruptSegment(
            f"batch at position {position}: {len(data) - position} bytes left, "
            f"a batch header needs {BATCH_HEADER_SIZE}"
        )
    return records.read_header(data, position)


def batch_crc(batch: bytes | memoryview) -> int:
    """The CRC32C a v2 batch should carry: over its bytes from ``attributes`` to the end."""
    return int(crc32c.crc32c(memoryview(batch)[_CRC_START:]))


# --- building ---------------------------------------------------------------------------------


def build_segment(
    batches: Sequence[bytes | memoryview],
    flags: int,
    created_ms: int,
    *,
    index_interval: int = DEFAULT_INDEX_INTERVAL,
    covers: tuple[int, int] | None = None,
) -> tuple[bytes, bytes]:
    """The ``.kfs`` and ``.index`` bytes of ``batches`` (complete v2 batches, offsets assigned
    and contiguous; with ``FLAG_CLEANED`` in ``flags``, increasing within ``covers``, the
    (base, last) offsets the segment stands for, and possibly none). Batch bytes are copied
    once, into the segment, which is then parsed and verified like any reader would:
    ValueError if it would not pass."""
    cleaned = bool(flags & FLAG_CLEANED)
    if cleaned != (covers is not None):
        raise ValueError("a cleaned segment, and only one, says which offsets it covers")
    if (not batches and not cleaned) or any(len(b) < BATCH_HEADER_SIZE for b in batches):
        raise ValueError("a segment needs one or more batches, each with a v2 batch header")
    if not 0 <= flags <= 0xFFFF:
        raise ValueError(f"flags {flags} do not fit in 16 bits")
    if not 1 <= index_interval <= _INT32_MAX:
        raise ValueError(f"index interval {index_interval} must be a positive int32")
    headers = [read_batch_header(batch) for batch in batches]
    record_count = sum(header.records_count for header in headers)
    base_offset, last_offset = (
        covers if covers is not None else (headers[0].base_offset, headers[-1].last_offset)
    )
    if not 0 <= record_count <= _INT32_MAX or sum(map(len, batches)) > _INT32_MAX - HEADER_SIZE:
        raise ValueError("too many records or bytes for one segment (int32 count and positions)")
    if base_offset < 0 or last_offset > _INT64_MAX or last_offset < base_offset:
        raise ValueError(f"offsets {base_offset}..{last_offset} out of range")
    if not -(2**63) <= created_ms <= _INT64_MAX:
        raise ValueError(f"created ms {created_ms} does not fit in an int64")
    crc = 0
    for batch in batches:
        crc = crc32c.crc32c(batch, crc)
    header = HEADER.pack(
        SEGMENT_MAGIC, FORMAT_VERSION, flags, base_offset, record_count, created_ms, 0
    )
    data = b"".join([header, *batches, _FOOTER.pack(crc, last_offset, FOOTER_MAGIC)])
    try:
        segment = parse_segment(data)
    except CorruptSegment as exc:
        raise ValueError(f"the batches do not make a valid segment: {exc}") from None
    return data, _build_index(segment, index_interval)


# --- parsing ----------------------------------------------------------------------------------


def _walk(view: memoryview, end: int, verify: bool, cleaned: bool) -> tuple[list[BatchSpan], int]:
    """The batches between the header and ``end``, and their total record count."""
    spans: list[BatchSpan] = []
    records = 0
    position = HEADER_SIZE
    while position < end:
        header = read_batch_header(view[:end], position)
        where = f"batch at position {position}"
        if header.magic != 2:
            raise CorruptSegment(f"{where}: magic {header.magic}, expected 2")
        if header.batch_length < BATCH_HEADER_SIZE - _LOG_OVERHEAD:
            raise CorruptSegment(f"{where}: batch length {header.batch_length} is too small")
        if position + header.size > end:
            raise CorruptSegment(
                f"{where}: {header.size} bytes claimed, {end - position} left before the footer"
            )
        if verify:
            computed = batch_crc(view[position : position + header.size])
            if computed != header.crc:
                raise CorruptSegment(
                    f"{where} (offsets {header.base_offset}..{header.last_offset}): CRC32C "
                    f"stored {header.crc:#010x}, computed {computed:#010x}"
                )
            expected = spans[-1].last_offset + 1 if spans else None
            follows = (
                expected is None
                or header.base_offset == expected
                or (cleaned and header.base_offset > expected)
            )
            if header.last_offset_delta < 0 or not follows:
                raise CorruptSegment(
                    f"{where}: offsets {header.base_offset}..{header.last_offset} "
                    f"do not continue from {expected}"
                )
        spans.append(BatchSpan(header.base_offset, header.last_offset, position, header.size))
        records += header.records_count
        position += header.size
    return spans, records


def parse_segment(data: bytes | memoryview, verify: bool = True) -> Segment:
    """Parse a ``.kfs`` object without copying it. Framing is always checked; ``verify`` adds
    every CRC and offset check listed in the module docstring."""
    view = memoryview(data).cast("B")
    size = len(view)
    if size < HEADER_SIZE + FOOTER_SIZE:
        raise CorruptSegment(f"segment is {size} bytes, less than its header and footer")
    magic, version, flags, base_offset, record_count, created_ms, _ = HEADER.unpack_from(view)
    if magic != SEGMENT_MAGIC:
        raise CorruptSegment(f"segment header at position 0: magic {magic!r}, expected b'KAFS'")
    if version != FORMAT_VERSION:
        raise CorruptSegment(f"segment header at position 4: unsupported version {version}")
    crc, last_offset, footer_magic = _FOOTER.unpack_from(view, size - FOOTER_SIZE)
    if footer_magic != FOOTER_MAGIC:
        raise CorruptSegment(
            f"segment footer at position {size - FOOTER_SIZE}: magic {footer_magic!r}, "
            "expected b'END!' (truncated or trailing bytes?)"
        )
    spans, records = _walk(view, size - FOOTER_SIZE, verify, bool(flags & FLAG_CLEANED))
    segment = Segment(
        version, flags, base_offset, record_count, created_ms, crc, last_offset, tuple(spans), view
    )
    if verify:
        _verify_totals(segment, records)
    return segment


def parse_footer(footer: bytes | memoryview, key: str) -> int:
    """The last offset in a segment's 16-byte footer (read alone, e.g. with a ranged GET)."""
    if len(footer) != FOOTER_SIZE:
        raise CorruptSegment(f"{key}: footer of {len(footer)} bytes, expected {FOOTER_SIZE}")
    _, last_offset, magic = _FOOTER.unpack(footer)
    if magic != FOOTER_MAGIC:
        raise CorruptSegment(f"{key}: footer magic {magic!r}, expected b'END!'")
    last: int = last_offset
    return last


def _verify_totals(segment: Segment, records: int) -> None:
    footer = len(segment.data) - FOOTER_SIZE
    cleaned = bool(segment.flags & FLAG_CLEANED)
    if not segment.batches and not cleaned:
        raise CorruptSegment("segment holds no batches")
    computed = crc32c.crc32c(segment.body)
    if computed != segment.crc:
        raise CorruptSegment(
            f"segment footer at position {footer}: CRC32C of the batches "
            f"stored {segment.crc:#010x}, computed {computed:#010x}"
        )
    if records != segment.record_count:
        raise CorruptSegment(
            f"segment header at position 16: record count {segment.record_count}, "
            f"batches hold {records}"
        )
    if cleaned:
        _verify_cleaned_range(segment, footer)
        return
    first, last = segment.batches[0].base_offset, segment.batches[-1].last_offset
    if first != segment.base_offset:
        raise CorruptSegment(
            f"segment header at position 8: base offset {segment.base_offset}, "
            f"first batch starts at {first}"
        )
    if last != segment.last_offset:
        raise CorruptSegment(
            f"segment footer at position {footer + 4}: last offset {segment.last_offset}, "
            f"last batch ends at {last}"
        )


def _verify_cleaned_range(segment: Segment, footer: int) -> None:
    """A cleaned segment's batches lie within the offsets it covers."""
    if segment.last_offset < segment.base_offset:
        raise CorruptSegment(
            f"segment footer at position {footer + 4}: last offset {segment.last_offset} "
            f"precedes the base offset {segment.base_offset}"
        )
    if segment.batches and (
        segment.batches[0].base_offset < segment.base_offset
        or segment.batches[-1].last_offset > segment.last_offset
    ):
        raise CorruptSegment(
            f"cleaned segment covering {segment.base_offset}..{segment.last_offset} holds "
            f"batches {segment.batches[0].base_offset}..{segment.batches[-1].last_offset}"
        )


def read_batches(segment: Segment, start_offset: int) -> memoryview:
    """The segment's bytes from the first batch that ends at or after ``start_offset`` to the
    last batch's end: the batch holding it, or, in a cleaned segment, the next one kept (none:
    empty).

    Raises ValueError when the offset is outside the segment."""
    if segment.flags & FLAG_CLEANED:
        first, last = segment.base_offset, segment.last_offset
    elif segment.batches:
        first, last = segment.batches[0].base_offset, segment.batches[-1].last_offset
    else:
        first, last = 0, -1
    if not first <= start_offset <= last:
        raise ValueError(f"offset {start_offset} is not in the segment at {segment.base_offset}")
    end = len(segment.data) - FOOTER_SIZE
    i = bisect.bisect_left(segment.batches, start_offset, key=lambda span: span.last_offset)
    return segment.data[segment.batches[i].position if i < len(segment.batches) else end : end]


# --- index ------------------------------------------------------------------------------------


def parse_index(data: bytes | memoryview) -> Index:
    """Parse a ``.index`` object; entries must increase in offset and position."""
    view = memoryview(data).cast("B")
    if len(view) < INDEX_HEADER_SIZE:
        raise CorruptSegment(f"index is {len(view)} bytes, less than its 16-byte header")
    magic, version, count, interval, _ = _INDEX_HEADER.unpack_from(view)
    if magic != INDEX_MAGIC:
        raise CorruptSegment(f"index header at position 0: magic {magic!r}, expected b'IDX\\x00'")
    if version != FORMAT_VERSION:
        raise CorruptSegment(f"index header at position 4: unsupported version {version}")
    if count < 0 or len(view) != INDEX_HEADER_SIZE + count * INDEX_ENTRY_SIZE:
        raise CorruptSegment(f"index of {len(view)} bytes does not hold the {count} entries")
    if interval < 1:
        raise CorruptSegment(f"index header at position 10: interval {interval}")
    entries = tuple(IndexEntry._make(e) for e in _INDEX_ENTRY.iter_unpack(view[INDEX_HEADER_SIZE:]))
    previous = IndexEntry(-1, HEADER_SIZE - 1)
    for i, entry in enumerate(entries):
        if entry.offset <= previous.offset or entry.position <= previous.position:
            raise CorruptSegment(
                f"index entry {i} at position {INDEX_HEADER_SIZE + i * INDEX_ENTRY_SIZE}: "
                f"{entry} does not follow {previous}"
            )
        previous = entry
    return Index(version, interval, entries)


def rebuild_index(
    segment_bytes: bytes | memoryview, index_interval: int = DEFAULT_INDEX_INTERVAL
) -> bytes:
    """The ``.index`` bytes ``build_segment`` wrote for this (verified) segment."""
    return _build_index(parse_segment(segment_bytes), index_interval)


def _build_index(segment: Segment, interval: int) -> bytes:
    """Entries at batch boundaries: the first batch, then the next batch to start once
    ``interval`` records were passed since the last entry (Go's ``IndexBuilder.MaybeAdd``)."""
    entries: list[bytes] = []
    since_last = 0
    for span in segment.batches:
        if not entries or since_last >= interval:
            entries.append(_INDEX_ENTRY.pack(span.base_offset, span.position))
            since_last = 0
        since_last += read_batch_header(segment.data, span.position).records_count
    header = _INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, len(entries), interval, 0)
    return header + b"".join(entries)
