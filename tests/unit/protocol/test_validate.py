"""Kafka's LogValidator rules, one by one, on hand-built batches (tests/unit/protocol/poison.py):
each fed whole, then with every header field lying, then truncated and damaged at random."""

import contextlib
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.config import SETTINGS
from kafscale.protocol.compression import DEFAULT_FACTOR, Codec, compress
from kafscale.protocol.errors import DecodeError, ErrorCode
from kafscale.protocol.records import (
    BatchError,
    BatchView,
    TimestampType,
    build_batch,
    iter_records,
    read_header,
)
from kafscale.protocol.validate import BatchPolicy, split_batches
from tests.unit.protocol import poison
from tests.unit.protocol.poison import batch, record

MAX = 1 << 20
T0 = 1_700_000_000_000
NOW = T0 + 1_000  # the broker's clock in these tests
POLICY = BatchPolicy(MAX)
RECORDS = [
    (b"key-1", b"value-1", [("trace", b"abc")], T0),
    (None, b"value-2", [], T0 + 7),
]
PLAIN = build_batch(RECORDS)
OFFSETS = {"attributes": 21, "last_offset_delta": 23, "max_timestamp": 35, "records_count": 57}


def _check(blob: bytes, policy: BatchPolicy = POLICY, **options: bool) -> list[BatchView]:
    result = split_batches(blob, policy, NOW, **options)
    assert not isinstance(result, BatchError), result
    return result


def _refused(blob: bytes, code: ErrorCode, policy: BatchPolicy = POLICY, **options: bool) -> str:
    result = split_batches(blob, policy, NOW, **options)
    assert isinstance(result, BatchError), f"accepted, expected {code.name}"
    assert result.error_code == code, result.message
    assert result.message
    return result.message


def _with(blob: bytes, field: str, fmt: str, value: int, fix_crc: bool = True) -> bytes:
    offsets = {"base_offset": 0, "batch_length": 8, "magic": 16, "crc": 17, **OFFSETS}
    changed = bytearray(blob)
    struct.pack_into(fmt, changed, offsets[field], value)
    if fix_crc:
        struct.pack_into(">I", changed, 17, crc32c.crc32c(changed[21:]))
    return bytes(changed)


def _flip_record_byte(blob: bytes) -> bytes:
    changed = bytearray(blob)
    changed[-2] ^= 0x01
    return bytes(changed)


# -- the batch header (framing, CRC, header fields) --------------------------------------------

HEADER_CASES: dict[str, tuple[Callable[[], bytes], ErrorCode]] = {
    "no batch": (lambda: b"", ErrorCode.invalid_record),
    "magic 1": (lambda: _with(PLAIN, "magic", ">b", 1), ErrorCode.invalid_record),
    "magic 0": (lambda: _with(PLAIN, "magic", ">b", 0), ErrorCode.invalid_record),
    "magic 3": (lambda: _with(PLAIN, "magic", ">b", 3), ErrorCode.corrupt_message),
    "magic -1": (lambda: _with(PLAIN, "magic", ">b", -1), ErrorCode.corrupt_message),
    "length below 14": (
        lambda: _with(PLAIN, "batch_length", ">i", 13)[:25],
        ErrorCode.corrupt_message,
    ),
    "length below header": (
        lambda: _with(PLAIN, "batch_length", ">i", 30)[:42],
        ErrorCode.corrupt_message,
    ),
    "negative length": (lambda: _with(PLAIN, "batch_length", ">i", -5), ErrorCode.corrupt_message),
    "length past the end": (
        lambda: _with(PLAIN, "batch_length", ">i", len(PLAIN)),
        ErrorCode.corrupt_message,
    ),
    "length short of the end": (  # the CRC then covers fewer bytes than were written
        lambda: _with(PLAIN, "batch_length", ">i", len(PLAIN) - 13, fix_crc=False),
        ErrorCode.corrupt_message,
    ),
    "base offset not 0": (lambda: _with(PLAIN, "base_offset", ">q", 5), ErrorCode.invalid_record),
    "crc mismatch": (lambda: _flip_record_byte(PLAIN), ErrorCode.corrupt_message),
    "crc field wrong": (lambda: _with(PLAIN, "crc", ">I", 1, False), ErrorCode.corrupt_message),
    "codec 5": (
        lambda: _with(PLAIN, "attributes", ">h", 5),
        ErrorCode.unsupported_compression_type,
    ),
    "codec 7": (
        lambda: _with(PLAIN, "attributes", ">h", 7),
        ErrorCode.unsupported_compression_type,
    ),
    "count 0": (lambda: _with(PLAIN, "records_count", ">i", 0), ErrorCode.invalid_record),
    "count 3 of 2": (lambda: _with(PLAIN, "records_count", ">i", 3), ErrorCode.invalid_record),
    "negative offset delta": (
        lambda: _with(PLAIN, "last_offset_delta", ">i", -1),
        ErrorCode.invalid_record,
    ),
    "control": (lambda: build_batch(RECORDS, is_control=True), ErrorCode.invalid_record),
    "producer id without sequence": (
        lambda: build_batch(RECORDS, producer_id=7, producer_epoch=0),
        ErrorCode.invalid_record,
    ),
    "transactional": (
        lambda: build_batch(
            RECORDS, producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True
        ),
        ErrorCode.unsupported_for_message_format,
    ),
    "log append time from a producer": (
        lambda: build_batch(RECORDS, timestamp_type=TimestampType.LOG_APPEND_TIME),
        ErrorCode.invalid_timestamp,
    ),
    "two batches": (lambda: PLAIN + PLAIN, ErrorCode.invalid_record),
    "trailing bytes": (lambda: PLAIN + b"\x00" * 11, ErrorCode.corrupt_message),
}


