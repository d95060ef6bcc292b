"""What a broker accepts from a producer: every batch checked as Kafka's broker checks it, before
anything is stored or acknowledged.

``split_batches`` takes a Produce request's records for one partition and a ``BatchPolicy`` (the
topic's configs) and returns the batches, each verified, or the first fault as a ``BatchError``
(Kafka error code and a message naming the fault). Nothing here raises on bad input.

Checks, in Kafka's order (ProduceRequest.validateRecords, UnifiedLog.analyzeAndValidateRecords,
LogValidator.validateBatch / validateRecord, KIP-98 for the layout, KIP-937 for timestamps):

1. framing: a length, magic 2, a whole header, nothing cut short: CORRUPT_MESSAGE;
2. size against max.message.bytes: MESSAGE_TOO_LARGE; CRC32C: CORRUPT_MESSAGE;
3. header: codec id, zstd before Produce v7 (UNSUPPORTED_COMPRESSION_TYPE), base offset 0,
   records_count = last_offset_delta + 1 > 0, no control batch, a sequence with a producer id
   (INVALID_RECORD), no transactional batch (UNSUPPORTED_FOR_MESSAGE_FORMAT), no LogAppendTime
   bit (INVALID_TIMESTAMP);
4. records (``_walk``): the records section, decompressed with the codec the attributes name and
   at most ``max_decompressed_bytes`` of it (MESSAGE_TOO_LARGE beyond), holds exactly
   records_count records, each with a length that fits, every varint well-formed, key, value and
   headers inside it, offset deltas 0..n-1; anything else is INVALID_RECORD, a body that is not
   what its codec says included;
5. timestamps of a CreateTime topic within [now - message.timestamp.before.max.ms,
   now + message.timestamp.after.max.ms] (records without a timestamp, -1, are not judged):
   INVALID_TIMESTAMP; a header max_timestamp that is not the records' largest is corrected (a
   copy with the right value and CRC), as Kafka's setMaxTimestamp does;
6. on a compacted topic (``cleanup.policy`` with ``compact``), a record without a key:
   INVALID_RECORD, "Compacted topic cannot accept message without key", as Kafka's
   LogValidator.validateKey.

Where we differ from Kafka, deliberately: a blob that ends inside a batch is CORRUPT_MESSAGE
(Kafka's iterator stops at a short tail, then answers INVALID_RECORD "no record batch" or drops
the tail); a codec id above 4 is UNSUPPORTED_COMPRESSION_TYPE (Kafka: an unchecked exception,
UNKNOWN_SERVER_ERROR); a body its codec cannot decompress is INVALID_RECORD (Kafka: "Failed to
decompress record stream", UNKNOWN_SERVER_ERROR): the CRC matched, so the client sent these very
bytes and a retry cannot help (CORRUPT_MESSAGE, which clients retry, stays for CRC and framing);
offset deltas other than 0..n-1 are refused (Kafka ignores them in an uncompressed batch and
recompresses a compressed one); key, value and header value lengths below -1 are refused (Kafka
reads them as null); decompression is bounded (Kafka has no bound but never holds a batch's
records whole) and past the bound is MESSAGE_TOO_LARGE, on which Java producers split the batch
and resend; transactional batches are refused (no transaction coordinator); a LogAppendTime bit
from a producer is refused on CreateTime topics too (Kafka clears it there; no client sets it).

Cost: this runs in the shard for every produced batch. The walker reads only lengths, varints
and deltas, with one-byte varints decoded inline and longer ones by kio's native readers, and
makes no per-record object; decompression is C (``kafscale.protocol.compression``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.serial.errors import BufferUnderflow
from kio.serial.readers import read_signed_varint, read_signed_varlong

from kafscale.protocol import records
from kafscale.protocol.compression import (
    DEFAULT_FACTOR,
    Bytes,
    Codec,
    CorruptCompressedData,
    DecompressedTooLarge,
    decompress,
)
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.records import (
    FIELD_STRUCTS,
    HEADER,
    LEGACY_MIN_LENGTH,
    LOG_OVERHEAD,
    MAGIC,
    OFFSETS,
    RECORDS_OFFSET,
    BatchError,
    BatchView,
    TimestampType,
)

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
NO_TIMESTAMP = -1
#: Kafka 4's defaults (KIP-937; KIP-1030 set after.max.ms to one hour in 4.0).
TIMESTAMP_BEFORE_MAX_MS = LONG_MAX
TIMESTAMP_AFTER_MAX_MS = 3_600_000
#: The smallest record: length, attributes, timestamp delta, offset delta, key and value
#: lengths, header count, one byte each.
MIN_RECORD_BODY = 6


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """The topic configs and request facts a batch is judged by."""

    max_batch_bytes: int  # the topic's max.message.bytes
    allow_zstd: bool = True  # False below Produce v7 (KIP-110)
    log_append_time: bool = False  # message.timestamp.type=LogAppendTime
    timestamp_before_max_ms: int = TIMESTAMP_BEFORE_MAX_MS
    timestamp_after_max_ms: int = TIMESTAMP_AFTER_MAX_MS
    decompression_factor: int = DEFAULT_FACTOR  # KAFSCALE_MAX_DECOMPRESSION_FACTOR
    compacted: bool = False  # cleanup.policy includes compact: a record without a key is refused

    @property
    def max_decompressed_bytes(self) -> int:
        return self.decompression_factor * self.max_batch_bytes


def split_batches(
    blob: Bytes, policy: BatchPolicy, now_ms: int, *, single_batch: bool = True
) -> list[BatchView] | BatchError:
    """The batches of a Produce request's records for one partition, each checked as Kafka's
    broker checks a batch from a client, or the first problem found. ``single_batch`` refuses
    more than one batch, as Kafka does for Produce v3+ (ProduceRequest.validateRecords)."""
    view = memoryview(blob)
    batches: list[BatchView] = []
    pos = 0
    while pos < len(view):
        found = _frame(view, pos)
        if isinstance(found, BatchError):
            return found
        if single_batch and batches:
            return _invalid("Produce requests may hold only one record batch per partition")
        problem = _check_header(found, policy)
        if problem is not None:
            return problem
        checked = check_records(found, policy, now_ms)
        if isinstance(checked, BatchError):
            return checked
        batches.append(checked)
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
    return BatchView(pos, records.read_header(data), data)


def _check_header(batch: BatchView, policy: BatchPolicy) -> BatchError | None:
    header = batch.header
    if header.base_offset != 0:
        return _invalid(f"batch base offset should be 0, not {header.base_offset}")
    if header.size > policy.max_batch_bytes:
        return BatchError(
            ErrorCode.message_too_large,
            f"record batch of {header.size} bytes exceeds max.message.bytes "
            f"({policy.max_batch_bytes})",
        )
    if records.batch_crc(batch.data) != header.crc:
        return _corrupt(f"record batch is corrupt (stored crc = {header.crc})")
    if header.codec > Codec.ZSTD or (header.codec == Codec.ZSTD and not policy.allow_zstd):
        return BatchError(
            ErrorCode.unsupported_compression_type, f"compression codec {header.codec} refused"
        )
    if header.last_offset_delta < 0 or header.records_count <= 0:
        return _invalid(f"invalid record count {header.records_count} in batch")
    if header.records_count != header.last_offset_delta + 1:
        return _invalid(
            f"last offset delta {header.last_offset_delta} does not match the record count "
            f"{header.records_count}"
        )
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


def check_records(batch: BatchView, policy: BatchPolicy, now_ms: int) -> BatchView | BatchError:
    """The record-level half of Kafka's LogValidator for one framed batch whose header passed:
    the batch as it is to be stored (a copy if its max_timestamp had to be corrected), or why
    it is refused."""
    header = batch.header
    if header.codec == Codec.NONE:
        # A copy, since indexing bytes is a third faster than a memoryview in the walk.
        body = bytes(batch.data)
        start = RECORDS_OFFSET
    else:
        try:
            body = decompress(
                header.codec, batch.data[RECORDS_OFFSET:], policy.max_decompressed_bytes
            )
        except DecompressedTooLarge as exc:
            return BatchError(
                ErrorCode.message_too_large,
                f"records section {exc}: the bound is {policy.decompression_factor} times "
                f"max.message.bytes ({policy.max_batch_bytes})",
            )
        except CorruptCompressedData as exc:
            codec = Codec(header.codec).name.lower()
            return _invalid(f"records section is not valid {codec} data: {exc}")
        start = 0
    no_timestamp = NO_TIMESTAMP - header.base_timestamp  # the delta of a record without one
    try:
        lowest, highest = _walk(body, start, header.records_count, no_timestamp, policy.compacted)
    except _Fault as fault:
        return _invalid(str(fault))
    max_timestamp = header.base_timestamp + highest
    if not LONG_MIN <= max_timestamp <= LONG_MAX:
        return _invalid(f"record timestamp {max_timestamp} does not fit in 64 bits")
    if policy.log_append_time:
        return batch  # the broker stamps its own time over every record's
    low = now_ms - policy.timestamp_before_max_ms
    high = now_ms + policy.timestamp_after_max_ms
    # lowest > highest: no record has a timestamp (lowest kept its LONG_MAX start), none judged.
    for delta in (lowest, highest) if lowest <= highest else ():
        timestamp = header.base_timestamp + delta
        if delta != no_timestamp and not low <= timestamp <= high:
            return BatchError(
                ErrorCode.invalid_timestamp,
                f"timestamp {timestamp} of a record is out of range: it should be within "
                f"[{low}, {high}] (message.timestamp.before.max.ms / after.max.ms)",
            )
    if max_timestamp == header.max_timestamp:
        return batch
    fixed = bytearray(batch.data)
    records.set_max_timestamp(fixed, 0, max_timestamp)
    return BatchView(batch.position, records.read_header(fixed), memoryview(fixed))


class _Fault(Exception):
    """A record that does not parse (never leaves this module)."""


def _walk(
    body: Bytes, pos: int, count: int, no_timestamp: int, keyed: bool = False
) -> tuple[int, int]:
    """Walk the ``count`` records from ``pos`` to the end of ``body``: the lowest timestamp delta
    other than ``no_timestamp`` (``LONG_MAX`` if none) and the highest. Raise ``_Fault`` naming
    the first thing wrong; with ``keyed`` (a compacted topic), a record without a key is one.

    Hot, hence written out field by field: one-byte varints (zigzag: an even byte is n // 2, an
    odd one -(n // 2) - 1) are decoded inline, longer ones by kio's native readers; nothing is
    copied or built per record."""
    varint, varlong = read_signed_varint, read_signed_varlong
    end = len(body)
    base = start = pos
    lowest, highest = LONG_MAX, LONG_MIN
    index = 0
    try:
        while index < count:
            if pos >= end:
                raise _Fault(f"the records section holds {index} records, not {count}")
            start = pos
            byte = body[pos]
            if byte < 0x80:
                length = (byte >> 1) ^ -(byte & 1)
                pos += 1
            else:
                length, size = varint(body, pos)
                pos += size
            stop = pos + length
            if length < MIN_RECORD_BODY or stop > end:
                raise _Fault(
                    f"record {index} at byte {start - base} declares {length} bytes, "
                    f"{end - pos} remain in the records section"
                )
            byte = body[pos + 1]  # past the record's attributes byte, unused by Kafka
            if byte < 0x80:
                delta = (byte >> 1) ^ -(byte & 1)
                pos += 2
            else:
                delta, size = varlong(body, pos + 1)
                pos += 1 + size
            byte = body[pos]
            if byte == index << 1 and index < 64:  # the offset delta it must have, one byte
                pos += 1
            else:
                offset_delta, size = varint(body, pos)
                if offset_delta != index:
                    raise _Fault(
                        f"record {index} at byte {start - base} has offset delta {offset_delta}"
                    )
                pos += size
            byte = body[pos]  # the key's length: -1 is null, anything lower is refused
            if byte < 0x80:
                if byte & 1:
                    if byte != 1:
                        raise _Fault(f"record {index} at byte {start - base} has a negative key")
                    if keyed:
                        raise _Fault("Compacted topic cannot accept message without key")
                    pos += 1
                else:
                    pos += 1 + (byte >> 1)
            else:
                field_length, size = varint(body, pos)
                if field_length < 0:
                    raise _Fault(f"record {index} at byte {start - base} has a negative key")
                pos += size + field_length
            byte = body[pos]  # the value's length, the same way
            if byte < 0x80:
                if byte & 1:
                    if byte != 1:
                        raise _Fault(f"record {index} at byte {start - base} has a negative value")
                    pos += 1
                else:
                    pos += 1 + (byte >> 1)
            else:
                field_length, size = varint(body, pos)
                if field_length < 0:
                    raise _Fault(f"record {index} at byte {start - base} has a negative value")
                pos += size + field_length
            if body[pos] == 0:  # no headers: the common case
                pos += 1
            else:
                pos = _headers(body, pos, stop, f"record {index} at byte {start - base}")
            if pos != stop:
                raise _Fault(
                    f"record {index} at byte {start - base} declares {length} bytes but its "
                    f"fields take {length + pos - stop}"
                )
            if delta > highest:
                highest = delta
            if delta < lowest and delta != no_timestamp:
                lowest = delta
            index += 1
    except IndexError:
        raise _Fault(f"record {index} runs past the end of the records section") from None
    except (BufferUnderflow, ValueError) as exc:  # kio: a varint cut short, or over 5/10 bytes
        raise _Fault(f"record {index} at byte {start - base} does not parse: {exc}") from None
    if pos != end:
        raise _Fault(f"{end - pos} bytes follow the last of the batch's {count} records")
    return lowest, highest


def _headers(body: Bytes, pos: int, stop: int, where: str) -> int:
    """Walk one record's headers from its header count at ``pos``; where they end."""
    count, size = read_signed_varint(body, pos)
    pos += size
    # Each header takes at least two bytes: refuse a count its record cannot hold at once.
    if count < 0 or 2 * count > stop - pos:
        raise _Fault(f"{where} declares {count} headers")
    for _ in range(count):
        key_length, size = read_signed_varint(body, pos)
        if key_length < 0:
            raise _Fault(f"{where} has a header with a null or negative key")
        pos += size + key_length
        value_length, size = read_signed_varint(body, pos)
        if value_length < -1:
            raise _Fault(f"{where} has a header value of length {value_length}")
        pos += size + max(value_length, 0)
    return pos


def _invalid(message: str) -> BatchError:
    return BatchError(ErrorCode.invalid_record, message)


def _corrupt(message: str) -> BatchError:
    return BatchError(ErrorCode.corrupt_message, message)
