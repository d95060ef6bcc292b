"""Kafka v2 record batches (magic 2), kept opaque: only the 61-byte batch header is parsed.

Owns the header layout (``HEADER``, offsets derived from ``FIELDS``), the produce-side checks
(``split_batches``), the edits a broker makes in place, whole-batch compression, and a record
reader and writer for tests, fetch-side tools and the flusher.

Invariants:
- offsets are assigned by writing the base offset, never by re-encoding: ``patch_base_offset`` and
  ``patch_leader_epoch`` touch only bytes before the CRC'd range, so the CRC stays valid;
- every function that changes a byte from ``attributes`` onwards rewrites the CRC32C;
- bad input from a client is returned as a ``BatchError`` (Kafka error code and message), never
  raised; a batch that fails to parse record by record raises ``CorruptRecordBatch``.

Layout: DefaultRecordBatch.java and DefaultRecord.java (KIP-98,
https://cwiki.apache.org/confluence/display/KAFKA/KIP-98+-+Exactly+Once+Delivery+and+Transactional+Messaging).
Checks and error codes follow, in Kafka's order, ProduceRequest.validateRecords,
UnifiedLog.analyzeAndValidateRecords and LogValidator.validateBatch; ``split_batches`` says where we
differ.
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

from kafscale.protocol.compression import Bytes, Codec, CorruptCompressedData, compress, decompress
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


def split_batches(
    records: Bytes, max_batch_bytes: int, *, single_batch: bool = True, allow_zstd: bool = True
) -> list[BatchView] | BatchError:
    """The batches of a Produce request's ``records`` for one partition, each checked as Kafka's
    broker checks a batch from a client, or the first problem found.

    ``max_batch_bytes`` is the topic's max.message.bytes. ``single_batch`` refuses more than one
    batch, as Kafka does for Produce v3+ (ProduceRequest.validateRecords); ``allow_zstd`` False is
    for Produce versions below 7 (KIP-110). Record contents are not decoded: see ``check_records``.

    Where we differ from Kafka, deliberately: a blob that ends inside a batch is CORRUPT_MESSAGE
    (Kafka's iterator stops at a short tail, then answers INVALID_RECORD "no record batch" or drops
    the tail); a codec id above 4 is UNSUPPORTED_COMPRESSION_TYPE (Kafka: an unchecked exception,
    UNKNOWN_SERVER_ERROR); transactional batches are UNSUPPORTED_FOR_MESSAGE_FORMAT, Kafka's code
    for a log that cannot hold transactional records (we have no transaction coordinator); a
    LogAppendTime bit from a producer is INVALID_TIMESTAMP (Kafka refuses it on LogAppendTime
    topics and clears it on CreateTime ones; no client sets it).
    """
    view = memoryview(records)
    batches: list[BatchView] = []
    pos = 0
    while pos < len(view):
        found = _frame(view, pos)
        if isinstance(found, BatchError):
            return found
        if single_batch and batches:
            return _invalid("Produce requests may hold only one record batch per partition")
        problem = _check_batch(found, max_batch_bytes, allow_zstd)
        if problem is not None:
            return problem
        batches.append(found)
        pos += found.header.size
    if not batches:
        return _invalid("Produce requests must hold a record batch per partition")
    return batches


def _frame(view: memoryview, pos: int) -> BatchView | BatchError:
    """Kafka's ByteBufferLogInputStream.nextBatch: a length, a magic byte, then the header."""
    remaining = len(view) - pos
    if remaining < LOG_OVERHEAD:
        return _corrupt(f"{remaining} bytes at position {pos} end inside a batch's length")
    (length,) = FIELD_STRUCTS["batch_length"].unpack_from(view, pos + OFFSETS["batch_length"])
    if length < LEGACY_MIN_LENGTH:
        return _corrupt(f"record batch length {length} is below the minimum {LEGACY_MIN_LENGTH}")
    if LOG_OVERHEAD + length > remaining:
        return _corrupt(
            f"record batch at position {pos} declares {LOG_OVERHEAD + length} bytes "
            f"but only {remaining} remain"
        )
    magic = FIELD_STRUCTS["magic"].unpack_from(view, pos + OFFSETS["magic"])[0]
    if magic < 0 or magic > MAGIC:
        return _corrupt(f"invalid magic {magic} in record batch")
    if magic != MAGIC:
        return _invalid(f"record batch magic {magic}: Produce v3+ allows only magic 2")
    if LOG_OVERHEAD + length < HEADER.size:
        return _corrupt(f"record batch of {LOG_OVERHEAD + length} bytes is smaller than its header")
    data = view[pos : pos + LOG_OVERHEAD + length]
    return BatchView(pos, read_header(data), data)