@pytest.mark.parametrize("case", HEADER_CASES)
def test_header_faults_are_refused_as_data(case: str) -> None:
    make, code = HEADER_CASES[case]
    _refused(make(), code)


def test_size_limit_is_max_message_bytes() -> None:
    _check(PLAIN, BatchPolicy(len(PLAIN)))
    _refused(PLAIN, ErrorCode.message_too_large, BatchPolicy(len(PLAIN) - 1))


def test_zstd_refused_for_old_produce_versions() -> None:
    old = BatchPolicy(MAX, allow_zstd=False)
    _refused(build_batch(RECORDS, codec=Codec.ZSTD), ErrorCode.unsupported_compression_type, old)
    _check(build_batch(RECORDS, codec=Codec.LZ4), old)


def test_idempotent_batches_are_accepted() -> None:
    [view] = _check(build_batch(RECORDS, producer_id=7, producer_epoch=1, base_sequence=0))
    assert view.header.producer_id == 7


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_a_compacted_topic_refuses_a_record_without_a_key(codec: Codec) -> None:
    compacted = BatchPolicy(MAX, compacted=True)
    keyed = build_batch([(b"k", b"v", [], T0), (b"k", None, [], T0)], codec=codec)
    assert not isinstance(split_batches(keyed, compacted, NOW), BatchError)
    keyless = build_batch(RECORDS, codec=codec)  # its second record has no key
    refused = split_batches(keyless, compacted, NOW)
    assert isinstance(refused, BatchError)
    assert refused.error_code == ErrorCode.invalid_record
    assert "Compacted topic cannot accept message without key" in refused.message
    assert not isinstance(split_batches(keyless, POLICY, NOW), BatchError)


def test_several_batches_when_asked() -> None:
    blob = PLAIN + build_batch(RECORDS, codec=Codec.GZIP)
    views = _check(blob, single_batch=False)
    assert [view.position for view in views] == [0, len(PLAIN)]


def test_every_truncation_is_corrupt_message() -> None:
    for cut in range(1, len(PLAIN)):
        _refused(PLAIN[:cut], ErrorCode.corrupt_message)


def test_truncation_inside_a_later_batch_is_corrupt_message() -> None:
    blob = PLAIN + PLAIN
    for cut in range(len(PLAIN) + 1, len(blob)):
        _refused(blob[:cut], ErrorCode.corrupt_message, single_batch=False)


# -- records: the reproductions of issue 14 ----------------------------------------------------


def test_snappy_attributes_over_a_plain_body_are_refused() -> None:
    lying = batch(record(0) + record(1), count=2, codec=Codec.SNAPPY)
    message = _refused(lying, ErrorCode.invalid_record)
    assert "not valid snappy data" in message


def test_a_batch_claiming_5_records_holding_1_is_refused() -> None:
    lying = batch(record(0), count=5)  # last_offset_delta 4: the header agrees with itself
    assert "holds 1 records, not 5" in _refused(lying, ErrorCode.invalid_record)


def test_a_truncated_record_is_refused() -> None:
    whole = record(0, b"value-0") + record(1, b"value-1")
    message = _refused(batch(whole[:-3], count=2), ErrorCode.invalid_record)
    assert "record 1" in message


