"""The segment and index formats, checked against bytes built here by hand (struct + crc32c, never
the module's own helpers), a pinned golden segment, round-trip properties and every corruption.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.storage.segment import (
    FLAG_CLEANED,
    CorruptSegment,
    Index,
    IndexEntry,
    SegmentKey,
    build_segment,
    index_key,
    parse_index,
    parse_segment,
    parse_segment_key,
    read_batches,
    rebuild_index,
    segment_key,
    segment_prefix,
)

CREATED_MS = 1_700_000_000_000


def varint(value: int) -> bytes:
    """Kafka's zigzag varint (the record fields of a v2 batch)."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        low, zigzag = zigzag & 0x7F, zigzag >> 7
        out.append(low | (0x80 if zigzag else 0))
        if not zigzag:
            return bytes(out)


def record(offset_delta: int, value: bytes, key: bytes | None = None) -> bytes:
    body = (
        b"\x00"  # attributes
        + varint(offset_delta)  # timestamp delta: one millisecond per record
        + varint(offset_delta)
        + (varint(-1) if key is None else varint(len(key)) + key)
        + varint(len(value))
        + value
        + varint(0)  # no headers
    )
    return varint(len(body)) + body


def make_batch(
    base_offset: int, values: list[bytes], *, leader_epoch: int = -1, attributes: int = 0
) -> bytes:
    """A Kafka v2 record batch, laid out field by field from the protocol guide."""
    after_crc = struct.pack(
        ">hiqqqhii",
        attributes,
        len(values) - 1,  # last offset delta
        CREATED_MS,  # first timestamp
        CREATED_MS + len(values) - 1,  # max timestamp
        -1,  # producer id
        -1,  # producer epoch
        -1,  # base sequence
        len(values),  # records count
    ) + b"".join(record(i, value) for i, value in enumerate(values))
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, then the rest
    head = struct.pack(
        ">qiibI", base_offset, batch_length, leader_epoch, 2, crc32c.crc32c(after_crc)
    )
    return head + after_crc


def make_batches(base_offset: int, sizes: list[int]) -> list[bytes]:
    batches = []
    for size in sizes:
        batches.append(make_batch(base_offset, [b"v%d" % (base_offset + i) for i in range(size)]))
        base_offset += size
    return batches


# --- the test's own batch builder agrees with a real client -------------------------------------


def test_hand_built_batch_matches_aiokafka() -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(0, timestamp=CREATED_MS, key=None, value=b"a", headers=[])
    builder.append(1, timestamp=CREATED_MS + 1, key=None, value=b"bc", headers=[])
    assert make_batch(0, [b"a", b"bc"]) == bytes(builder.build())


def test_crc32c_is_castagnoli() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the IEEE CRC32 would be 0xCBF43926


# --- golden bytes -------------------------------------------------------------------------------


def test_every_header_footer_and_index_field_at_its_offset() -> None:
    batches = [
        make_batch(0, [b"a", b"b"]),
        make_batch(2, [b"c"]),
        make_batch(3, [b"d", b"e", b"f"]),
    ]
    body = b"".join(batches)
    data, index = build_segment(batches, flags=2, created_ms=CREATED_MS, index_interval=2)

    assert len(data) == 32 + len(body) + 16
    assert data[0:4] == b"KAFS"
    assert struct.unpack(">H", data[4:6]) == (1,)  # version
    assert struct.unpack(">H", data[6:8]) == (2,)  # flags: the codec applied (snappy)
    assert struct.unpack(">q", data[8:16]) == (0,)  # base offset
    assert struct.unpack(">i", data[16:20]) == (6,)  # records, not batches
    assert struct.unpack(">q", data[20:28]) == (CREATED_MS,)
    assert data[28:32] == bytes(4)  # reserved
    assert data[32:-16] == body
    assert struct.unpack(">I", data[-16:-12]) == (crc32c.crc32c(body),)
    assert struct.unpack(">q", data[-12:-4]) == (5,)  # last offset
    assert data[-4:] == b"END!"

    # interval 2: batch 0 (first), batch 1 (2 records passed), not batch 2 (1 record passed)
    assert index[0:4] == b"IDX\x00"
    assert struct.unpack(">HiiH", index[4:16]) == (1, 2, 2, 0)  # version, count, interval, rsvd
    assert len(index) == 16 + 2 * 12
    assert struct.unpack(">qi", index[16:28]) == (0, 32)  # positions include the header
    assert struct.unpack(">qi", index[28:40]) == (2, 32 + len(batches[0]))


