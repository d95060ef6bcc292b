"""Kafka v2 record batches (magic 2), kept opaque: only the 61-byte batch header is parsed.

Owns the header layout (``HEADER``, offsets derived from ``FIELDS``), the edits a broker makes in
place, whole-batch compression, and a record reader and writer for tests, fetch-side tools and
the flusher. What a broker accepts from a client is decided in ``kafscale.protocol.validate``.

Invariants:
- offsets are assigned by writing the base offset, never by re-encoding: ``patch_base_offset`` and
  ``patch_leader_epoch`` touch only bytes before the CRC'd range, so the CRC stays valid;
- every function that changes a byte from ``attributes`` onwards rewrites the CRC32C;
- a batch that fails to parse record by record raises ``CorruptRecordBatch`` (or
  ``CorruptCompressedData`` for its compressed section); decompression is always bounded
  (``compression.read_limit`` unless the caller knows better).

Layout: DefaultRecordBatch.java and DefaultRecord.java (KIP-98,
https://cwiki.apache.org/confluence/display/KAFKA/KIP-98+-+Exactly+Once+Delivery+and+Transactional+Messaging).
"""

from __future__ import annotations

import dataclasses
import enum
import io
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import crc32c
from kio.serial.errors import BufferUnderflow
from kio.serial.readers import read_signed_varint, read_signed_varlong
from kio.serial.writers import write_signed_varint, write_signed_varlong

from kafscale.protocol.compression import Bytes, Codec, compress, decompress, read_limit
from kafscale.protocol.errors import DecodeError, ErrorCode

#: The v2 batch header in wire order, as (field, struct code); every offset below derives from it.
FIELDS = (
    ("base_offset", "q"),  # first offset of the batch: 0 from producers, assigned by the broker
    ("batch_length", "i"),  # bytes after this field, to the end of the batch
    ("partition_leader_epoch", "i"),  # set by the broker; outside the CRC like base_offset
    ("magic", "b"),  # 2
    ("crc", "I"),  # CRC32C of every byte from attributes to the end of the batch
    ("attributes", "h"),  # codec, timestamp type, transactional, control, delete horizon
    ("last_offset_delta", "i"),  # offset delta of the last record: records_count - 1
    ("base_timestamp", "q"),  # the first record's timestamp (Kafka: firstTimestamp)
    ("max_timestamp", "q"),  # the largest record timestamp, or the LogAppendTime
    ("producer_id", "q"),  # -1 unless idempotent or transactional
    ("producer_epoch", "h"),
    ("base_sequence", "i"),  # -1 unless idempotent or transactional
    ("records_count", "i"),
)
HEADER = struct.Struct(">" + "".join(code for _, code in FIELDS))
OFFSETS = {
    name: struct.calcsize(">" + "".join(code for _, code in FIELDS[:index]))
    for index, (name, _) in enumerate(FIELDS)
}
FIELD_STRUCTS = {name: struct.Struct(">" + code) for name, code in FIELDS}
#: Bytes before the batch length counts: base offset and the length itself (Kafka's LOG_OVERHEAD).
LOG_OVERHEAD = OFFSETS["partition_leader_epoch"]
CRC_START = OFFSETS["attributes"]
RECORDS_OFFSET = HEADER.size
#: The smallest batch_length Kafka's iterator accepts before reading the magic byte (a v0 record).
LEGACY_MIN_LENGTH = 14
MAGIC = 2

CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class CorruptRecordBatch(DecodeError):
    """A batch, or a record inside it, that does not parse."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(bool(self.attributes & TIMESTAMP_TYPE_MASK))

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    def pack(self) -> bytes:
        return HEADER.pack(*dataclasses.astuple(self))


assert tuple(f.name for f in dataclasses.fields(BatchHeader)) == tuple(n for n, _ in FIELDS)


@dataclass(frozen=True, slots=True)
class BatchView:
    """One valid batch of a records blob: where it is, its header, and its bytes (no copy)."""

    position: int
    header: BatchHeader
    data: memoryview


@dataclass(frozen=True, slots=True)
class BatchError:
    """Why a records blob was refused: the code for the partition's Produce response."""

    error_code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def read_header(buf: Bytes, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos``; raise CorruptRecordBatch if under 61 bytes remain."""
    if len(buf) - pos < HEADER.size:
        raise CorruptRecordBatch(f"{len(buf) - pos} bytes at {pos} cannot hold a batch header")
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def batch_crc(batch: Bytes) -> int:
    """The CRC32C a v2 batch should carry: over its bytes from ``attributes`` to the end."""
    value: int = crc32c.crc32c(memoryview(batch)[CRC_START:])
    return value


def write_crc(buf: bytearray | memoryview, pos: int, size: int) -> None:
    """Give the batch of ``size`` bytes at ``pos`` the CRC32C of its bytes from attributes on."""
    crc = batch_crc(memoryview(buf)[pos : pos + size])
    FIELD_STRUCTS["crc"].pack_into(buf, pos + OFFSETS["crc"], crc)


def patch_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Give the batch at ``pos`` its first offset. Outside the CRC: nothing else changes."""
    FIELD_STRUCTS["base_offset"].pack_into(buf, pos + OFFSETS["base_offset"], base_offset)


def patch_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Stamp the partition leader epoch, as Kafka's leader does. Outside the CRC."""
    FIELD_STRUCTS["partition_leader_epoch"].pack_into(
        buf, pos + OFFSETS["partition_leader_epoch"], epoch
    )


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Mark the batch at ``pos`` LogAppendTime at ``timestamp_ms`` and rewrite its CRC.

    As Kafka's DefaultRecordBatch.setMaxTimestamp: the timestamp-type bit and max_timestamp change;
    base_timestamp and the records' deltas stay (readers take every record's timestamp from
    max_timestamp when the bit is set).
    """
    header = read_header(buf, pos)
    attributes = header.attributes | TIMESTAMP_TYPE_MASK
    if attributes == header.attributes and timestamp_ms == header.max_timestamp:
        return
    FIELD_STRUCTS["attributes"].pack_into(buf, pos + OFFSETS["attributes"], attributes)
    FIELD_STRUCTS["max_timestamp"].pack_into(buf, pos + OFFSETS["max_timestamp"], timestamp_ms)
    write_crc(buf, pos, header.size)


def set_max_timestamp(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Give the CreateTime batch at ``pos`` the max_timestamp its records have and rewrite its
    CRC, as Kafka's LogValidator does when a producer's header says otherwise."""
    header = read_header(buf, pos)
    if timestamp_ms != header.max_timestamp:
        FIELD_STRUCTS["max_timestamp"].pack_into(buf, pos + OFFSETS["max_timestamp"], timestamp_ms)
        write_crc(buf, pos, header.size)


def compress_batch(batch: Bytes, codec: int, level: int | None = None) -> bytes:
    """An uncompressed batch with its records section compressed with ``codec``: attributes,
    batch_length and CRC change, every other header field is kept.

    A batch that is already compressed, or a control batch (Kafka never compresses those on the
    broker), comes back unchanged, as does any batch for ``codec`` NONE.
    """
    view = memoryview(batch)
    header = read_header(view)
    if codec == Codec.NONE or header.codec != Codec.NONE or header.is_control:
        return bytes(view)
    out = bytearray(view[:RECORDS_OFFSET])
    out += compress(codec, view[RECORDS_OFFSET : header.size], level)
    attributes = header.attributes & ~CODEC_MASK | codec
    FIELD_STRUCTS["attributes"].pack_into(out, OFFSETS["attributes"], attributes)
    FIELD_STRUCTS["batch_length"].pack_into(out, OFFSETS["batch_length"], len(out) - LOG_OVERHEAD)
    write_crc(out, 0, len(out))
    return bytes(out)


def decompress_records(batch: Bytes, limit: int | None = None) -> bytes:
    """The raw records section of ``batch``, decompressed if its codec says so, to at most
    ``limit`` bytes (default ``compression.read_limit``; ``DecompressedTooLarge`` beyond)."""
    view = memoryview(batch)
    header = read_header(view)
    bound = read_limit(header.size) if limit is None else limit
    return decompress(header.codec, view[RECORDS_OFFSET : header.size], bound)


def iter_records(batch: Bytes, limit: int | None = None) -> Iterator[Record]:
    """The records of one batch, with absolute offsets and timestamps (the batch's LogAppendTime
    for every record when the bit is set). Raise CorruptRecordBatch, or CorruptCompressedData, if
    the records do not parse or do not fill the records section exactly; decompression stops at
    ``limit`` bytes as in ``decompress_records``."""
    for record, _ in iter_raw_records(batch, limit):
        yield record


def iter_raw_records(batch: Bytes, limit: int | None = None) -> Iterator[tuple[Record, memoryview]]:
    """``iter_records`` with each record's own bytes in the (decompressed) records section,
    length prefix included: written back unchanged behind the same batch header fields (base
    offset, base timestamp), they keep their offsets and timestamps."""
    view = memoryview(batch).toreadonly()  # kio's native readers refuse writable buffers
    header = read_header(view)
    if header.size != len(view):
        raise CorruptRecordBatch(f"batch declares {header.size} bytes but has {len(view)}")
    body = memoryview(decompress_records(view, limit)) if header.codec else view[RECORDS_OFFSET:]
    append_time = (
        header.max_timestamp if header.timestamp_type == TimestampType.LOG_APPEND_TIME else None
    )
    pos = 0
    for _ in range(header.records_count):
        record, end = _read_record(body, pos, header, append_time)
        yield record, body[pos:end]
        pos = end
    if pos != len(body):
        raise CorruptRecordBatch(f"{len(body) - pos} bytes follow the batch's last record")


