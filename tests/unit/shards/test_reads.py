"""The read path's pieces without processes: caches, the entry list, ranged reads of segments and
of chunks of write-ahead objects."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from kafscale.metadata.records import Keys, SegmentRecord, decode_segment, encode
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.shards import reads
from kafscale.shards.cache import ByteLRU, chunk_of
from kafscale.shards.reads import SegmentRef
from kafscale.shards.segments import CommittedSegments
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import ObjectInfo, ObjectNotFound, ObjectStore
from kafscale.storage.segment import CorruptSegment

NS, TOPIC, PARTITION = "ns", "t", 0


class CountingStore:
    """A real local store that records every ranged read it serves."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.gets: list[tuple[str, int, int | None]] = []
        self.bytes_read = 0

    @property
    def description(self) -> str:
        return self.inner.description

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        self.gets.append((key, start, length))
        data = self.inner.get(key, start, length)
        self.bytes_read += len(data)
        return data

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def list(self, prefix: str) -> list[ObjectInfo]:
        raise AssertionError("the read path never lists")

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()


def batches(first_offset: int, count: int, records_per_batch: int, value_size: int) -> list[bytes]:
    out = []
    offset = first_offset
    for b in range(count):
        rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
            (f"k{offset + i}".encode(), bytes([b % 251]) * value_size, [], 1_000 + offset + i)
            for i in range(records_per_batch)
        ]
        batch = bytearray(records.build_batch(rows))
        records.patch_base_offset(batch, 0, offset)
        out.append(bytes(batch))
        offset += records_per_batch
    return out


def put_segment(store: ObjectStore, written: list[bytes], index_interval: int = 100) -> SegmentRef:
    kfs, index = segments.build_segment(written, 0, 5, index_interval=index_interval)
    first = records.read_header(written[0]).base_offset
    last = records.read_header(written[-1]).last_offset
    record = SegmentRecord(first, last, len(kfs), len(index), last - first + 1, 0, 5)
    ref = SegmentRef.of(NS, TOPIC, PARTITION, record)
    assert ref.index_key is not None
    store.put_if_absent(ref.key, kfs)
    store.put_if_absent(ref.index_key, index)
    return ref


@pytest.fixture
def store(tmp_path: object) -> CountingStore:
    return CountingStore(LocalObjectStore(str(tmp_path)))


def test_lru_evicts_least_recently_used_by_bytes() -> None:
    cache: ByteLRU[str, str] = ByteLRU(10)
    cache.put("a", "A", 4)
    cache.put("b", "B", 4)
    assert cache.get("a") == "A"  # a is now the most recent
    assert cache.put("c", "C", 4) == ["b"]
    assert "b" not in cache and cache.used == 8
    assert cache.put("huge", "H", 11) == [] and "huge" not in cache


def test_chunk_slices_whole_batches_within_max_bytes() -> None:
    written = batches(10, 5, 2, 100)
    chunk = chunk_of(b"".join(written))
    size = len(written[0])
    assert chunk.first_offset == 10 and chunk.last_offset == 19
    assert bytes(chunk.batches_from(13, 2 * size)) == written[1] + written[2]
    # A batch larger than the limit still comes whole; a fetch mid-batch gets the whole batch.
    assert bytes(chunk.batches_from(15, 1)) == written[2]
    assert bytes(chunk.batches_from(19, 10**6)) == written[4]


def test_committed_segments_are_found_by_offset_and_timestamp() -> None:
    def seg(base: int, last: int, max_ts: int) -> SegmentRecord:
        return SegmentRecord(base, last, 100, 16, last - base + 1, max_ts, 0)

    found = CommittedSegments([seg(10, 19, 500), seg(0, 9, 300), seg(20, 29, 400)])
    assert found.find(0) == seg(0, 9, 300)
    assert found.find(25) == seg(20, 29, 400)
    assert found.find(30) is None
    assert found.first_reaching(350) == seg(10, 19, 500)
    assert found.first_reaching(501) is None
    assert found.max_timestamp() == seg(10, 19, 500)
    assert found.following(seg(0, 9, 300), 5) == [seg(10, 19, 500), seg(20, 29, 400)]
    found.add(seg(20, 29, 400))  # a retried commit changes nothing
    assert len(found) == 3


