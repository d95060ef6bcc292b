import contextlib
import struct

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol.compression import Codec, DecompressedTooLarge
from kafscale.protocol.errors import DecodeError
from kafscale.protocol.records import (
    HEADER,
    OFFSETS,
    BatchError,
    BatchView,
    Record,
    TimestampType,
    build_batch,
    compress_batch,
    decompress_records,
    iter_records,
    patch_base_offset,
    patch_leader_epoch,
    read_header,
    set_log_append_time,
    set_max_timestamp,
)
from kafscale.protocol.validate import BatchPolicy, split_batches

MAX = 1 << 20
# Any timestamp goes: these tests are about the layout (test_validate.py judges timestamps).
POLICY = BatchPolicy(MAX, timestamp_after_max_ms=2**63 - 1)
NOW = 1_700_000_000_000
# Field offsets as DefaultRecordBatch.java spells them out, typed in here to check the derived ones.
KAFKA_OFFSETS = {
    "base_offset": 0,
    "batch_length": 8,
    "partition_leader_epoch": 12,
    "magic": 16,
    "crc": 17,
    "attributes": 21,
    "last_offset_delta": 23,
    "base_timestamp": 27,
    "max_timestamp": 35,
    "producer_id": 43,
    "producer_epoch": 51,
    "base_sequence": 53,
    "records_count": 57,
}
T0 = 1_700_000_000_000


def _varint(n: int) -> bytes:
    zigzag, out = (n << 1) ^ (n >> 63), bytearray()
    while zigzag > 0x7F:
        out.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    return bytes(out + bytes([zigzag]))


def _golden() -> tuple[bytes, bytes]:
    """A batch written field by field: an idempotent producer's two records."""
    # attributes, timestamp delta, offset delta, key, value, headers
    record_0 = b"\x00" + _varint(0) + _varint(0) + _varint(5) + b"key-1" + _varint(7) + b"value-1"
    record_0 += _varint(1) + _varint(5) + b"trace" + _varint(3) + b"abc"
    record_1 = b"\x00" + _varint(7) + _varint(1) + _varint(-1) + _varint(7) + b"value-2"
    record_1 += _varint(0)
    records = _varint(len(record_0)) + record_0 + _varint(len(record_1)) + record_1
    # attributes, last offset delta, first and max timestamp, producer id/epoch, sequence, count
    covered = struct.pack(">hiqqqhii", 0, 1, T0, T0 + 7, 42, 3, 10, 2) + records
    crc = crc32c.crc32c(covered)
    prefix = struct.pack(">qiibI", 0, len(covered) + 9, -1, 2, crc)
    return prefix + covered, records


GOLDEN, GOLDEN_RECORDS = _golden()
GOLDEN_CRC = 0x0A9729E7  # computed once with crc32c and pinned
RecordTuple = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]
RECORDS: list[RecordTuple] = [
    (b"key-1", b"value-1", [("trace", b"abc")], T0),
    (None, b"value-2", [], T0 + 7),
]
EXPECTED = [
    Record(0, T0, b"key-1", b"value-1", (("trace", b"abc"),)),
    Record(1, T0 + 7, None, b"value-2", ()),
]

