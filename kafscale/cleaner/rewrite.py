"""The log cleaner's rewrite of record batches: pure, batches in, batches out
(docs/design/ecosystem.md, section 4.2).

``OffsetMap`` holds, for each key of the dirty section, the offset of its latest record (by a
16-byte digest of the key, as Kafka's ``SkimpyOffsetMap`` holds an MD5 of it), within a memory
bound. ``clean_batch`` keeps a batch's records that Kafka's ``LogCleaner.shouldRetainRecord``
keeps:

- a record without a key is dropped (a compacted log holds keyed records only);
- a record whose key has a later offset in the map is dropped (it is superseded);
- a tombstone (a null value) is dropped once its batch's delete horizon has passed (KIP-534: the
  first cleaning that keeps a tombstone stamps its batch with ``now + delete.retention.ms``, so a
  consumer reading from the start within that time still sees the deletion).

A kept batch keeps its base offset, last offset delta, leader epoch, producer id, epoch and
sequence, timestamp type and codec; its records keep their bytes (so their offsets and
timestamps) unless a horizon is stamped, which moves the batch's base timestamp to the horizon
and re-encodes the records' timestamp deltas against it, as Kafka does. A batch left with no
record is dropped. A batch with nothing to drop and no horizon to stamp comes back unchanged.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kafscale.protocol import records
from kafscale.protocol.compression import compress
from kafscale.protocol.records import (
    DELETE_HORIZON_MASK,
    LOG_OVERHEAD,
    RECORDS_OFFSET,
    BatchHeader,
    Record,
    TimestampType,
)

DIGEST_BYTES = 16
# What one map entry costs in memory (a 16-byte bytes object, an int, a dict slot), for the
# bound KAFSCALE_CLEANER_BUFFER_BYTES sets.
ENTRY_BYTES = 128


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=DIGEST_BYTES).digest()


class OffsetMap:
    """Key digest -> the offset of the key's latest record seen, for at most ``capacity_bytes``
    of entries (``full`` once reached: the caller stops adding at a segment's end)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.slots = max(1, capacity_bytes // ENTRY_BYTES)
        self._latest: dict[bytes, int] = {}
        self.last_offset = -1  # the largest offset added

    def __len__(self) -> int:
        return len(self._latest)

    @property
    def full(self) -> bool:
        return len(self._latest) >= self.slots

    def add(self, key: bytes | None, offset: int) -> None:
        if key is not None:
            digest = key_digest(key)
            if offset > self._latest.get(digest, -1):
                self._latest[digest] = offset
        self.last_offset = max(self.last_offset, offset)

    def add_batch(self, batch: bytes | memoryview) -> None:
        for record in records.iter_records(batch):
            self.add(record.key, record.offset)

    def latest(self, key: bytes) -> int | None:
        return self._latest.get(key_digest(key))


@dataclass(frozen=True, slots=True)
class Cleaning:
    """What one cleaning knows: the map, the clock, the topic's settings."""

    offsets: OffsetMap
    now_ms: int
    delete_retention_ms: int
    level: int | None = None  # the codec's compression level (None: its default)

    def keeps(self, record: Record, horizon: int | None) -> bool:
        """Whether ``record`` stays; ``horizon`` is its batch's delete horizon, if stamped."""
        if record.key is None:
            return False
        latest = self.offsets.latest(record.key)
        if latest is not None and latest > record.offset:
            return False
        return not (record.value is None and horizon is not None and horizon <= self.now_ms)


def clean_batch(batch: bytes | memoryview, cleaning: Cleaning) -> bytes | None:
    """``batch`` with only the records ``cleaning`` keeps (the same bytes when it keeps all and
    stamps no horizon); None when it keeps none. Control batches are kept whole (there are no
    transactions here; Kafka removes only markers whose transactions are cleaned)."""
    view = memoryview(batch)
    header = records.read_header(view)
    if header.is_control:
        return bytes(view)
    horizon = header.base_timestamp if header.has_delete_horizon else None
    kept = [
        (record, raw)
        for record, raw in records.iter_raw_records(view)
        if cleaning.keeps(record, horizon)
    ]
    if not kept:
        return None
    stamp = horizon is None and any(record.value is None for record, _ in kept)
    if not stamp and len(kept) == header.records_count:
        return bytes(view)
    if stamp:
        horizon = cleaning.now_ms + cleaning.delete_retention_ms
        body = _reencoded(header, [record for record, _ in kept], horizon)
    else:
        body = b"".join(bytes(raw) for _, raw in kept)
    return _batch(header, kept, body, horizon if stamp else None, cleaning.level)


def _reencoded(header: BatchHeader, kept: list[Record], horizon: int) -> bytes:
    """The records written again with timestamp deltas from ``horizon`` (their offsets and
    timestamps unchanged). LogAppendTime records keep their deltas: their timestamp is the
    batch's max timestamp, whatever the deltas say."""
    out = io.BytesIO()
    append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    for record in kept:
        delta = 0 if append_time else record.timestamp - horizon
        records.write_record(
            out,
            record.offset - header.base_offset,
            delta,
            record.key,
            record.value,
            record.headers,
        )
    return out.getvalue()


def _batch(
    header: BatchHeader,
    kept: list[tuple[Record, memoryview]],
    body: bytes,
    horizon: int | None,
    level: int | None,
) -> bytes:
    attributes = header.attributes
    base_timestamp = header.base_timestamp
    if horizon is not None:
        attributes |= DELETE_HORIZON_MASK
        base_timestamp = horizon
    max_timestamp = header.max_timestamp
    if header.timestamp_type == TimestampType.CREATE_TIME:
        max_timestamp = max(record.timestamp for record, _ in kept)
    section = compress(header.codec, body, level) if header.codec else body
    rebuilt = BatchHeader(
        base_offset=header.base_offset,
        batch_length=RECORDS_OFFSET - LOG_OVERHEAD + len(section),
        partition_leader_epoch=header.partition_leader_epoch,
        magic=header.magic,
        crc=0,
        attributes=attributes,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records_count=len(kept),
    )
    out = bytearray(rebuilt.pack()) + section
    records.write_crc(out, 0, len(out))
    return bytes(out)


def fill(offsets: OffsetMap, dirty: Iterable[Sequence[bytes | memoryview]]) -> int:
    """Add the dirty segments' records to the map, segment by segment, until it is full (a
    segment that filled it is in); the number of segments taken. ``dirty`` may be lazy: no
    segment after the last taken is asked for."""
    taken = 0
    for segment in dirty:
        for batch in segment:
            offsets.add_batch(batch)
        taken += 1
        if offsets.full:
            break
    return taken


def clean_segment(segment: Iterable[bytes | memoryview], cleaning: Cleaning) -> list[bytes]:
    """A segment's batches as ``cleaning`` leaves them (batches left empty dropped)."""
    return [kept for batch in segment if (kept := clean_batch(batch, cleaning)) is not None]


def clean_segments(
    clean: Sequence[Sequence[bytes | memoryview]],
    dirty: Sequence[Sequence[bytes | memoryview]],
    offsets: OffsetMap,
    now_ms: int,
    delete_retention_ms: int,
    level: int | None = None,
) -> list[list[bytes]]:
    """One cleaning of a log's clean and dirty sections (each segment its batches, in offset
    order): the map takes the dirty segments (``fill``), and every segment up to the last one
    it took is rewritten. Returns the rewritten segments' batches, one list per segment from the
    log start (a list may be empty); dirty segments after them are not cleaned this time."""
    taken = fill(offsets, dirty)
    if not taken:
        return []
    cleaning = Cleaning(offsets, now_ms, delete_retention_ms, level)
    return [clean_segment(segment, cleaning) for segment in [*clean, *dirty[:taken]]]