def test_ranged_read_from_the_middle_reads_far_less_than_the_segment(
    store: CountingStore,
) -> None:
    written = batches(0, 400, 1, 1000)  # ~430 KB, index entry every 100 records
    ref = put_segment(store, written)
    index = reads.read_index(store, ref)
    store.gets.clear()
    store.bytes_read = 0
    chunk = reads.read_range(store, ref, index, 250, 1)
    assert chunk.first_offset == 250
    assert bytes(chunk.batches_from(250, 1)) == written[250]
    assert store.bytes_read < ref.record.size / 3


def test_ranged_read_of_a_batch_larger_than_the_window(store: CountingStore) -> None:
    written = [*batches(0, 3, 1, 100), *batches(3, 1, 1, 300_000), *batches(4, 2, 1, 100)]
    ref = put_segment(store, written)
    chunk = reads.read_range(store, ref, reads.read_index(store, ref), 3, 1024)
    assert bytes(chunk.batches_from(3, 1)) == written[3]
    # without an index the reader walks from the first batch, skipping bodies it does not need
    chunk = reads.read_range(store, ref, None, 5, 1024)
    assert bytes(chunk.batches_from(5, 1)) == written[5]


def test_whole_segment_read_and_corruption_named(store: CountingStore, tmp_path: object) -> None:
    written = batches(0, 10, 3, 50)
    ref = put_segment(store, written)
    chunk = reads.read_segment(store, ref)
    assert chunk.complete and bytes(chunk.data) == b"".join(written)
    data = bytearray(store.get(ref.key))
    data[segments.HEADER_SIZE + 70] ^= 0xFF  # inside the first batch's records
    store.delete(ref.key)
    store.put_if_absent(ref.key, bytes(data))
    with pytest.raises(CorruptSegment, match=ref.key):
        reads.read_segment(store, ref)
    with pytest.raises(CorruptSegment, match="CRC32C"):
        reads.read_range(store, ref, None, 0, 10**6)


WAL = "ns/!wal/0/00000000000000ab/0000000003.wal"


def put_chunks(store: ObjectStore, *runs: list[bytes], at: int = 100) -> list[SegmentRef]:
    """One write-ahead-like object holding ``runs`` back to back from position ``at`` (what
    precedes and follows them is not read), and a committed chunk record for each."""
    refs, body, position = [], b"", at
    for written in runs:
        first = records.read_header(written[0]).base_offset
        last = records.read_header(written[-1]).last_offset
        size = sum(map(len, written))
        max_ts = max(records.read_header(b).max_timestamp for b in written)
        record = SegmentRecord(
            first, last, size, 0, last - first + 1, max_ts, 5, object=WAL, position=position
        )
        refs.append(SegmentRef.of(NS, TOPIC, PARTITION, record))
        body += b"".join(written)
        position += size
    store.put_if_absent(WAL, b"H" * at + body + b"F" * 16)
    return refs


def test_a_chunk_ref_is_a_byte_range_of_its_object_without_index() -> None:
    record = SegmentRecord(7, 9, 300, 0, 3, 0, 5, object=WAL, position=1234)
    ref = SegmentRef.of(NS, TOPIC, PARTITION, record)
    assert (ref.key, ref.index_key, ref.start, ref.end) == (WAL, None, 1234, 1534)
    segment = SegmentRef.of(NS, TOPIC, PARTITION, SegmentRecord(7, 9, 300, 40, 3, 0, 5))
    assert segment.key == segments.segment_key(NS, TOPIC, PARTITION, 7)
    assert (segment.start, segment.end) == (segments.HEADER_SIZE, 300 - segments.FOOTER_SIZE)
    with pytest.raises(ValueError, match="no index"):
        reads.read_index(LocalObjectStore("/nonexistent"), ref)


def test_a_record_written_before_chunks_existed_decodes_as_a_segment() -> None:
    # A SegmentRecord as the previous version wrote it: no object, position or codec.
    old = (
        b'{"base_offset":100,"last_offset":199,"size":4096,"index_size":28,"records":100,'
        b'"max_timestamp":1700000000123,"created_ms":1700000000000}'
    )
    record = decode_segment(old)
    assert not record.is_chunk and (record.object, record.position, record.codec) == ("", 0, 0)
    ref = SegmentRef.of(NS, TOPIC, PARTITION, record)
    assert ref.key == segments.segment_key(NS, TOPIC, PARTITION, 100)
    assert ref.index_key == segments.index_key(NS, TOPIC, PARTITION, 100)