# Kafka's Java client 4.4.0, MemoryRecords.builder(buf, Compression.of(type), CREATE_TIME, 0) with
# RECORDS appended, per codec id; captured once.
JAVA_BATCHES = {
    Codec.NONE: (
        "00000000000000000000005cffffffff02a1d582540000000000010000018bcfe568000000018bcfe56807ff"
        "ffffffffffffffffffffffffff00000002380000000a6b65792d310e76616c75652d31020a74726163650661"
        "62631a000e02010e76616c75652d3200"
    ),
    Codec.GZIP: (
        "00000000000000000000006bffffffff026720fb6e0001000000010000018bcfe568000000018bcfe56807ff"
        "ffffffffffffffffffffffffff000000021f8b08000000000000ffb3606060e0ca4eadd435e42b4bcc294dd5"
        "3564e22a294a4c4e654b4c4a9662e06362848a1b3100002f44c7642b000000"
    ),
    Codec.SNAPPY: (
        "000000000000000000000072ffffffff02dfa34bff0002000000010000018bcfe568000000018bcfe56807ff"
        "ffffffffffffffffffffffffff0000000282534e415050590000000001000000010000002d2ba8380000000a"
        "6b65792d310e76616c75652d31020a7472616365066162631a000e02010e76616c75652d3200"
    ),
    Codec.LZ4: (
        "00000000000000000000006bffffffff0241f329640003000000010000018bcfe568000000018bcfe56807ff"
        "ffffffffffffffffffffffffff0000000204224d186040822b000080380000000a6b65792d310e76616c7565"
        "2d31020a7472616365066162631a000e02010e76616c75652d320000000000"
    ),
    Codec.ZSTD: (
        "000000000000000000000068ffffffff027a28c37e0004000000010000018bcfe568000000018bcfe56807ff"
        "ffffffffffffffffffffffffff0000000228b52ffd0058580100380000000a6b65792d310e76616c75652d31"
        "020a7472616365066162631a000e02010e76616c75652d3200010000"
    ),
}


def _split(blob: bytes | bytearray | memoryview, **options: bool) -> list[BatchView]:
    result = split_batches(blob, POLICY, NOW, **options)
    assert not isinstance(result, BatchError), result
    return result


def _crc_ok(batch: bytes | bytearray | memoryview) -> bool:
    return bool(read_header(batch).crc == crc32c.crc32c(bytes(batch)[21:]))


def test_layout_matches_kafka() -> None:
    assert HEADER.size == 61
    assert OFFSETS == KAFKA_OFFSETS


def test_golden_batch() -> None:
    assert crc32c.crc32c(GOLDEN[21:]) == GOLDEN_CRC
    header = read_header(GOLDEN)
    assert (header.base_offset, header.batch_length, header.partition_leader_epoch) == (0, 92, -1)
    assert (header.magic, header.crc, header.attributes) == (2, GOLDEN_CRC, 0)
    assert (header.last_offset_delta, header.base_timestamp, header.max_timestamp) == (
        1,
        T0,
        T0 + 7,
    )
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 10)
    assert header.records_count == 2
    assert (header.size, header.last_offset, header.codec) == (len(GOLDEN), 1, Codec.NONE)
    assert header.timestamp_type == TimestampType.CREATE_TIME
    assert not (header.is_transactional or header.is_control or header.has_delete_horizon)

    [view] = _split(GOLDEN)
    assert (view.position, view.header, bytes(view.data)) == (0, header, GOLDEN)
    assert list(iter_records(view.data)) == EXPECTED
    assert decompress_records(GOLDEN) == GOLDEN_RECORDS
    idempotent = build_batch(RECORDS, producer_id=42, producer_epoch=3, base_sequence=10)
    assert idempotent == GOLDEN


@pytest.mark.parametrize("codec", list(Codec))
def test_batches_from_kafkas_java_client(codec: Codec) -> None:
    java = bytes.fromhex(JAVA_BATCHES[codec])
    [view] = _split(java)
    assert view.header.codec == codec
    assert list(iter_records(java)) == EXPECTED
    ours = build_batch(RECORDS, codec=codec)
    assert decompress_records(ours) == decompress_records(java)
    if codec == Codec.NONE:
        assert ours == java
    if codec in (Codec.SNAPPY, Codec.LZ4):  # same framing: xerial header, LZ4 frame descriptor
        framing = {Codec.SNAPPY: 16, Codec.LZ4: 7}[codec]
        assert ours[61 : 61 + framing] == java[61 : 61 + framing]


def test_attribute_bits() -> None:
    header = read_header(build_batch(RECORDS, codec=Codec.LZ4, is_transactional=True))
    assert header.codec == Codec.LZ4 and header.is_transactional and not header.is_control
    flags = _with(GOLDEN, "attributes", ">h", 0x7F)
    header = read_header(flags)
    assert header.codec == 7 and header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.is_transactional and header.is_control and header.has_delete_horizon