def test_a_zstd_bomb_is_refused_at_the_bound() -> None:
    bomb = batch(poison.zstd_bomb(1 << 30), count=1, codec=Codec.ZSTD)
    assert len(bomb) < 40_000
    message = _refused(bomb, ErrorCode.message_too_large)
    assert "64 times max.message.bytes" in message


def test_a_zstd_bomb_costs_one_block_of_memory_not_the_bound(tmp_path: Path) -> None:
    """In a fresh interpreter, so its peak RSS is the validation's."""
    path = tmp_path / "bomb"
    path.write_bytes(batch(poison.zstd_bomb(1 << 30), count=1, codec=Codec.ZSTD))
    script = (
        "import resource, sys, time\n"
        "from kafscale.protocol.validate import BatchPolicy, split_batches\n"
        "blob = open(sys.argv[1], 'rb').read()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "result = split_batches(blob, BatchPolicy(1048588), int(time.time() * 1000))\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(result.error_code.name, (after - before) * 1024)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "message_too_large"
    # Far below the bound (64 MiB here): its blocks are counted one at a time, never kept.
    assert int(out[1]) <= 8 << 20


def test_the_default_factor_is_the_settings_default() -> None:
    [setting] = [s for s in SETTINGS if s.field == "max_decompression_factor"]
    assert int(setting.default) == DEFAULT_FACTOR


# -- records: every rule ------------------------------------------------------------------------

TWO = record(0, b"value-0") + record(1, b"value-1", timestamp_delta=5)

RECORD_CASES: dict[str, bytes] = {
    "count 1 holding 2": batch(TWO, count=1),
    "count 3 holding 2": batch(TWO, count=3),
    "offset deltas 0, 0": batch(record(0) + record(0), count=2),
    "offset deltas 0, 2": batch(record(0) + record(2), count=2),
    "offset delta 1 first": batch(record(1) + record(2), count=2),
    "record length too long": batch(record(0, length=40), count=1),
    "record length too short": batch(record(0, b"value", length=5), count=1),
    "record length negative": batch(record(0, length=-3), count=1),
    "record length runs past the batch": batch(record(0, b"v" * 10, length=12), count=1),
    "key length past the record": batch(record(0, key=b"k")[:-4] + b"\x02", count=1),
    "negative key": batch(b"\x0c\x00\x00\x00\x05v\x02v\x00", count=1),
    "negative value": batch(b"\x08\x00\x00\x00\x01\x03\x00", count=1),
    "value longer than the record": batch(b"\x0a\x00\x00\x00\x01\x10abc\x00", count=1),
    "negative header count": batch(b"\x0a\x00\x00\x00\x01\x02v\x01", count=1),
    "header count past the record": batch(b"\x0a\x00\x00\x00\x01\x02v\x7e", count=1),
    "null header key": batch(record(0, headers=[(None, b"x")]), count=1),
    "header value below -1": batch(
        record(0, headers=[(b"h", b"xy")]).replace(b"\x02h\x04xy", b"\x02h\x05xy"), count=1
    ),
    "varint over 5 bytes": batch(b"\x0e\x00\x00" + b"\xff" * 6 + b"\x01\x02v\x00", count=1),
    "varlong cut short": batch(b"\x04\x00\xff\xff\xff", count=1),
    "bytes after the last record": batch(TWO + b"\x00", count=2),
    "empty records section": batch(b"", count=1),
    "none codec over a zstd body": batch(compress(Codec.ZSTD, TWO), count=2),
    "gzip codec over an lz4 body": batch(compress(Codec.LZ4, TWO), count=2, codec=Codec.GZIP),
    "zstd codec over a plain body": batch(TWO, count=2, codec=Codec.ZSTD),
    "lz4 codec over a plain body": batch(TWO, count=2, codec=Codec.LZ4),
    "gzip codec over a plain body": batch(TWO, count=2, codec=Codec.GZIP),
    "zstd body cut short": batch(compress(Codec.ZSTD, TWO)[:-2], count=2, codec=Codec.ZSTD),
    "compressed count 3 holding 2": batch(compress(Codec.LZ4, TWO), count=3, codec=Codec.LZ4),
}


@pytest.mark.parametrize("case", RECORD_CASES)
def test_record_faults_are_invalid_record(case: str) -> None:
    _refused(RECORD_CASES[case], ErrorCode.invalid_record)


@pytest.mark.parametrize("codec", list(Codec))
def test_hand_built_batches_pass_under_every_codec(codec: Codec) -> None:
    headers = [(b"trace", b"abc"), (b"empty", None)]
    section = record(0, b"value-0", key=b"k", headers=headers) + record(1, None, timestamp_delta=9)
    [view] = _check(batch(compress(codec, section), count=2, codec=codec, max_timestamp=T0 + 9))
    assert [r.offset for r in iter_records(view.data)] == [0, 1]


# -- timestamps (message.timestamp.type, KIP-937) ----------------------------------------------


def test_timestamps_beyond_after_max_ms_are_refused() -> None:
    future = batch(record(0), count=1, base_timestamp=NOW + 3_600_001)
    assert "out of range" in _refused(future, ErrorCode.invalid_timestamp)  # Kafka 4: 1 hour
    _check(batch(record(0), count=1, base_timestamp=NOW + 3_600_000))
    _check(future, BatchPolicy(MAX, timestamp_after_max_ms=2**63 - 1))


def test_timestamps_before_before_max_ms_are_refused() -> None:
    strict = BatchPolicy(MAX, timestamp_before_max_ms=1_000)
    _check(batch(record(0), count=1, base_timestamp=NOW - 1_000), strict)
    old = batch(record(0) + record(1, timestamp_delta=999), count=2, base_timestamp=NOW - 1_001)
    _refused(old, ErrorCode.invalid_timestamp, strict)
    _check(old)  # Kafka's default: no limit


def test_any_record_out_of_range_refuses_the_batch() -> None:
    late = record(0) + record(1, timestamp_delta=10_000_000)
    _refused(batch(late, count=2, base_timestamp=NOW), ErrorCode.invalid_timestamp)


def test_records_without_a_timestamp_are_not_judged() -> None:
    strict = BatchPolicy(MAX, timestamp_before_max_ms=1_000)
    no_timestamp = record(0) + record(1, timestamp_delta=NOW + 1)
    _check(batch(no_timestamp, count=2, base_timestamp=-1, max_timestamp=NOW), strict)


def test_a_batch_whose_records_all_lack_a_timestamp_is_accepted() -> None:
    # Kafka judges only records with a timestamp; a batch of none has max_timestamp -1.
    none = record(0) + record(1)
    for policy in (POLICY, BatchPolicy(MAX, timestamp_before_max_ms=1_000)):
        [view] = _check(batch(none, count=2, base_timestamp=-1, max_timestamp=-1), policy)
        assert view.header.max_timestamp == -1


def test_log_append_time_topics_ignore_record_timestamps() -> None:
    appended = BatchPolicy(MAX, log_append_time=True, timestamp_before_max_ms=0)
    lying = batch(record(0), count=1, base_timestamp=NOW + 10**9, max_timestamp=0)
    [view] = _check(lying, appended)
    assert view.header.max_timestamp == 0  # the shard stamps its own time over it


def test_a_lying_max_timestamp_is_corrected_as_kafka_does() -> None:
    section = record(0) + record(1, timestamp_delta=50)
    for claimed in (T0, T0 + 10_000, -1):
        [view] = _check(batch(section, count=2, max_timestamp=claimed))
        assert view.header.max_timestamp == T0 + 50
        assert read_header(view.data).crc == crc32c.crc32c(bytes(view.data)[21:])
    honest = batch(section, count=2, max_timestamp=T0 + 50)
    [view] = _check(honest)
    assert bytes(view.data) == honest and view.data.obj is honest  # no copy when right


def test_timestamps_outside_64_bits_are_refused() -> None:
    huge = batch(record(0, timestamp_delta=2**63 - 1), count=1, base_timestamp=10)
    _refused(huge, ErrorCode.invalid_record, BatchPolicy(MAX, timestamp_after_max_ms=2**63 - 1))


# -- every header field lying, on a valid compressed and uncompressed batch ---------------------

LYING_FIELDS = {
    # field: (struct code, lying values)
    "records_count": (">i", [0, 1, 3, -1, 2**31 - 1]),
    "last_offset_delta": (">i", [0, 2, -1, 2**31 - 1]),
    "max_timestamp": (">q", [-1, 0, 2**63 - 1]),  # corrected from the records
    "attributes": (">h", [1, 2, 3, 4, 5, 8, 0x10, 0x20]),
    "batch_length": (">i", [-1, 0, 48, 60, 2**31 - 1]),
    "crc": (">I", [0, 2**32 - 1]),
}


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
@pytest.mark.parametrize("field", LYING_FIELDS)
def test_every_lying_header_field_is_refused_or_corrected(codec: Codec, field: str) -> None:
    honest = batch(compress(codec, TWO), count=2, codec=codec, max_timestamp=T0 + 5)
    fmt, values = LYING_FIELDS[field]
    for value in values:
        offset = {"batch_length": 8, "crc": 17, **OFFSETS}[field]
        lying = bytearray(honest)
        struct.pack_into(fmt, lying, offset, value)
        if field != "crc":
            struct.pack_into(">I", lying, 17, crc32c.crc32c(lying[21:]))
        result = split_batches(bytes(lying), POLICY, NOW)
        if field == "attributes" and value == codec:
            assert isinstance(result, list)
        elif field == "max_timestamp":
            assert isinstance(result, list) and result[0].header.max_timestamp == T0 + 5
        else:
            assert isinstance(result, BatchError), (field, value)


# -- properties ---------------------------------------------------------------------------------

HEADERS = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3)
RECORD = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    HEADERS,
    st.integers(min_value=0, max_value=NOW + 3_600_000),
)