def test_a_whole_chunk_is_one_ranged_get_verified(store: CountingStore) -> None:
    first, second = batches(0, 4, 2, 50), batches(8, 3, 2, 50)
    refs = put_chunks(store, first, second)
    store.gets.clear()
    chunk = reads.read_segment(store, refs[1])
    assert store.gets == [(WAL, refs[1].start, refs[1].end - refs[1].start)]
    assert chunk.complete and bytes(chunk.data) == b"".join(second)
    assert chunk.first_offset == 8 and chunk.last_offset == 13
    assert bytes(chunk.batches_from(11, 1)) == second[1]


def test_a_ranged_read_of_a_chunk_starts_at_the_chunk(store: CountingStore) -> None:
    first, second = batches(0, 2, 1, 10), batches(2, 40, 1, 2000)
    refs = put_chunks(store, first, second)
    store.gets.clear()
    chunk = reads.read_range(store, refs[1], None, 30, 1)
    assert bytes(chunk.batches_from(30, 1)) == second[28]
    assert store.gets[0][1] == refs[1].start  # no index: from the chunk's first batch
    index, chunk = reads.read_at(store, refs[1], None, 41, 1)
    assert index is None and bytes(chunk.batches_from(41, 1)) == second[39]
    assert all(key == WAL for key, _, _ in store.gets)  # no .index was asked for


def test_a_corrupt_chunk_is_named_by_object_and_position(store: CountingStore) -> None:
    written = batches(0, 3, 2, 50)
    (ref,) = put_chunks(store, written, at=500)
    data = bytearray(store.get(WAL))
    second = 500 + len(written[0])
    data[second + 70] ^= 0xFF
    store.delete(WAL)
    store.put_if_absent(WAL, bytes(data))
    with pytest.raises(CorruptSegment, match=f"{WAL}: batch at position {second} .*CRC32C"):
        reads.read_segment(store, ref)
    # a fetch of the first batch is still served; the bad one is named when it comes first
    assert bytes(reads.read_range(store, ref, None, 0, 10**6).batches_from(0, 1)) == written[0]
    with pytest.raises(CorruptSegment, match=f"{WAL}: batch at position {second}"):
        reads.read_range(store, ref, None, 2, 10**6)


def test_a_chunk_that_does_not_hold_its_committed_offsets_is_refused(
    store: CountingStore,
) -> None:
    (ref,) = put_chunks(store, batches(0, 3, 2, 50))
    wrong = SegmentRef.of(NS, TOPIC, PARTITION, msgspec.structs.replace(ref.record, base_offset=1))
    with pytest.raises(CorruptSegment, match=rf"{WAL}: the chunk at position 100 holds offsets"):
        reads.read_segment(store, wrong)
    beyond = msgspec.structs.replace(ref.record, size=ref.record.size + 100, last_offset=9)
    with pytest.raises(CorruptSegment, match="the object is shorter"):
        reads.read_segment(store, SegmentRef.of(NS, TOPIC, PARTITION, beyond))


def test_a_missing_chunk_object_is_object_not_found(store: CountingStore) -> None:
    (ref,) = put_chunks(store, batches(0, 3, 2, 50))
    store.delete(WAL)
    with pytest.raises(ObjectNotFound):
        reads.read_segment(store, ref)
    with pytest.raises(ObjectNotFound):
        reads.read_at(store, ref, None, 0, 100)


def test_entries_are_reread_from_the_metadata_store(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    keys = Keys(NS)
    chunk = SegmentRecord(10, 19, 100, 0, 10, 0, 5, object=WAL, position=32)
    store.put(keys.segment(TOPIC, PARTITION, 10), encode(chunk))
    store.put(keys.segment(TOPIC, PARTITION + 1, 0), encode(SegmentRecord(0, 9, 1, 1, 1, 0, 0)))
    assert reads.read_entries(store, NS, TOPIC, PARTITION) == [chunk]
    store.close()
