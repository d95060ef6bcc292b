"""The write-ahead object format: a pinned object laid out by hand from the design's table
(docs/design/write-path.md, section 2), round trips, and every kind of corruption and truncation
reported as CorruptObject (never another exception)."""

from __future__ import annotations

import re
import struct
import uuid

import crc32c
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kafscale.storage import wal
from kafscale.storage.wal import (
    ChunkInput,
    CorruptObject,
    DirectoryEntry,
    Header,
    build_object,
    directory_length,
    object_key,
    object_name,
    parse_directory,
    parse_header,
    parse_object,
)
from tests.unit.storage.test_segment import CREATED_MS, make_batch, make_batches

TOPIC_ID = "00112233-4455-6677-8899-aabbccddeeff"


def chunk_of(
    topic: str, partition: int, base_offset: int, sizes: list[int], *, codec: int = 0
) -> ChunkInput:
    batches = make_batches(base_offset, sizes)
    return ChunkInput(
        topic=topic,
        topic_id=str(uuid.uuid5(uuid.NAMESPACE_DNS, topic)),
        partition=partition,
        base_offset=base_offset,
        last_offset=base_offset + sum(sizes) - 1,
        records=sum(sizes),
        max_timestamp=CREATED_MS + max(sizes) - 1,
        codec=codec,
        created_ms=CREATED_MS + partition,
        batches=batches,
    )


def assert_round_trip(chunks: list[ChunkInput], data: bytes, entries: list[DirectoryEntry]) -> None:
    parsed = parse_object(data)
    assert parsed.size == len(data)
    assert list(parsed.entries) == entries
    assert parse_directory(data[: directory_length(parse_header(data))]) == entries
    for chunk, entry, view in zip(chunks, entries, parsed.chunks, strict=True):
        assert bytes(view) == b"".join(chunk.batches)
        assert data[entry.position : entry.position + entry.size] == bytes(view)
        given_fields = (chunk.topic, chunk.topic_id, chunk.partition, chunk.base_offset)
        assert (entry.topic, entry.topic_id, entry.partition, entry.base_offset) == given_fields
        assert (entry.last_offset, entry.records, entry.codec) == (
            chunk.last_offset,
            chunk.records,
            chunk.codec,
        )
        assert (entry.max_timestamp, entry.created_ms) == (chunk.max_timestamp, chunk.created_ms)


# --- pinned bytes -------------------------------------------------------------------------------

BATCH_5 = bytes.fromhex(  # make_batch(5, [b"v"]): one record at offset 5
    "0000000000000005" "00000039" "ffffffff" "02" "d3f2ac75" "0000" "00000000"
    "0000018bcfe56800" "0000018bcfe56800" "ffffffffffffffff" "ffff" "ffffffff" "00000001"
    "0e00000001027600"
)  # fmt: skip
BATCH_6 = bytes.fromhex(  # make_batch(6, [b"w"])
    "0000000000000006" "00000039" "ffffffff" "02" "c0503402" "0000" "00000000"
    "0000018bcfe56800" "0000018bcfe56800" "ffffffffffffffff" "ffff" "ffffffff" "00000001"
    "0e00000001027700"
)  # fmt: skip


def entry_hex(base_offset: str, position: str, chunk_crc: str) -> str:
    return (
        "00112233445566778899aabbccddeeff"  # topic id
        "0001" "74"  # topic name length 1, "t"
        "00000001"  # partition 1
        f"{base_offset}{base_offset}"  # base offset, last offset
        f"{position}"  # chunk position
        "00000045"  # chunk size 69
        "00000001"  # record count 1
        "0000018bcfe56800"  # max timestamp 1700000000000
        "00"  # codec none
        "0000018bcfe56801"  # created 1700000000001
        f"{chunk_crc}"
    )  # fmt: skip


