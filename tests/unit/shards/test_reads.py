"""The read path's pieces without processes: caches, the segment list, ranged segment reads."""

from __future__ import annotations

import pytest

from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.shards import reads
from kafscale.shards.cache import ByteLRU, chunk_of
from kafscale.shards.reads import SegmentRef
from kafscale.shards.segments import CommittedSegments
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import ObjectInfo, ObjectStore
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

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()


def batches(first_offset: int, count: int, records_per_batch: int, value_size: int) -> list[bytes]:
    out = []
    offset = first_offset
    for b in range(count):
        rows = [
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