# Two one-record batches (offsets 7 and 8), index interval 1. These bytes are identical to what
# the Go KafScale writer (KafScale/platform pkg/storage BuildSegment) produces for the same batches.
GOLDEN_SEGMENT = (
    "4b414653000100000000000000000007000000020000018bcfe568000000000000000000000000070000003a"
    "ffffffff02168751420000000000000000018bcfe568000000018bcfe56800ffffffffffffffffffffffffff"
    "ff0000000110000000010476370000000000000000080000003affffffff02f1fe5bbf000000000000000001"
    "8bcfe568000000018bcfe56800ffffffffffffffffffffffffffff000000011000000001047638001460ff82"
    "0000000000000008454e4421"
)
GOLDEN_INDEX = "49445800000100000002000000010000000000000000000700000020000000000000000800000066"


def test_golden_segment_is_pinned() -> None:
    batches = [make_batch(7, [b"v7"]), make_batch(8, [b"v8"])]
    data, index = build_segment(batches, flags=0, created_ms=CREATED_MS, index_interval=1)
    assert data.hex() == GOLDEN_SEGMENT
    assert index.hex() == GOLDEN_INDEX
    segment = parse_segment(bytes.fromhex(GOLDEN_SEGMENT))
    assert [tuple(span) for span in segment.batches] == [(7, 7, 32, 70), (8, 8, 102, 70)]
    assert parse_index(bytes.fromhex(GOLDEN_INDEX)).entries == ((7, 32), (8, 102))


# --- parsing and round trips --------------------------------------------------------------------


def test_parse_gives_header_footer_and_batch_spans() -> None:
    batches = make_batches(10, [2, 1, 3])
    data, _ = build_segment(batches, flags=0, created_ms=CREATED_MS)
    segment = parse_segment(data)
    assert (segment.version, segment.flags, segment.base_offset) == (1, 0, 10)
    assert (segment.record_count, segment.created_ms, segment.last_offset) == (6, CREATED_MS, 15)
    assert segment.crc == crc32c.crc32c(b"".join(batches))
    sizes = [len(b) for b in batches]
    assert [tuple(span) for span in segment.batches] == [
        (10, 11, 32, sizes[0]),
        (12, 12, 32 + sizes[0], sizes[1]),
        (13, 15, 32 + sizes[0] + sizes[1], sizes[2]),
    ]
    assert bytes(segment.body) == b"".join(batches)


@settings(max_examples=200, deadline=None)
@given(
    base_offset=st.integers(0, 2**40),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    interval=st.integers(1, 10),
    flags=st.integers(0, 4),
)
def test_round_trip(base_offset: int, sizes: list[int], interval: int, flags: int) -> None:
    batches = make_batches(base_offset, sizes)
    data, index_bytes = build_segment(batches, flags, CREATED_MS, index_interval=interval)
    segment = parse_segment(data)
    assert [bytes(segment.data[s.position : s.position + s.length]) for s in segment.batches] == (
        batches
    )
    assert (segment.flags, segment.record_count) == (flags, sum(sizes))
    assert segment.last_offset == base_offset + sum(sizes) - 1
    index = parse_index(index_bytes)
    assert index.interval == interval
    assert rebuild_index(data, interval) == index_bytes
    starts = {span.position: span for span in segment.batches}
    for offset in range(base_offset, segment.last_offset + 1):
        position = index.lookup(offset)
        assert starts[position].base_offset <= offset  # scan forward from a batch boundary
        tail = read_batches(segment, offset)
        holder = next(s for s in segment.batches if s.base_offset <= offset <= s.last_offset)
        assert bytes(tail) == data[holder.position : -16]
        assert holder.position >= position


def test_index_lookup_every_offset() -> None:
    sizes = [3, 1, 1, 4, 2]
    batches = make_batches(100, sizes)
    _, index_bytes = build_segment(batches, flags=0, created_ms=CREATED_MS, index_interval=3)
    positions = [32]
    for batch in batches[:-1]:
        positions.append(positions[-1] + len(batch))
    # entries at batch 0 (the first), batch 1 (3 records passed), batch 4 (1 + 1 + 4 passed)
    index = parse_index(index_bytes)
    entries = (IndexEntry(100, positions[0]), IndexEntry(103, positions[1]))
    assert index == Index(1, 3, (*entries, IndexEntry(109, positions[4])))
    expected = {100: 0, 101: 0, 102: 0, 103: 1, 104: 1, 105: 1, 106: 1, 107: 1, 108: 1, 109: 4}
    expected[110] = 4
    for offset, batch_number in expected.items():
        assert index.lookup(offset) == positions[batch_number]
    with pytest.raises(ValueError):
        index.lookup(99)


def test_read_batches_outside_the_segment() -> None:
    data, _ = build_segment(make_batches(5, [2]), flags=0, created_ms=CREATED_MS)
    segment = parse_segment(data)
    for offset in (4, 7):
        with pytest.raises(ValueError):
            read_batches(segment, offset)


