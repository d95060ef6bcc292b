"""The Spark reader's planning and reading, without Spark: real segments in a real embedded
object store, with and without a real (SQLite) metadata store beside them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from kafscale.metadata.records import (
    Keys,
    PartitionRecord,
    SegmentRecord,
    TopicRecord,
    encode,
)
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.protocol.compression import Codec
from kafscale.protocol.records import TimestampType
from kafscale.spark import options as opts
from kafscale.spark.catalog import (
    Catalog,
    CatalogError,
    ListingCatalog,
    MetadataCatalog,
    open_catalog,
    open_objects,
)
from kafscale.spark.plan import BoundError, Slice, plan
from kafscale.spark.read import read_slice
from kafscale.storage import LocalObjectStore
from kafscale.storage import segment as segments
from kafscale.storage.objects import ObjectInfo
from kafscale.storage.segment import CorruptSegment
from tests.unit.protocol import poison

NS = "default"
TOPIC = "events"
T0 = 1_700_000_000_000
# 5 segments of 4 batches x 25 records: offsets 0..499, timestamps T0 + offset * 1000
SEGMENTS, BATCHES, RECORDS = 5, 4, 25
PER_SEGMENT = BATCHES * RECORDS
TOTAL = SEGMENTS * PER_SEGMENT
CODECS = (Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD)


class CountingStore:
    """The object store, with a log of every GET (key, start, length)."""

    def __init__(self, inner: LocalObjectStore) -> None:
        self.inner = inner
        self.gets: list[tuple[str, int, int | None]] = []

    @property
    def description(self) -> str:
        return self.inner.description

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        self.gets.append((key, start, length))
        return self.inner.get(key, start, length)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self.inner.put_if_absent(key, data)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()

    def segments_read(self) -> set[int]:
        """Base offsets of the .kfs objects whose records were read (whole or in part; not a
        footer read alone, which is how a listing learns where the log ends)."""
        found = set()
        for key, start, length in self.gets:
            parsed = segments.parse_segment_key(key)
            footer = (start, length) == (self.size(key) - segments.FOOTER_SIZE, 16)
            if parsed is not None and parsed.kind == "kfs" and not footer:
                found.add(parsed.base_offset)
        return found


def record(offset: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]:
    key = None if offset % 7 == 0 else f"k{offset % 5}".encode()
    headers: list[tuple[str, bytes | None]] = [("n", str(offset).encode())]
    if offset % 3 == 0:
        headers.append(("none", None))
    return key, f"value-{offset}".encode(), headers, T0 + offset * 1000


def write_topic(data_dir: Path, partitions: int = 1, with_metadata: bool = True) -> None:
    objects = LocalObjectStore(str(data_dir / "segments"))
    store = SqliteMetadataStore(str(data_dir / "metadata.sqlite")) if with_metadata else None
    keys = Keys(NS)
    if store is not None:
        topic = TopicRecord(TOPIC, "00000000-0000-4000-8000-000000000001", partitions)
        store.put(keys.topic(TOPIC), encode(topic))
    for partition in range(partitions):
        for s in range(SEGMENTS):
            batches = []
            for b in range(BATCHES):
                base = s * PER_SEGMENT + b * RECORDS
                batches.append(
                    records.build_batch(
                        [record(base + i) for i in range(RECORDS)],
                        base_offset=base,
                        codec=CODECS[(s + b) % len(CODECS)],
                    )
                )
            kfs, index = segments.build_segment(batches, 0, T0, index_interval=RECORDS)
            base = s * PER_SEGMENT
            objects.put_if_absent(segments.segment_key(NS, TOPIC, partition, base), kfs)
            objects.put_if_absent(segments.index_key(NS, TOPIC, partition, base), index)
            if store is not None:
                last = base + PER_SEGMENT - 1
                segment = SegmentRecord(
                    base, last, len(kfs), len(index), PER_SEGMENT, T0 + last * 1000, T0
                )
                store.put(keys.segment(TOPIC, partition, base), encode(segment))
        if store is not None:
            state = PartitionRecord("00000000-0000-4000-8000-000000000001", TOTAL, 0)
            store.put(keys.partition(TOPIC, partition), encode(state))
    if store is not None:
        store.close()


@pytest.fixture(params=["metadata", "listing"])
def data_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    write_topic(tmp_path, with_metadata=request.param == "metadata")
    return tmp_path


def read_options(data_dir: Path, **extra: str) -> opts.ReadOptions:
    return opts.parse({"dataDir": str(data_dir), "subscribe": TOPIC, **extra})


def open_read(data_dir: Path) -> tuple[CountingStore, Catalog]:
    objects = CountingStore(LocalObjectStore(str(data_dir / "segments")))
    storage = opts.Storage(data_dir=str(data_dir))
    return objects, open_catalog(storage, objects)


def rows(
    objects: CountingStore, slices: list[Slice], headers: bool = True
) -> Iterator[dict[str, Any]]:
    for part in slices:
        for batch in read_slice(objects, part, headers):
            yield from pa.Table.from_batches([batch]).to_pylist()


def test_a_whole_topic_reads_back_record_for_record(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    slices = plan(read_options(data_dir), catalog, objects)
    assert [s.whole for s in slices] == [True] * SEGMENTS
    got = list(rows(objects, slices))
    assert [r["offset"] for r in got] == list(range(TOTAL))
    for row in got:
        key, value, headers, timestamp = record(row["offset"])
        assert (row["key"], row["value"]) == (key, value)
        assert [(h["key"], h["value"]) for h in row["headers"]] == headers
        assert int(row["timestamp"].timestamp() * 1000) == timestamp
        assert (row["topic"], row["partition"], row["timestampType"]) == (TOPIC, 0, 0)
    # whole segments only: one GET each, no index (and, with no metadata store, the footer of
    # the newest segment, for the log's end)
    expected: list[tuple[str, int, int | None]] = [
        (segments.segment_key(NS, TOPIC, 0, s * PER_SEGMENT), 0, None) for s in range(SEGMENTS)
    ]
    if isinstance(catalog, ListingCatalog):
        last = segments.segment_key(NS, TOPIC, 0, TOTAL - PER_SEGMENT)
        expected.append((last, objects.inner.size(last) - segments.FOOTER_SIZE, 16))
    assert sorted(objects.gets) == sorted(expected)


def test_offset_bounds_read_only_the_segments_and_bytes_that_hold_them(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    start, end = 130, 345  # inside segments 1 and 3
    bounds = {
        "startingOffsets": f'{{"{TOPIC}": {{"0": {start}}}}}',
        "endingOffsets": f'{{"{TOPIC}": {{"0": {end}}}}}',
    }
    slices = plan(read_options(data_dir, **bounds), catalog, objects)
    assert [(s.base_offset, s.whole) for s in slices] == [(100, False), (200, True), (300, False)]
    assert [r["offset"] for r in rows(objects, slices)] == list(range(start, end))
    assert objects.segments_read() == {100, 200, 300}
    partial = [(k, a, n) for k, a, n in objects.gets if k.endswith(".kfs") and n is not None]
    # the ranged reads start at the index entry before 130 (125) and stop at the one after 344
    first = slices[0]
    assert first.start > segments.HEADER_SIZE and first.from_offset == start
    assert all(n < segments.parse_segment(objects.inner.get(k)).data.nbytes for k, _, n in partial)


def test_timestamp_bounds_resolve_like_offsets_for_times(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    # 250.5 s after T0: the first record at or after it is offset 251
    bounds = {"startingTimestamp": str(T0 + 250_500), "endingTimestamp": str(T0 + 260_000)}
    slices = plan(read_options(data_dir, **bounds), catalog, objects)
    # With the segments' max timestamps known only the one holding the answer is read; without
    # them, segments are read in order until one holds it.
    expected = {200} if isinstance(catalog, MetadataCatalog) else {0, 100, 200}
    assert objects.segments_read() == expected
    assert [r["offset"] for r in rows(objects, slices)] == list(range(251, 260))
    assert objects.segments_read() == expected


def test_a_starting_timestamp_no_record_reaches_fails_or_reads_nothing(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    late = str(T0 + TOTAL * 1000)
    with pytest.raises(BoundError, match="no record has a timestamp"):
        plan(read_options(data_dir, startingTimestamp=late), catalog, objects)
    options = read_options(
        data_dir, startingTimestamp=late, startingOffsetsByTimestampStrategy="latest"
    )
    assert plan(options, catalog, objects) == []


def test_an_ending_timestamp_no_record_reaches_ends_at_the_high_watermark(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    options = read_options(
        data_dir, startingOffsets="earliest", endingTimestamp=str(T0 + TOTAL * 1000)
    )
    slices = plan(options, catalog, objects)
    assert sum(s.until_offset - s.from_offset for s in slices) == TOTAL


def test_large_segments_split_at_index_entries_into_disjoint_slices(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    slices = plan(read_options(data_dir, splitBytes="1000"), catalog, objects)
    assert len(slices) > SEGMENTS
    assert not any(s.whole for s in slices)
    assert [r["offset"] for r in rows(objects, slices)] == list(range(TOTAL))


def test_bounds_past_the_log_are_refused(data_dir: Path) -> None:
    objects, catalog = open_read(data_dir)
    too_far = read_options(data_dir, endingOffsets=f'{{"{TOPIC}": {{"0": {TOTAL + 1}}}}}')
    with pytest.raises(BoundError, match="past the high watermark"):
        plan(too_far, catalog, objects)
    backwards = read_options(
        data_dir,
        startingOffsets=f'{{"{TOPIC}": {{"0": 50}}}}',
        endingOffsets=f'{{"{TOPIC}": {{"0": 40}}}}',
    )
    with pytest.raises(BoundError, match="before the starting offset"):
        plan(backwards, catalog, objects)


def test_data_lost_to_retention_fails_unless_told_otherwise(tmp_path: Path) -> None:
    write_topic(tmp_path)
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    keys = Keys(NS)
    # retention moved the log start to 200 and deleted the first two segments
    state = PartitionRecord("00000000-0000-4000-8000-000000000001", TOTAL, 200)
    store.put(keys.partition(TOPIC, 0), encode(state))
    store.close()
    objects, catalog = open_read(tmp_path)
    for base in (0, 100):
        objects.inner.delete(segments.segment_key(NS, TOPIC, 0, base))
    from_ten = {"startingOffsets": f'{{"{TOPIC}": {{"0": 10}}}}'}
    with pytest.raises(BoundError, match="no longer available"):
        plan(read_options(tmp_path, **from_ten), catalog, objects)
    options = read_options(tmp_path, failOnDataLoss="false", **from_ten)
    slices = plan(options, catalog, objects)
    assert [r["offset"] for r in rows(objects, slices)] == list(range(200, TOTAL))
    # earliest is the log start
    slices = plan(read_options(tmp_path), catalog, objects)
    assert slices[0].from_offset == 200


@pytest.mark.parametrize("split", [False, True], ids=["whole", "ranged"])
def test_a_corrupt_segment_fails_the_read_naming_the_object(data_dir: Path, split: bool) -> None:
    objects, catalog = open_read(data_dir)
    key = segments.segment_key(NS, TOPIC, 0, 200)
    path = data_dir / "segments" / key
    data = bytearray(path.read_bytes())
    data[segments.HEADER_SIZE + 200] ^= 0xFF  # inside the first batch's records
    path.write_bytes(bytes(data))
    extra = {"splitBytes": "1000"} if split else {}
    slices = plan(read_options(data_dir, **extra), catalog, objects)
    with pytest.raises(CorruptSegment, match=key) as failure:
        list(rows(objects, slices))
    assert "CRC32C" in str(failure.value)


def test_control_batches_are_skipped_and_log_append_time_is_reported(tmp_path: Path) -> None:
    objects = LocalObjectStore(str(tmp_path / "segments"))
    data = records.build_batch(
        [(b"k", b"v", [], T0)], base_offset=0, timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    buf = bytearray(data)
    records.set_log_append_time(buf, 0, T0 + 5)
    marker = records.build_batch(
        [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [], T0)],
        base_offset=1,
        is_control=True,
        is_transactional=True,
    )
    kfs, index = segments.build_segment([bytes(buf), marker], 0, T0)
    objects.put_if_absent(segments.segment_key(NS, TOPIC, 0, 0), kfs)
    objects.put_if_absent(segments.index_key(NS, TOPIC, 0, 0), index)
    counting = CountingStore(objects)
    catalog = ListingCatalog(counting, NS)
    slices = plan(read_options(tmp_path), catalog, counting)
    got = list(rows(counting, slices))
    assert [(r["offset"], r["timestampType"]) for r in got] == [(0, 1)]
    assert int(got[0]["timestamp"].timestamp() * 1000) == T0 + 5


def test_topics_are_selected_by_name_pattern_or_assignment(tmp_path: Path) -> None:
    write_topic(tmp_path, partitions=3)
    objects, catalog = open_read(tmp_path)
    assert {s.partition for s in plan(read_options(tmp_path), catalog, objects)} == {0, 1, 2}
    assigned = opts.parse({"dataDir": str(tmp_path), "assign": f'{{"{TOPIC}": [2, 0]}}'})
    assert {s.partition for s in plan(assigned, catalog, objects)} == {0, 2}
    pattern = opts.parse({"dataDir": str(tmp_path), "subscribePattern": "ev.*"})
    assert {s.topic for s in plan(pattern, catalog, objects)} == {TOPIC}
    nothing = opts.parse({"dataDir": str(tmp_path), "subscribePattern": "nope.*"})
    assert plan(nothing, catalog, objects) == []
    with pytest.raises(CatalogError, match="no topic 'missing'"):
        plan(opts.parse({"dataDir": str(tmp_path), "subscribe": "missing"}), catalog, objects)
    beyond = opts.parse({"dataDir": str(tmp_path), "assign": f'{{"{TOPIC}": [3]}}'})
    with pytest.raises(CatalogError, match="no partition"):
        plan(beyond, catalog, objects)


def test_the_listing_and_the_metadata_store_agree(tmp_path: Path) -> None:
    write_topic(tmp_path, partitions=2)
    objects = CountingStore(LocalObjectStore(str(tmp_path / "segments")))
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    try:
        for partition in (0, 1):
            listed = ListingCatalog(objects, NS).partition(TOPIC, partition)
            known = MetadataCatalog(store, NS).partition(TOPIC, partition)
            assert listed.high_watermark == known.high_watermark == TOTAL
            strip = [(s.base_offset, s.last_offset, s.size, s.key) for s in known.segments]
            assert [(s.base_offset, s.last_offset, s.size, s.key) for s in listed.segments] == strip
    finally:
        store.close()


def test_a_directory_without_segments_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no segments directory"):
        open_objects(opts.Storage(data_dir=str(tmp_path / "nowhere")))


@pytest.mark.parametrize("poisoned", ["snappy-lie", "zstd-bomb"])
def test_a_batch_that_does_not_decode_fails_the_task_or_is_skipped(
    tmp_path: Path, poisoned: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Stored without validation: its CRC is right, its records do not decode. The task fails
    naming it, or with failOnDataLoss=false it is skipped (logged once) and the rest is read."""
    objects = LocalObjectStore(str(tmp_path / "segments"))
    before = records.build_batch([(None, b"v0", [], T0)], base_offset=0)
    bad = bytearray(
        poison.batch(poison.record(0) + poison.record(1), count=2, codec=Codec.SNAPPY)
        if poisoned == "snappy-lie"
        else poison.batch(poison.zstd_bomb(1 << 30), count=1, codec=Codec.ZSTD)
    )
    records.patch_base_offset(bad, 0, 1)
    after_base = records.read_header(bad).last_offset + 1
    after = records.build_batch([(None, b"v-after", [], T0)], base_offset=after_base)
    kfs, index = segments.build_segment([before, bytes(bad), after], 0, T0)
    objects.put_if_absent(segments.segment_key(NS, TOPIC, 0, 0), kfs)
    objects.put_if_absent(segments.index_key(NS, TOPIC, 0, 0), index)
    counting = CountingStore(objects)
    catalog = ListingCatalog(counting, NS)
    slices = plan(read_options(tmp_path), catalog, counting)
    with pytest.raises(CorruptSegment, match=r"batch at offsets 1\.\.") as failure:
        list(rows(counting, slices))
    assert segments.segment_key(NS, TOPIC, 0, 0) in str(failure.value)
    for part in slices:
        for _ in range(2):  # two tasks over the same slice: one log line
            got = [
                row
                for batch in read_slice(counting, part, True, fail_on_data_loss=False)
                for row in pa.Table.from_batches([batch]).to_pylist()
            ]
            assert [(r["offset"], r["value"]) for r in got] == [
                (0, b"v0"),
                (after_base, b"v-after"),
            ]
    assert len([r for r in caplog.records if "cannot be read" in r.getMessage()]) == 1