@given(st.lists(RECORD, min_size=1, max_size=8), st.sampled_from(list(Codec)))
def test_what_our_writer_builds_passes(records: list[tuple], codec: Codec) -> None:  # type: ignore[type-arg]
    [view] = _check(build_batch(records, codec=codec))
    assert len(list(iter_records(view.data))) == len(records)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.LZ4])
def test_large_batches_with_multi_byte_varints_pass(codec: Codec) -> None:
    """Past 63 records offset deltas take two bytes, past 8191 three; lengths past 63 bytes
    take two, past 8191 three: every width of every field, in one batch."""
    sizes = [0, 1, 63, 64, 100, 8191, 8192, 20_000]
    many = [
        (b"k" * (i % 70) or None, b"v" * sizes[i % len(sizes)], [("h" * (i % 3), b"x")], T0 + i)
        for i in range(10_000)
    ]
    [view] = _check(build_batch(many, codec=codec), BatchPolicy(1 << 30))
    assert view.header.records_count == 10_000
    honest = b"".join(record(i, b"v" * i) for i in range(300))
    _check(batch(honest, count=300))
    for wrong in (64, 128, 200):  # two-byte deltas: 64 is 0x80 0x01, its first byte 128 = 2 * 64
        lying = b"".join(record(wrong + 1 if i == wrong else i, b"v" * i) for i in range(300))
        assert f"record {wrong}" in _refused(batch(lying, count=300), ErrorCode.invalid_record)