def test_build_rejects_what_would_not_verify() -> None:
    good = make_batches(0, [2, 2])
    with pytest.raises(ValueError):
        build_segment([], flags=0, created_ms=CREATED_MS)
    with pytest.raises(ValueError):  # a gap in offsets
        build_segment([good[0], make_batch(3, [b"x"])], flags=0, created_ms=CREATED_MS)
    with pytest.raises(ValueError):  # one and a half batches
        build_segment([good[0] + good[1][:20]], flags=0, created_ms=CREATED_MS)
    with pytest.raises(ValueError):  # a bad batch CRC
        build_segment([good[0][:-1] + b"?"], flags=0, created_ms=CREATED_MS)
    with pytest.raises(ValueError):
        build_segment(good, flags=1 << 16, created_ms=CREATED_MS)
    with pytest.raises(ValueError):
        build_segment(good, flags=0, created_ms=CREATED_MS, index_interval=0)


# --- corruption ---------------------------------------------------------------------------------

UNPROTECTED = {range(6, 8): "flags", range(20, 28): "created ms", range(28, 32): "reserved"}


def small_segment() -> bytes:
    data, _ = build_segment(make_batches(0, [2, 1]), flags=0, created_ms=CREATED_MS)
    return data


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_flipped_byte_is_caught_or_unprotected(mask: int) -> None:
    data = small_segment()
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= mask
        if any(i in span for span in UNPROTECTED):
            # no checksum covers these header fields: they parse, changed, and nothing else does
            assert parse_segment(bytes(flipped)).batches == parse_segment(data).batches
            continue
        with pytest.raises(CorruptSegment):
            parse_segment(bytes(flipped))


def test_every_truncation_and_extension_is_caught() -> None:
    data = small_segment()
    for cut in range(len(data)):
        with pytest.raises(CorruptSegment):
            parse_segment(data[:cut])
    with pytest.raises(CorruptSegment):
        parse_segment(data + b"\x00")


def test_a_bad_batch_crc_names_the_batch() -> None:
    batches = make_batches(0, [2, 1])
    bad = bytearray(batches[1])
    bad[-1] ^= 0x01  # inside the records: the batch CRC and the footer CRC both fail
    data = struct.pack(">4sHHqiqI", b"KAFS", 1, 0, 0, 3, CREATED_MS, 0) + batches[0] + bad
    data += struct.pack(">Iq4s", crc32c.crc32c(batches[0] + bad), 2, b"END!")
    with pytest.raises(CorruptSegment, match=f"batch at position {32 + len(batches[0])}"):
        parse_segment(data)
    assert len(parse_segment(data, verify=False).batches) == 2  # framing alone still reads


def check_parse_or_corrupt(data: bytes, verify: bool) -> None:
    """The fuzz invariant: parse or raise CorruptSegment, and what parses is self-consistent."""
    try:
        segment = parse_segment(data, verify=verify)
    except CorruptSegment:
        return
    position = 32
    for span in segment.batches:  # the spans tile the body exactly
        assert span.position == position and span.length >= 61
        position += span.length
    assert position == len(data) - 16
    if verify:
        assert segment.batches and segment.batches[0].base_offset == segment.base_offset
        assert segment.batches[-1].last_offset == segment.last_offset


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_raise_corrupt(data: bytes) -> None:
    for candidate in (data, b"KAFS\x00\x01" + data, b"KAFS\x00\x01" + data + b"END!"):
        for verify in (True, False):
            check_parse_or_corrupt(candidate, verify)
    for candidate in (data, b"IDX\x00\x00\x01" + data):
        try:
            index = parse_index(candidate)
        except CorruptSegment:
            continue
        assert len(candidate) == 16 + 12 * len(index.entries)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_segments_parse_or_raise_corrupt(data: st.DataObject) -> None:
    segment = bytearray(small_segment())
    for _ in range(data.draw(st.integers(1, 4))):
        segment[data.draw(st.integers(0, len(segment) - 1))] = data.draw(st.integers(0, 255))
    for verify in (True, False):
        check_parse_or_corrupt(bytes(segment), verify)


def test_index_corruption() -> None:
    _, index = build_segment(
        make_batches(0, [1, 1, 1]), flags=0, created_ms=CREATED_MS, index_interval=1
    )
    for cut in range(len(index)):
        with pytest.raises(CorruptSegment):
            parse_index(index[:cut])
    # magic, version, count and the interval's sign; a larger interval or reserved bits still parse
    for i in range(11):
        flipped = bytearray(index)
        flipped[i] ^= 0x80
        with pytest.raises(CorruptSegment):
            parse_index(bytes(flipped))
    swapped = index[:16] + index[28:40] + index[16:28] + index[40:]
    with pytest.raises(CorruptSegment, match="entry 1"):
        parse_index(swapped)