PINNED = (
    bytes.fromhex(
        "4b57414c" "0001" "0000"  # "KWAL", version 1, flags 0
        "0000018bcfe56802"  # created 1700000000002
        "00000002" "00000098"  # 2 entries, directory of 152 bytes (2 x 76)
        "b6602c49" "00000000"  # CRC32C of the directory, reserved
    )
    + bytes.fromhex(entry_hex("0000000000000005", "00000000000000b8", "9be4ab31"))  # chunk at 184
    + bytes.fromhex(entry_hex("0000000000000006", "00000000000000fd", "686a3d97"))  # chunk at 253
    + BATCH_5
    + BATCH_6
    + bytes.fromhex("35d7f9d2" "0000000000000152" "454e4421")  # crc of both, size 338, "END!"
)  # fmt: skip


def pinned_chunk(base_offset: int, batch: bytes) -> ChunkInput:
    return ChunkInput(
        "t", TOPIC_ID, 1, base_offset, base_offset, 1, CREATED_MS, 0, CREATED_MS + 1, [batch]
    )


def test_pinned_object() -> None:
    assert make_batch(5, [b"v"]) == BATCH_5 and make_batch(6, [b"w"]) == BATCH_6
    data, entries = build_object(
        [pinned_chunk(5, BATCH_5), pinned_chunk(6, BATCH_6)], CREATED_MS + 2
    )
    assert data.hex() == PINNED.hex()
    assert entries == [
        DirectoryEntry(
            "t", TOPIC_ID, 1, 5, 5, 184, 69, 1, CREATED_MS, 0, CREATED_MS + 1, 0x9BE4AB31
        ),
        DirectoryEntry(
            "t", TOPIC_ID, 1, 6, 6, 253, 69, 1, CREATED_MS, 0, CREATED_MS + 1, 0x686A3D97
        ),
    ]
    assert parse_header(PINNED) == Header(1, 0, CREATED_MS + 2, 2, 152, 0xB6602C49)
    assert crc32c.crc32c(PINNED[32:184]) == 0xB6602C49  # the pinned CRCs are the real ones
    assert crc32c.crc32c(BATCH_5 + BATCH_6) == 0x35D7F9D2


# --- round trips --------------------------------------------------------------------------------


def test_round_trip_several_topics_partitions_and_chunks() -> None:
    chunks = [
        chunk_of("orders", 0, 0, [2, 1]),
        chunk_of("orders", 0, 3, [4]),  # a second chunk of one partition, contiguous
        chunk_of("orders", 7, 100, [1], codec=4),
        chunk_of("payments.eu", 2, 9, [3, 3, 1], codec=1),
    ]
    data, entries = build_object(chunks, CREATED_MS)
    assert_round_trip(chunks, data, entries)
    assert entries[0].position == directory_length(parse_header(data))
    assert entries[1].position == entries[0].position + entries[0].size


def test_empty_object() -> None:
    data, entries = build_object([], CREATED_MS)
    assert entries == [] and len(data) == 32 + 16
    parsed = parse_object(data)
    assert parsed.entries == () and parsed.chunks == () and parsed.chunks_crc == 0
    assert parsed.header == Header(1, 0, CREATED_MS, 0, 0, 0)


chunk_inputs = st.builds(
    chunk_of,
    topic=st.text(alphabet="ab._-é", min_size=1, max_size=12),
    partition=st.integers(0, 2**31 - 1),
    base_offset=st.integers(0, 2**40),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    codec=st.integers(0, 4),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(chunk_inputs, max_size=5), created_ms=st.integers(-(2**63), 2**63 - 1))
def test_any_chunks_round_trip(chunks: list[ChunkInput], created_ms: int) -> None:
    data, entries = build_object(chunks, created_ms)
    assert_round_trip(chunks, data, entries)
    assert parse_header(data).created_ms == created_ms


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(chunk_inputs, max_size=3), data=st.data())
def test_any_flipped_byte_is_detected(chunks: list[ChunkInput], data: st.DataObject) -> None:
    built, _ = build_object(chunks, CREATED_MS)
    where = data.draw(st.integers(0, len(built) - 1))
    assume(not 8 <= where < 16)  # the header's created_ms: under no checksum (next test)
    flipped = bytearray(built)
    flipped[where] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptObject):
        parse_object(bytes(flipped), verify=True)


def test_the_header_created_ms_is_under_no_checksum() -> None:
    flipped = bytearray(PINNED)
    flipped[15] ^= 1
    assert parse_object(bytes(flipped)).header.created_ms == CREATED_MS + 3