def test_inputs_of_every_buffer_type() -> None:
    for blob in (GOLDEN, bytearray(GOLDEN), memoryview(GOLDEN)):
        [view] = _split(blob)
        assert bytes(view.data) == GOLDEN


def test_views_share_the_blob() -> None:
    blob = bytearray(GOLDEN + build_batch(RECORDS))
    [first, second] = _split(blob, single_batch=False)
    assert (first.position, second.position) == (0, len(GOLDEN))
    patch_base_offset(second.data, 0, 77)
    assert read_header(blob, len(GOLDEN)).base_offset == 77


def _with(batch: bytes, field: str, fmt: str, value: int, fix_crc: bool = True) -> bytes:
    changed = bytearray(batch)
    struct.pack_into(fmt, changed, KAFKA_OFFSETS[field], value)
    if fix_crc:
        struct.pack_into(">I", changed, 17, crc32c.crc32c(changed[21:]))
    return bytes(changed)


PLAIN = build_batch(RECORDS)


@given(st.binary(max_size=120), st.sampled_from(list(Codec)), st.integers(0, 4))
def test_records_with_a_valid_crc_raise_only_decode_errors(
    body: bytes, codec: Codec, count: int
) -> None:
    batch = bytearray(PLAIN[:61] + body)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 23, max(count - 1, 0))
    struct.pack_into(">i", batch, 57, count)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(batch[21:]))
    with contextlib.suppress(DecodeError):  # anything else fails the test
        list(iter_records(batch))


def test_set_max_timestamp_keeps_the_crc() -> None:
    blob = bytearray(PLAIN)
    set_max_timestamp(blob, 0, T0 + 99)
    assert _crc_ok(blob) and read_header(blob).max_timestamp == T0 + 99
    set_max_timestamp(blob, 0, T0 + 99)
    assert _crc_ok(blob)


def test_iter_records_decompression_is_bounded() -> None:
    zeros = build_batch([(None, bytes(100_000), [], T0)], codec=Codec.ZSTD)
    assert len(next(iter_records(zeros)).value or b"") == 100_000
    with pytest.raises(DecompressedTooLarge):
        list(iter_records(zeros, limit=50_000))
    with pytest.raises(DecompressedTooLarge):
        decompress_records(zeros, limit=50_000)


HEADERS = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3)
RECORD = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=200),
    HEADERS,
    st.integers(min_value=0, max_value=1 << 45),
)


def _expected(records: list[RecordTuple]) -> list[Record]:
    return [
        Record(i, ts, key, value, tuple(headers))
        for i, (key, value, headers, ts) in enumerate(records)
    ]


@given(st.lists(RECORD, min_size=1, max_size=6))
def test_build_split_iter_round_trip(records: list[RecordTuple]) -> None:
    batch = build_batch(records)
    [view] = _split(batch)
    assert view.header.records_count == len(records)
    assert view.header.max_timestamp == max(ts for *_, ts in records)
    assert list(iter_records(view.data)) == _expected(records)


@given(st.lists(RECORD, min_size=1, max_size=6), st.sampled_from(list(Codec)))
def test_compress_batch_round_trip(records: list[RecordTuple], codec: Codec) -> None:
    plain = build_batch(
        records, producer_id=9, producer_epoch=2, base_sequence=5, partition_leader_epoch=4
    )
    compressed = compress_batch(plain, codec)
    [view] = _split(compressed)
    before, after = read_header(plain), view.header
    assert _crc_ok(compressed)
    assert after.codec == codec
    assert after.attributes & ~0x07 == before.attributes & ~0x07
    unchanged = ("batch_length", "crc", "attributes")
    for field in KAFKA_OFFSETS:
        if field not in unchanged:
            assert getattr(after, field) == getattr(before, field), field
    assert decompress_records(compressed) == decompress_records(plain)
    assert list(iter_records(compressed)) == _expected(records)
    if codec != Codec.NONE:  # already compressed: unchanged
        assert compress_batch(compressed, Codec.GZIP) == compressed


def test_compress_batch_leaves_control_batches_and_codec_none() -> None:
    control = build_batch(RECORDS, is_control=True)
    assert compress_batch(control, Codec.ZSTD) == control
    assert compress_batch(PLAIN, Codec.NONE) == PLAIN