# --- keys ---------------------------------------------------------------------------------------


def test_keys() -> None:
    assert segment_key("prod", "orders", 3, 42) == "prod/orders/3/segment-00000000000000000042.kfs"
    assert index_key("prod", "orders", 3, 42) == "prod/orders/3/segment-00000000000000000042.index"
    assert segment_prefix("prod", "orders", 3) == "prod/orders/3/"
    assert parse_segment_key("prod/orders/3/segment-00000000000000000042.kfs") == SegmentKey(
        "prod", "orders", 3, 42, "kfs"
    )
    assert parse_segment_key(index_key("a", "b.c-d", 0, 2**63 - 1)) == SegmentKey(
        "a", "b.c-d", 0, 2**63 - 1, "index"
    )
    for bad in (
        "prod/orders/3/segment-42.kfs",
        "prod/orders/03/segment-00000000000000000042.kfs",
        "orders/3/segment-00000000000000000042.kfs",
        "prod/orders/3/segment-00000000000000000042.log",
        "prod/orders/3/segment-99999999999999999999.kfs",
        "x/prod/orders/3/segment-00000000000000000042.kfs",
    ):
        assert parse_segment_key(bad) is None, bad
    for args in (("", "t", 0, 0), ("n", "a/b", 0, 0), ("n", "t", -1, 0), ("n", "t", 0, -1)):
        with pytest.raises(ValueError):
            segment_key(*args)
    # lexicographic order is offset order
    keys = [segment_key("n", "t", 0, offset) for offset in (0, 9, 10, 100, 2**40)]
    assert sorted(keys) == keys


# --- cleaned segments (compacted topics) ----------------------------------------------------------


def test_a_cleaned_segment_covers_its_range_with_gaps_and_may_hold_nothing() -> None:
    kept = [make_batch(12, [b"a", b"b"]), make_batch(20, [b"c"])]  # 12-13, 20
    data, index = build_segment(
        kept, flags=FLAG_CLEANED | 2, created_ms=CREATED_MS, covers=(10, 29)
    )
    segment = parse_segment(data)
    assert (segment.base_offset, segment.last_offset, segment.record_count) == (10, 29, 3)
    assert [(b.base_offset, b.last_offset) for b in segment.batches] == [(12, 13), (20, 20)]
    assert parse_index(index).entries[0].offset == 12
    assert bytes(read_batches(segment, 10)) == b"".join(kept)  # from the next batch kept
    assert bytes(read_batches(segment, 14)) == kept[1]
    assert bytes(read_batches(segment, 25)) == b""  # nothing kept after 20
    with pytest.raises(ValueError):
        read_batches(segment, 30)
    empty, empty_index = build_segment([], flags=FLAG_CLEANED, created_ms=1, covers=(0, 9))
    nothing = parse_segment(empty)
    assert nothing.batches == () and (nothing.base_offset, nothing.last_offset) == (0, 9)
    assert parse_index(empty_index).entries == ()
    assert bytes(read_batches(nothing, 5)) == b""


def test_a_cleaned_segment_still_verifies_order_and_range() -> None:
    with pytest.raises(ValueError):  # batches out of order
        build_segment(
            [make_batch(20, [b"c"]), make_batch(12, [b"a"])],
            flags=FLAG_CLEANED,
            created_ms=1,
            covers=(10, 29),
        )
    with pytest.raises(ValueError):  # a batch outside the range covered
        build_segment([make_batch(30, [b"c"])], flags=FLAG_CLEANED, created_ms=1, covers=(10, 29))
    with pytest.raises(ValueError):  # a gap without the flag
        build_segment([make_batch(0, [b"a"]), make_batch(5, [b"b"])], flags=0, created_ms=1)
    with pytest.raises(ValueError):  # the flag and the range go together
        build_segment([make_batch(0, [b"a"])], flags=FLAG_CLEANED, created_ms=1)


def test_cleaned_generations_have_keys_of_their_own() -> None:
    key = segment_key("prod", "orders", 3, 42, generation=2)
    assert key == "prod/orders/3/segment-00000000000000000042.g2.kfs"
    assert (
        index_key("prod", "orders", 3, 42, 2)
        == "prod/orders/3/segment-00000000000000000042.g2.index"
    )
    assert parse_segment_key(key) == SegmentKey("prod", "orders", 3, 42, "kfs", 2)
    assert parse_segment_key("prod/orders/3/segment-00000000000000000042.g0.kfs") is None
    assert segment_key("prod", "orders", 3, 42, 0) == segment_key("prod", "orders", 3, 42)