def _check_batch(batch: BatchView, max_batch_bytes: int, allow_zstd: bool) -> BatchError | None:
    header = batch.header
    if header.base_offset != 0:
        return _invalid(f"batch base offset should be 0, not {header.base_offset}")
    if header.size > max_batch_bytes:
        return BatchError(
            ErrorCode.message_too_large,
            f"record batch of {header.size} bytes exceeds max.message.bytes ({max_batch_bytes})",
        )
    if _crc(batch.data) != header.crc:
        return _corrupt(f"record batch is corrupt (stored crc = {header.crc})")
    if header.codec > Codec.ZSTD or (header.codec == Codec.ZSTD and not allow_zstd):
        return BatchError(
            ErrorCode.unsupported_compression_type, f"compression codec {header.codec} refused"
        )
    if header.last_offset_delta < 0 or header.records_count <= 0:
        return _invalid(f"invalid record count {header.records_count} in batch")
    if header.records_count != header.last_offset_delta + 1:
        return _invalid(f"last offset delta {header.last_offset_delta} for {header.records_count}")
    if header.is_control:
        return _invalid("clients are not allowed to write control records")
    if header.producer_id >= 0 and header.base_sequence < 0:
        return _invalid(f"invalid sequence number {header.base_sequence} with a producer id")
    if header.is_transactional:
        return BatchError(
            ErrorCode.unsupported_for_message_format, "transactional batches are not supported"
        )
    if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
        return BatchError(ErrorCode.invalid_timestamp, "producer should not set LogAppendTime")
    return None


def _invalid(message: str) -> BatchError:
    return BatchError(ErrorCode.invalid_record, message)


def _corrupt(message: str) -> BatchError:
    return BatchError(ErrorCode.corrupt_message, message)


def _crc(batch: Bytes) -> int:
    value: int = crc32c.crc32c(memoryview(batch)[CRC_START:])
    return value


def _write_crc(buf: bytearray | memoryview, pos: int, size: int) -> None:
    crc = _crc(memoryview(buf)[pos : pos + size])
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
    _write_crc(buf, pos, header.size)


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
    _write_crc(out, 0, len(out))
    return bytes(out)


def decompress_records(batch: Bytes) -> bytes:
    """The raw records section of ``batch``, decompressed if its codec says so."""
    view = memoryview(batch)
    header = read_header(view)
    return decompress(header.codec, view[RECORDS_OFFSET : header.size])


def iter_records(batch: Bytes) -> Iterator[Record]:
    """The records of one batch, with absolute offsets and timestamps (the batch's LogAppendTime
    for every record when the bit is set). Raise CorruptRecordBatch, or CorruptCompressedData, if
    the records do not parse or do not fill the records section exactly."""
    view = memoryview(batch).toreadonly()  # kio's native readers refuse writable buffers
    header = read_header(view)
    if header.size != len(view):
        raise CorruptRecordBatch(f"batch declares {header.size} bytes but has {len(view)}")
    body = memoryview(decompress_records(view)) if header.codec else view[RECORDS_OFFSET:]
    append_time = (
        header.max_timestamp if header.timestamp_type == TimestampType.LOG_APPEND_TIME else None
    )
    pos = 0
    for _ in range(header.records_count):
        record, pos = _read_record(body, pos, header, append_time)
        yield record
    if pos != len(body):
        raise CorruptRecordBatch(f"{len(body) - pos} bytes follow the batch's last record")


def check_records(batch: Bytes) -> BatchError | None:
    """Kafka's record-level checks of a batch from a client (LogValidator): every record parses,
    the count is right, and offset deltas run 0..n-1 (Kafka rewrites a compressed batch whose
    deltas do not; we cannot, so we refuse it). Decompresses a compressed batch."""
    try:
        base_offset = read_header(batch).base_offset
        for expected, record in enumerate(iter_records(batch)):
            if record.offset - base_offset != expected:
                return BatchError(
                    ErrorCode.invalid_record,
                    f"record {expected} has offset delta {record.offset - base_offset}",
                )
    except (CorruptRecordBatch, CorruptCompressedData) as exc:
        return BatchError(ErrorCode.invalid_record, str(exc))
    return None


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
        _write_record(body, offset_delta, timestamp - base_timestamp, key, value, headers)
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
    _write_crc(out, 0, len(out))
    return compress_batch(out, codec)


def _write_record(
    out: io.BytesIO,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> None:
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