def test_patch_base_offset_keeps_the_crc() -> None:
    blob = bytearray(GOLDEN + PLAIN)
    patch_base_offset(blob, len(GOLDEN), 1_000)
    patch_leader_epoch(blob, len(GOLDEN), 12)
    second = memoryview(blob)[len(GOLDEN) :]
    assert bytes(blob[: len(GOLDEN)]) == GOLDEN
    assert _crc_ok(second)
    assert read_header(second).partition_leader_epoch == 12
    assert [record.offset for record in iter_records(second)] == [1_000, 1_001]
    assert read_header(second).last_offset == 1_001


def test_set_log_append_time_keeps_the_crc() -> None:
    blob = bytearray(GOLDEN + PLAIN)
    append_time = T0 + 60_000
    set_log_append_time(blob, len(GOLDEN), append_time)
    second = bytes(blob[len(GOLDEN) :])
    header = read_header(second)
    assert _crc_ok(second)
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert (header.base_timestamp, header.max_timestamp) == (T0, append_time)
    assert [record.timestamp for record in iter_records(second)] == [append_time] * 2
    set_log_append_time(blob, len(GOLDEN), append_time)
    assert bytes(blob[len(GOLDEN) :]) == second
    assert bytes(blob[: len(GOLDEN)]) == GOLDEN


def test_read_header_needs_61_bytes() -> None:
    with pytest.raises(DecodeError):
        read_header(GOLDEN[:60])
    with pytest.raises(DecodeError):
        read_header(GOLDEN, len(GOLDEN) - 10)


def test_build_batch_needs_a_record() -> None:
    with pytest.raises(ValueError):
        build_batch([])


# Interoperability with the Python clients' own batch code: aiokafka (its C extension and its
# pure-Python fallback) and kafka-python. Their readers check the CRC and decompress with their
# own codecs, so this proves the framing of what we write, and we read what they write.


def _client_modules() -> list[tuple[type, type]]:
    from aiokafka.record import default_records as aiokafka_records
    from kafka.record import default_records as kafka_records

    return [
        (aiokafka_records.DefaultRecordBatchBuilder, aiokafka_records.DefaultRecordBatch),
        (aiokafka_records._DefaultRecordBatchBuilderPy, aiokafka_records._DefaultRecordBatchPy),
        (kafka_records.DefaultRecordBatchBuilder, kafka_records.DefaultRecordBatch),
    ]


@pytest.mark.parametrize("codec", list(Codec))
def test_batches_from_python_clients(codec: Codec) -> None:
    # Values worth compressing: the clients send a batch uncompressed when that is smaller.
    records: list[RecordTuple] = [(k, (v or b"") * 50, h, ts) for k, v, h, ts in RECORDS]
    for builder_type, _ in _client_modules():
        builder = builder_type(2, codec, 0, 5, 0, 0, MAX)
        for offset, (key, value, headers, timestamp) in enumerate(records):
            builder.append(offset, timestamp, key, value, headers)
        batch = bytes(builder.build())
        [view] = _split(batch)
        assert (view.header.codec, view.header.producer_id) == (codec, 5)
        assert list(iter_records(batch)) == _expected(records)


@pytest.mark.parametrize("codec", list(Codec))
def test_python_clients_read_our_batches(codec: Codec) -> None:
    big: list[RecordTuple] = [(b"k", bytes(range(256)) * 400, [("h", None)], T0), *RECORDS]
    for records in (RECORDS, big):
        batch = compress_batch(build_batch(records), codec)
        appended = bytearray(batch)
        set_log_append_time(appended, 0, T0 + 5)
        for _, reader_type in _client_modules():
            reader = reader_type(bytearray(batch))
            assert reader.validate_crc()
            assert reader.compression_type == codec
            got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in reader]
            assert got == [(i, ts, k, v, list(h)) for i, (k, v, h, ts) in enumerate(records)]
            log_append = reader_type(appended)
            assert log_append.validate_crc() and log_append.timestamp_type == 1
            assert {record.timestamp for record in log_append} == {T0 + 5}