def _read_record(
    body: memoryview, pos: int, header: BatchHeader, append_time: int | None
) -> tuple[Record, int]:
    try:
        length, size = read_signed_varint(body, pos)
        start = pos + size
        if length < 0 or start + length > len(body):
            raise CorruptRecordBatch(f"record at {pos} of length {length} overruns the batch")
        record = body[start : start + length]
        at = 1  # the record's attributes byte: unused by Kafka, always 0
        timestamp_delta, size = read_signed_varlong(record, at)
        at += size
        offset_delta, size = read_signed_varint(record, at)
        at += size
        key, at = _read_bytes(record, at)
        value, at = _read_bytes(record, at)
        count, size = read_signed_varint(record, at)
        at += size
        if count < 0:
            raise CorruptRecordBatch(f"record at {pos} has {count} headers")
        headers = []
        for _ in range(count):
            name, at = _read_bytes(record, at)
            if name is None:
                raise CorruptRecordBatch(f"record at {pos} has a null header key")
            header_value, at = _read_bytes(record, at)
            # Kafka decodes header keys leniently; surrogateescape keeps any bytes round-tripping.
            headers.append((name.decode("utf-8", "surrogateescape"), header_value))
    except (BufferUnderflow, ValueError) as exc:
        raise CorruptRecordBatch(f"record at {pos} does not parse: {exc}") from exc
    if at != length:
        raise CorruptRecordBatch(f"record at {pos} declares {length} bytes but holds {at}")
    timestamp = header.base_timestamp + timestamp_delta if append_time is None else append_time
    return (
        Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers)),
        start + length,
    )


def _read_bytes(record: memoryview, at: int) -> tuple[bytes | None, int]:
    length, size = read_signed_varint(record, at)
    at += size
    if length == -1:
        return None, at
    if length < 0 or at + length > len(record):
        raise CorruptRecordBatch(f"a field of {length} bytes overruns its record")
    return bytes(record[at : at + length]), at + length


def build_batch(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]],
    *,
    base_offset: int = 0,
    codec: int = Codec.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_type: int = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
) -> bytes:
    """A valid v2 batch of ``(key, value, headers, timestamp_ms)`` records, offsets from 0 up,
    written as Kafka's MemoryRecordsBuilder writes one."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_timestamp = records[0][3]
    body = io.BytesIO()
    for offset_delta, (key, value, headers, timestamp) in enumerate(records):
        write_record(body, offset_delta, timestamp - base_timestamp, key, value, headers)
    attributes = (
        (TIMESTAMP_TYPE_MASK if timestamp_type == TimestampType.LOG_APPEND_TIME else 0)
        | (TRANSACTIONAL_MASK if is_transactional else 0)
        | (CONTROL_MASK if is_control else 0)
    )
    header = BatchHeader(
        base_offset=base_offset,
        batch_length=RECORDS_OFFSET - LOG_OVERHEAD + body.tell(),
        partition_leader_epoch=partition_leader_epoch,
        magic=MAGIC,
        crc=0,
        attributes=attributes,
        last_offset_delta=len(records) - 1,
        base_timestamp=base_timestamp,
        max_timestamp=max(timestamp for *_, timestamp in records),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=len(records),
    )
    out = bytearray(header.pack()) + body.getbuffer()
    write_crc(out, 0, len(out))
    return compress_batch(out, codec)


def write_record(
    out: io.BytesIO,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> None:
    """One record, length prefix first, as DefaultRecord.writeTo writes it."""
    record = io.BytesIO()
    record.write(b"\x00")  # attributes
    write_signed_varlong(record, timestamp_delta)
    write_signed_varint(record, offset_delta)
    _write_bytes(record, key)
    _write_bytes(record, value)
    write_signed_varint(record, len(headers))
    for name, header_value in headers:
        _write_bytes(record, name.encode("utf-8", "surrogateescape"))
        _write_bytes(record, header_value)
    write_signed_varint(out, record.tell())
    out.write(record.getbuffer())


def _write_bytes(out: io.BytesIO, value: bytes | None) -> None:
    if value is None:
        write_signed_varint(out, -1)
        return
    write_signed_varint(out, len(value))
    out.write(value)