def test_truncation_at_every_length() -> None:
    data, _ = build_object([chunk_of("a", 0, 0, [2]), chunk_of("b", 1, 5, [1, 1])], CREATED_MS)
    directory_end = directory_length(parse_header(data))
    for cut in range(len(data)):
        for verify in (True, False):
            with pytest.raises(CorruptObject):
                parse_object(data[:cut], verify=verify)
        if cut < directory_end:
            with pytest.raises(CorruptObject):
                parse_directory(data[:cut])
        else:
            assert len(parse_directory(data[:cut])) == 2


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(CorruptObject, match="magic b'ND!\\\\x00'"):
        parse_object(PINNED + b"\x00")
    with pytest.raises(CorruptObject, match="object size 338, the object has 354 bytes"):
        parse_object(PINNED + PINNED[-16:])


# --- corruption, by field -----------------------------------------------------------------------


def with_directory(data: bytes, patch: dict[int, bytes]) -> bytes:
    """``data`` with bytes replaced at the given positions, its directory CRC made right again."""
    out = bytearray(data)
    for position, value in patch.items():
        out[position : position + len(value)] = value
    end = directory_length(parse_header(data))
    out[24:28] = struct.pack(">I", crc32c.crc32c(bytes(out[32:end])))
    return bytes(out)


def test_overlapping_chunks_are_refused() -> None:
    second_position = 32 + 76 + 39  # entry 1: id, length, name, partition, base, last
    overlapping = with_directory(PINNED, {second_position: struct.pack(">q", 252)})
    with pytest.raises(CorruptObject, match="chunk at position 252, expected 253"):
        parse_object(overlapping, verify=False)


def test_chunks_out_of_range_are_refused() -> None:
    second_size = 32 + 76 + 47
    longer = with_directory(PINNED, {second_size: struct.pack(">I", 70)})
    with pytest.raises(CorruptObject, match="chunks end at position 323, the footer starts at 322"):
        parse_object(longer, verify=False)


def test_a_directory_that_disagrees_with_its_batches() -> None:
    records = 32 + 51  # entry 0's record count
    lying = with_directory(PINNED, {records: struct.pack(">i", 2)})
    assert parse_object(lying, verify=False).entries[0].records == 2
    with pytest.raises(CorruptObject, match="with 1 records, the directory says 5 and 2"):
        parse_object(lying)


def test_verify_false_skips_the_chunk_crcs() -> None:
    flipped = bytearray(PINNED)
    flipped[200] ^= 0x10  # inside chunk 0
    parsed = parse_object(bytes(flipped), verify=False)
    assert bytes(parsed.chunks[0])[200 - 184] == PINNED[200] ^ 0x10
    with pytest.raises(CorruptObject, match=r"chunk 0 \(t-1\) at position 184: CRC32C"):
        parse_object(bytes(flipped))


@pytest.mark.parametrize(
    ("position", "value", "message"),
    [
        (0, b"KWAX", "magic b'KWAX'"),
        (4, b"\x00\x02", "unsupported version 2"),
        (6, b"\x00\x01", "flags 1"),
        (28, b"\x00\x00\x00\x01", "reserved 1"),
        (16, b"\x00\x00\x00\x03", "3 entries cannot fit a directory of 152 bytes"),
        (20, b"\x00\x00\x00\x97", "directory CRC32C"),
        (24, b"\x00\x00\x00\x00", "directory CRC32C stored 0x00000000"),
        (40, b"\xff", "directory CRC32C"),
        (338 - 16, b"\x00\x00\x00\x00", "CRC32C of the chunks stored 0x00000000"),
        (338 - 12, struct.pack(">Q", 337), "object size 337"),
        (338 - 4, b"END?", "magic b'END?'"),
    ],
)
def test_each_header_and_footer_field_is_checked(position: int, value: bytes, message: str) -> None:
    corrupt = bytearray(PINNED)
    corrupt[position : position + len(value)] = value
    with pytest.raises(CorruptObject, match=re.escape(message)):
        parse_object(bytes(corrupt))


def test_entry_count_and_directory_must_agree() -> None:
    one_entry = bytearray(PINNED)
    one_entry[16:20] = struct.pack(">I", 1)
    with pytest.raises(CorruptObject, match="76 bytes left after its 1 entries"):
        parse_object(bytes(one_entry))