@given(st.binary(max_size=200))
def test_any_bytes_give_batches_or_an_error(blob: bytes) -> None:
    result = split_batches(blob, POLICY, NOW, single_batch=False)
    assert isinstance(result, (list, BatchError))


@given(
    st.sampled_from([Codec.NONE, Codec.SNAPPY, Codec.LZ4]),
    st.lists(st.tuples(st.integers(min_value=61), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_damaged_records_with_a_valid_crc_are_refused_or_readable(
    codec: Codec, edits: list[tuple[int, int]]
) -> None:
    """What the validator accepts, the reader reads, record for record: the two agree."""
    damaged = bytearray(build_batch(RECORDS, codec=codec))
    for position, byte in edits:
        damaged[61 + position % (len(damaged) - 61)] = byte
    struct.pack_into(">I", damaged, 17, crc32c.crc32c(damaged[21:]))
    result = split_batches(bytes(damaged), BatchPolicy(MAX, timestamp_after_max_ms=2**62), NOW)
    if isinstance(result, list):
        assert len(list(iter_records(result[0].data))) == result[0].header.records_count


@given(st.binary(max_size=120), st.sampled_from(list(Codec)), st.integers(1, 4))
def test_any_records_section_is_refused_or_readable(body: bytes, codec: Codec, count: int) -> None:
    result = split_batches(batch(body, count=count, codec=codec), POLICY, NOW)
    if isinstance(result, list):
        assert len(list(iter_records(result[0].data))) == count
    else:
        assert result.error_code in (
            ErrorCode.invalid_record,
            ErrorCode.invalid_timestamp,
            ErrorCode.message_too_large,  # e.g. a snappy block that declares 64 MiB and more
        )
    with contextlib.suppress(DecodeError):  # the reader raises only the decode error
        list(iter_records(batch(body, count=count, codec=codec)))


def test_the_fixture_writer_agrees_with_kafkas_layout() -> None:
    assert batch(record(0, b"value-1", key=b"key-1"), count=1) == build_batch(
        [(b"key-1", b"value-1", [], T0)]
    )