def test_a_topic_name_that_is_not_utf8() -> None:
    bad = with_directory(PINNED, {32 + 18: b"\xff"})
    with pytest.raises(CorruptObject, match="topic name is not UTF-8"):
        parse_directory(bad)


# --- building refuses what the format cannot say -----------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"last_offset": 6}, "batches end at offset 5 with 1 records, the directory says 6 and 1"),
        ({"records": 2}, "the directory says 5 and 2"),
        ({"base_offset": 4}, "offsets 5..5, 69 bytes of 69 left; expected magic 2 from offset 4"),
        ({"batches": []}, "one or more batches"),
        ({"batches": [BATCH_5[:-1]]}, "69 bytes of 68 left"),
        ({"codec": 5}, "codec 5"),
        ({"topic": ""}, "topic name of 0 bytes"),
        ({"partition": -1}, "invalid partition"),
        ({"max_timestamp": 2**63}, "does not fit in an int64"),
        ({"topic_id": "not-a-uuid"}, "badly formed"),
    ],
)
def test_build_refuses(change: dict[str, object], message: str) -> None:
    fields = {
        "topic": "t",
        "topic_id": TOPIC_ID,
        "partition": 1,
        "base_offset": 5,
        "last_offset": 5,
        "records": 1,
        "max_timestamp": CREATED_MS,
        "codec": 0,
        "created_ms": CREATED_MS,
        "batches": [BATCH_5],
    }
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        build_object([ChunkInput(**fields)], CREATED_MS)  # type: ignore[arg-type]


# --- keys ---------------------------------------------------------------------------------------


def test_keys() -> None:
    token = wal.new_token()
    assert len(token) == 16 and int(token, 16) >= 0 and token != wal.new_token()
    key = object_key("default", 3, "0123456789abcdef", 42)
    assert key == "default/!wal/3/0123456789abcdef/0000000042.wal"
    assert (
        key.startswith(wal.wal_prefix("default")) and wal.wal_prefix("default") == "default/!wal/"
    )
    assert key.startswith(wal.broker_prefix("default", 3))
    assert object_name(key) == "3/0123456789abcdef/0000000042"
    assert wal.parse_object_key(key) == wal.WalKey("default", 3, "0123456789abcdef", 42)
    later = object_key("default", 3, "0123456789abcdef", 43)
    assert key < later  # key order is sequence order


@pytest.mark.parametrize(
    "key",
    [
        "default/orders/0/segment-00000000000000000000.kfs",
        "default/!wal/3/0123456789abcdef/42.wal",
        "default/!wal/03/0123456789abcdef/0000000042.wal",
        "default/!wal/3/0123456789ABCDEF/0000000042.wal",
        "default/!wal/3/0123456789abcdef/0000000042.wal.tmp",
    ],
)
def test_keys_we_would_not_write(key: str) -> None:
    assert wal.parse_object_key(key) is None
    with pytest.raises(ValueError, match="not a write-ahead object key"):
        object_name(key)


@pytest.mark.parametrize(
    ("namespace", "broker", "token", "seq"),
    [
        ("", 0, "0123456789abcdef", 0),
        ("a/b", 0, "0123456789abcdef", 0),
        ("ns", -1, "0123456789abcdef", 0),
        ("ns", 0, "0123456789abcde", 0),
        ("ns", 0, "0123456789abcdef", 10**10),
    ],
)
def test_invalid_key_parts(namespace: str, broker: int, token: str, seq: int) -> None:
    with pytest.raises(ValueError):
        object_key(namespace, broker, token, seq)


def test_parse_directory_without_verify_reads_past_a_bad_directory_crc() -> None:
    corrupt = bytearray(PINNED)
    corrupt[24] ^= 0x01
    with pytest.raises(CorruptObject, match="directory CRC32C"):
        parse_directory(bytes(corrupt))
    assert parse_directory(bytes(corrupt), verify=False) == parse_directory(PINNED)
    with pytest.raises(CorruptObject, match="directory CRC32C"):
        parse_object(bytes(corrupt), verify=False)  # the whole object: always checked
